"""A run's checkpoints: where it resumes from, and the saves it makes as it trains.

:func:`find_resume_point` decides, before the model is built, whether ``--out`` holds a run to continue: only with
``--resume``, only with the settings the run was trained with (genolc.train.config.changed_for_resume) and only
on a dataset of the same tokenizer (:func:`check_checkpoint_tokenizer`, which ``--init`` uses too).

:class:`RunCheckpoints` makes the saves (genolc/train/background_save.py writes each one, in a thread where the host
has room) and keeps ``last_good``: the newest checkpoint known to be complete, which every message about a stopped
run names. Under torchrun only global rank 0 writes; every replica holds the same weights, so the other ranks wait
for it at a barrier and name the same path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from genolc.errors import ConfigError, GenolcError, InputError
from genolc.train import state as ckpt
from genolc.train.background_save import BackgroundCheckpoints, host_room_for, snapshot_bytes
from genolc.train.config import TrainConfig, changed_for_resume
from genolc.train.strategy import host_free_bytes_per_process


def describe_tokenizer(tokenizer: Any) -> str:
    d = tokenizer.to_dict()
    extra = f", k={d['k']}" if "k" in d else ""
    return f"{d.get('kind', type(tokenizer).__name__)}{extra}, {tokenizer.vocab_size} tokens"


def check_checkpoint_tokenizer(path: Path, tokenizer: Any, data: Path, trained_on: str | None = None) -> bool:
    """True when the checkpoint at ``path`` carries a genome tokenizer (then it must equal ``tokenizer``, the
    dataset's at ``data``); False when it has none.

    ``trained_on``: when resuming, the dataset the run was trained on (the advice is then to resume on it).
    """
    from genolc.tokenize import load_tokenizer

    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return False
    try:
        theirs = load_tokenizer(file)
    except GenolcError:
        return False   # a transformers text tokenizer.json, not a genome tokenizer
    if theirs.to_dict() != tokenizer.to_dict():
        if trained_on is not None:
            fix = (f"resume with the dataset this run was trained on (--data {trained_on}), or start a new run "
                   "in another --out")
        else:
            fix = (f"prepare the dataset with the checkpoint's tokenizer (genolc prepare --tokenizer {file}) "
                   "or start from a preset with --model")
        raise InputError(
            f"the dataset was prepared with a different tokenizer ({describe_tokenizer(tokenizer)}) than the "
            f"checkpoint ({describe_tokenizer(theirs)})", where=f"{data} vs {path}", fix=fix)
    return True


def find_resume_point(root: Path, config: TrainConfig, tokenizer: Any, say: Callable[[str], None]) -> Path | None:
    """The checkpoint under ``root`` (``<out>/checkpoints``) the run continues from, or None for a fresh start.
    Checkpoints there without ``--resume``, or a run trained with other settings or another tokenizer, are refused
    (one message each: what, where, what to do)."""
    latest = ckpt.latest_checkpoint(root)
    if latest is None:
        if config.resume:
            say(f"--resume: no checkpoint under {root} yet, starting from step 0")
        return None
    if not config.resume:
        raise ConfigError("the output directory already holds checkpoints", where=str(root),
                          fix="pass --resume to continue that run, or choose another --out")
    saved = ckpt.read_trainer_state(latest)
    changed = changed_for_resume(saved["config"], config)
    if changed:
        raise ConfigError("cannot resume: settings differ from the checkpoint's (" + "; ".join(changed) + ")",
                          where=str(latest), fix="resume with the same options, or start a new run in another --out")
    check_checkpoint_tokenizer(latest, tokenizer, config.data, trained_on=saved["config"].get("data"))
    return latest


class RunCheckpoints:
    """The saves of one run into ``<out>/checkpoints``. ``writes``: whether this process writes them (global rank
    0); ``barrier``: waits for every rank (a no-op in one process); ``resumed_from``: the checkpoint the run
    started from, its ``last_good`` until a save completes.

    ``seconds`` and ``in_background`` count what the saves kept training waiting (a foreground write, the copy to
    host memory of a background one, a background write still running when the next save came) and how many were
    written in the background."""

    def __init__(self, out: Path, *, tokenizer: Any, keep: int, writes: bool, barrier: Callable[[], None],
                 say: Callable[[str], None], resumed_from: Path | None) -> None:
        self.root = ckpt.checkpoint_root(out)
        self.writer = BackgroundCheckpoints(out, tokenizer=tokenizer, keep=keep)
        self.writes = writes
        self.barrier = barrier
        self.say = say
        self.last_good: Path | None = resumed_from
        self.seconds, self.in_background = 0.0, 0

    def save(self, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             trainer_state: Callable[[], dict[str, Any]], background: bool = False) -> Path:
        """Checkpoint ``step``; ``background``: the step waits only for its copy to host memory, a thread writes it
        (``last_good`` names it once it is written). ``trainer_state`` builds the loop's own values (read only on
        the rank that writes)."""
        if not self.writes:
            self.barrier()     # rank 0 writes the checkpoint (every replica holds the same weights)
            self.last_good = self.root / ckpt.checkpoint_name(step)
            return self.last_good
        state = trainer_state()
        started = time.monotonic()
        path = self.writer.save(step, model=model, optimizer=optimizer, trainer_state=state, background=background)
        self.seconds += time.monotonic() - started
        self.in_background += int(background)
        self._note_written()
        self.barrier()
        return path

    def room_for_snapshot(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Whether a checkpoint can be copied to host memory and written in the background (host_room_for)."""
        return self.writer.has_buffers or host_room_for(snapshot_bytes(model, optimizer),
                                                        host_free_bytes_per_process())

    def poll(self) -> None:
        """Take note of a background write that has finished; one that failed raises its error here."""
        self.writer.poll()
        self._note_written()

    def wait(self) -> None:
        """Wait for a background write still running; one that failed raises its error here."""
        self.writer.wait()
        self._note_written()

    def settle(self) -> None:
        """Wait for a checkpoint still being written. Its failure is said, not raised: this runs as the run stops
        on another error or signal."""
        try:
            self.writer.wait()
        except Exception as error:
            self.say(f"the checkpoint being written in the background failed ({error}); the last complete one is "
                     "kept")
        self._note_written()

    def _note_written(self) -> None:
        if self.writer.written is not None:
            self.last_good = self.writer.written
