"""Checkpoints written in a thread of their own while training goes on.

A save first copies the checkpoint off the live state (genolc.train.state.snapshot_checkpoint: every tensor to host
memory, the RNG and the loop's values), which is all the training step has to wait for; a thread then writes it as
``write_snapshot`` does in the foreground (the same atomic directory and pruning, so a kill during the write leaves
the previous checkpoint whole). One write runs at a time: the next save waits for the one before. Why: a `base`
checkpoint (23 GB of fp32 weights and AdamW state) took 30.9 s to save on the H200 machine
(benchmarks/results/finetune_sync_slab_2026-12-04/), as long as two of its 512k steps: with ``--checkpoint-every 20``
a tenth of the run. A background write holds Python's lock only in short stretches (on this repository's CPU machine
a loop in the training thread went on with pauses of at most 5-12 ms, once 93 ms, while `mini`'s checkpoint was
written), so the training thread keeps the GPU's queue fed.

The snapshot's host buffers are reused by the next save (their pages already mapped). They cost host memory: 4 bytes
a parameter for fp32 weights and 8 for AdamW's moments, 23 GB for `base`, held for the run. So the trainer saves in
the background only where the host has room for them (:func:`host_room_for`, twice their size free); otherwise,
and for a save in the foreground before any buffers exist, the checkpoint is written as it is copied
(``state.save_checkpoint``: the weights, then the optimizer's state one tensor at a time).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from genolc.errors import GenolcError
from genolc.train.state import (Snapshot, checkpoint_name, checkpoint_root, save_checkpoint, snapshot_checkpoint,
                                write_snapshot)


def snapshot_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Host bytes a snapshot of ``model`` and ``optimizer`` takes: every tensor of their state dicts."""
    tensors = list(model.state_dict().values())
    for state in optimizer.state.values():
        tensors.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in tensors)


def host_room_for(nbytes: int, free_bytes: int) -> bool:
    """Whether ``free_bytes`` of host memory leave room for ``nbytes`` of snapshot buffers: twice their size, so
    that what the run allocates later (the eval, the next window's batch, the allocator's slack) still fits."""
    return free_bytes >= 2 * nbytes


class BackgroundCheckpoints:
    """Saves a run's checkpoints into ``<out>/checkpoints``, each in the background or at once (:meth:`save`).

    ``written`` is the newest checkpoint known to be complete. A write that failed in the background raises its
    error from the next :meth:`save`, :meth:`poll` or :meth:`wait`."""

    def __init__(self, out: Path, *, tokenizer: Any | None, keep: int) -> None:
        self.out = Path(out)
        self.tokenizer = tokenizer
        self.keep = keep
        self.written: Path | None = None
        self._thread: threading.Thread | None = None
        self._outcome: Path | BaseException | None = None
        self._buffers: Snapshot | None = None
        self._writing_step = 0

    def save(self, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             trainer_state: dict[str, Any], background: bool) -> Path:
        """Checkpoint ``step``: its path, written when this returns unless ``background`` (then :attr:`written` names
        it once its thread is done)."""
        self.wait()
        if not background and self._buffers is None:
            self.written = save_checkpoint(self.out, step, model=model, optimizer=optimizer, tokenizer=self.tokenizer,
                                           trainer_state=trainer_state, keep=self.keep)
            return self.written
        snapshot = snapshot_checkpoint(step, model=model, optimizer=optimizer, trainer_state=trainer_state,
                                       reuse=self._buffers)
        self._buffers = snapshot
        if not background:
            self.written = write_snapshot(self.out, snapshot, tokenizer=self.tokenizer, keep=self.keep)
            return self.written
        # Not a daemon: an interpreter that exits (a second Ctrl-C) still finishes the checkpoint.
        self._thread = threading.Thread(target=self._write, args=(snapshot,), name=f"genolc checkpoint {step}")
        self._thread.start()
        return checkpoint_root(self.out) / checkpoint_name(step)

    @property
    def pending(self) -> bool:
        return self._thread is not None

    @property
    def has_buffers(self) -> bool:
        """Whether an earlier save left host buffers that the next one fills (it then needs no more memory)."""
        return self._buffers is not None

    def poll(self) -> Path | None:
        """The background write's checkpoint if it has finished since the last call, else None."""
        if self._thread is None or self._thread.is_alive():
            return None
        return self.wait()

    def wait(self) -> Path | None:
        """Wait for the background write, if any: its checkpoint (None when there was none). A write that failed
        raises :class:`CheckpointWriteError` (a user's error, such as a full disk, in one line) or its own error."""
        if self._thread is None:
            return None
        self._thread.join()
        outcome = self._outcome
        if isinstance(outcome, Path):
            self.written = outcome              # first: an interrupt past this line cannot lose the finished write
        self._thread, self._outcome = None, None
        if isinstance(outcome, OSError):
            raise CheckpointWriteError(self._writing_step, outcome, self.written, self.out) from outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _write(self, snapshot: Snapshot) -> None:
        self._writing_step = snapshot.step
        try:
            self._outcome = write_snapshot(self.out, snapshot, tokenizer=self.tokenizer, keep=self.keep)
        except BaseException as error:          # handed to the training thread, which raises it
            self._outcome = error


class CheckpointWriteError(GenolcError):
    """A checkpoint written in the background could not be written (a full disk, a folder gone): the run stops."""

    def __init__(self, step: int, error: OSError, kept: Path | None, out: Path) -> None:
        reason = error.strerror or str(error)
        kept_text = (f"the last complete checkpoint is {kept}" if kept is not None
                     else "no complete checkpoint is left")
        super().__init__(f"could not write the checkpoint of step {step} ({reason}); {kept_text}",
                         where=str(checkpoint_root(out)),
                         fix="free space there (or move the run), then continue with the same command plus --resume"
                         if kept is not None else "free space there (or choose another --out) and run again")
