"""Run records: every command leaves a small JSON beside its output saying how it ran.

A record holds the command, its resolved arguments, genolc's version (and git SHA when run from a checkout),
md5s of its inputs, how it computed (``compute``: CPU threads and the rule that chose them, whether the run was
deterministic; finetune and eval), host and GPU, start and end times, exit status and the error if it failed.
Records live in ``<output>/runs/<start>_<pid>_<command>.json``; :func:`run_record` writes one whether the command
succeeds or fails. A copy gathered elsewhere (the demo's report) says ``copy_of`` its original (:func:`copy_record`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import genolc
from genolc.errors import GenolcError, RefusedOutputError
from genolc.fsutil import RUNS_DIRNAME, atomic_write_json, file_md5

RECORD_VERSION = 1


def git_sha() -> str | None:
    """The commit genolc runs from, when it runs from a git checkout (with '-dirty' for local changes)."""
    root = Path(genolc.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    # Importing torch costs a second; a command that has not imported it (prepare) records its version from the
    # package metadata and has no GPUs to list.
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        try:
            info["torch"] = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            pass
    return info


def _now() -> str:
    # Milliseconds: runs started within one second (a resume right after an interruption) keep their order.
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class RunRecord:
    command: str
    args: dict[str, Any]
    out_dir: Path
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    compute: dict[str, Any] = field(default_factory=dict)    # CPU threads, deterministic mode (genolc.threads)
    started: str = field(default_factory=_now)
    path: Path | None = None          # where the record was written, once the block has ended

    def add_input(self, path: str | os.PathLike) -> None:
        """Record an input file with its md5 (cached, so hashing twice costs nothing)."""
        p = Path(path)
        if p.is_file():
            self.inputs[str(p.resolve())] = file_md5(p)

    def to_dict(self, status: str, error: str | None, seconds: float) -> dict[str, Any]:
        return {
            "record_version": RECORD_VERSION,
            "command": self.command,
            "args": self.args,
            "genolc_version": genolc.__version__,
            "git_sha": git_sha(),
            "argv": sys.argv,
            "inputs": self.inputs,
            "outputs": self.outputs,
            **({"compute": self.compute} if self.compute else {}),
            "host": host_info(),
            "started": self.started,
            "ended": _now(),
            "seconds": round(seconds, 3),
            "status": status,
            "error": error,
        }


@contextlib.contextmanager
def run_record(command: str, out_dir: str | os.PathLike, args: dict[str, Any], *,
               keep_failed: bool = True) -> Iterator[RunRecord]:
    """Write ``<out_dir>/runs/<start>_<pid>_<command>.json`` when the block ends, with its status and any error.

    The record is written after the block, so a command that builds ``out_dir`` atomically has it in place.
    A failed command whose output directory was never created leaves no directory behind (its error goes to
    stderr); one that fails after creating it gets a record with status "failed" and the error. A directory genolc
    refused to write into (:class:`~genolc.errors.RefusedOutputError`: not genolc's) gets no record either. A failure
    to write the record never hides the command's own error. ``keep_failed=False`` (commands whose outputs are
    files in a folder that is not theirs, such as ``score --out scores.tsv``): a run that does not succeed leaves
    nothing there, its record included.
    """
    rec = RunRecord(command=command, args={k: _jsonable(v) for k, v in args.items()}, out_dir=Path(out_dir))
    t0 = time.monotonic()
    status, error, refused = "ok", None, False
    try:
        yield rec
    except RefusedOutputError as exc:
        status, error, refused = exc.run_status, exc.message, True
        raise
    except GenolcError as exc:
        status, error = exc.run_status, exc.message
        raise
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted by the user"
        raise
    except BaseException as exc:
        status, error = "crashed", "".join(traceback.format_exception_only(type(exc), exc)).strip()
        raise
    finally:
        stamp = rec.started.split(".")[0].replace(":", "") + "Z"
        # Two runs can start within one second: pid and a counter keep their records apart.
        path = _unique_path(rec.out_dir / RUNS_DIRNAME, f"{stamp}_{os.getpid()}", command)
        if status == "ok" or (keep_failed and rec.out_dir.is_dir() and not refused):
            with contextlib.suppress(OSError):
                atomic_write_json(path, rec.to_dict(status, error, time.monotonic() - t0))
                rec.path = path


def copy_record(record: Path, target: Path) -> None:
    """Copy the run record ``record`` to ``target`` (a report gathering its stages' records), marked
    ``copy_of: <record>`` so that ``genolc runs ls`` counts the run once."""
    atomic_write_json(target, {**json.loads(record.read_text()), "copy_of": str(record)})


def _unique_path(folder: Path, stem: str, command: str) -> Path:
    path, n = folder / f"{stem}_{command}.json", 1
    while path.exists():
        path, n = folder / f"{stem}-{n}_{command}.json", n + 1
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, os.PathLike):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)
