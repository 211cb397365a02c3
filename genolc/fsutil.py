"""Filesystem helpers: atomic outputs, genolc's ownership of its output directories, md5 of inputs, reading
plain or gzip text inputs.

Outputs appear whole or not at all: a directory is built under a temporary name beside its destination and
renamed into place; a file is written to a temporary name and renamed. A failure removes the temporary, and the
parent folders the attempt created. Temporaries are created private (mode 0700/0600) and given the usual
umask-derived mode just before the rename, so a finished output is as readable as one written with plain
``open``/``mkdir``.

genolc replaces or writes into only what it wrote itself. Every output directory carries a marker
(``.genolc-output.json``, naming the kind of output); an existing directory is used only when it is empty or holds
genolc's marker for the same kind (:func:`check_output_dir`). A directory that replaces its output whole
(:func:`atomic_dir`) must also not be the working directory or one above it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from genolc.errors import InputError, RefusedOutputError

GZIP_MAGIC = b"\x1f\x8b"
OUTPUT_MARKER = ".genolc-output.json"
RUNS_DIRNAME = "runs"          # run records (genolc.runs) live here, in every output directory
_MD5_CACHE: dict[tuple[str, int, int], str] = {}


def _umask() -> int:
    # os.umask can only be read by setting it; restore it at once.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_md5(path: str | os.PathLike, block: int = 1 << 22) -> str:
    """md5 of a file's bytes, cached per (path, size, mtime) for the life of the process."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _MD5_CACHE:
        digest = hashlib.md5()
        with open(p, "rb") as fh:
            while chunk := fh.read(block):
                digest.update(chunk)
        _MD5_CACHE[key] = digest.hexdigest()
    return _MD5_CACHE[key]


def open_maybe_gzip(path: str | os.PathLike, mode: str = "rt", **text: Any) -> Any:
    """``path`` opened for reading (``mode`` 'rt' or 'rb'; ``text``: ``open``'s encoding, errors, newline), inflated
    when its first bytes are gzip's magic, as plain gzip and bgzip files start: the name's extension is not trusted."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == GZIP_MAGIC
    return gzip.open(path, mode, **text) if gzipped else open(path, mode, **text)


def ensure_writable_parent(path: str | os.PathLike, what: str = "output directory") -> Path:
    """Create ``path``'s parent if needed and check it can be written, raising one clear error if not."""
    p = Path(path).absolute()
    parent = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the {what}", where=str(parent), fix=f"choose a writable location ({exc.strerror})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"the {what} is not writable", where=str(parent), fix="choose a writable location with --out")
    return p


def output_kind(path: str | os.PathLike) -> str | None:
    """The kind of output genolc's marker in directory ``path`` names (e.g. "checkpoint directory"), or None."""
    try:
        marker = json.loads((Path(path) / OUTPUT_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker.get("kind") if isinstance(marker, dict) and marker.get("written_by") == "genolc" else None


def _write_marker(directory: Path, kind: str) -> None:
    atomic_write_json(directory / OUTPUT_MARKER, {"written_by": "genolc", "kind": kind})


def check_output_dir(path: str | os.PathLike, kind: str, *, legacy: tuple[str, ...] = (),
                     replaces: bool = True) -> Path:
    """Refuse ``path`` as the place of a ``kind`` (e.g. "evaluation output directory") unless it is absent, an empty
    directory or genolc's own ``kind``; return it as an absolute path. Nothing is touched either way.

    genolc's own: its marker names ``kind``, or it holds a path matching one of the ``legacy`` glob patterns (what
    genolc wrote there before outputs carried the marker, e.g. a dataset's ``manifest.json``). ``replaces``: the
    command replaces the directory whole, so it must not be the working directory or one above it either.
    """
    p = Path(path).expanduser().absolute()
    verb = "replace it" if replaces else "write into it"
    if replaces:
        real, cwd = Path(os.path.realpath(p)), Path(os.path.realpath(os.getcwd()))
        if real == cwd or real in cwd.parents:
            raise RefusedOutputError(
                f"the {kind} is the current directory or one above it, which genolc would replace whole",
                where=str(p), fix="write to a new directory, e.g. one inside this directory")
    if not p.exists():
        return p
    if not p.is_dir():
        raise RefusedOutputError(f"the {kind} is a file, not a directory; refusing to {verb}", where=str(p),
                                 fix="choose a new or empty directory")
    found = output_kind(p) or (kind if any(any(p.glob(pattern)) for pattern in legacy) else None)
    if found == kind:
        return p
    try:
        entries = sorted(entry.name for entry in p.iterdir())
    except OSError as exc:
        raise RefusedOutputError(f"the {kind} cannot be listed ({exc.strerror}); refusing to {verb}",
                                 where=str(p), fix="choose a new or empty directory") from None
    if not entries:
        return p
    if found is not None:
        raise RefusedOutputError(f"the {kind} holds a genolc {found}; refusing to {verb}", where=str(p),
                                 fix="choose a new or empty directory")
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    raise RefusedOutputError(f"the {kind} already holds files genolc did not write ({shown}); refusing to {verb}",
                             where=str(p), fix="choose a new or empty directory, or move those files elsewhere")


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        missing.append(folder)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders (deepest first) a failed command created, stopping at the first that is not empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, what: str = "output directory", *,
               legacy: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``final`` only if the block succeeds.

    ``final`` must be absent, empty or genolc's own ``what`` (:func:`check_output_dir`, with ``legacy``); the new
    directory carries genolc's marker for ``what``. A failure removes the temporary and the parents this call created.
    """
    final_path = check_output_dir(final, what, legacy=legacy)
    created = _missing_dirs(final_path.parent)
    try:
        ensure_writable_parent(final_path, what)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{final_path.name}.tmp-", dir=final_path.parent))
        except OSError as exc:
            # os.access can say yes where creating fails (root on a read-only or virtual file system).
            raise InputError(f"cannot write the {what}", where=str(final_path.parent),
                             fix=f"choose a writable location ({exc.strerror})") from None
    except BaseException:
        _remove_empty(created)
        raise
    try:
        yield tmp
        _write_marker(tmp, what)
        os.chmod(tmp, 0o777 & ~_umask())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise
    old = None
    if final_path.exists():
        old = final_path.parent / f".{final_path.name}.old-{os.getpid()}"
        os.replace(final_path, old)
    os.replace(tmp, final_path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, kind: str, *, legacy: tuple[str, ...] = ()) -> Iterator[Path]:
    """Claim ``path`` for a command that writes into its output directory as it goes (finetune's run directory, the
    demo's): refuse it unless absent, empty or genolc's own ``kind`` (:func:`check_output_dir`), then create it with
    genolc's marker before the block, so that even a run killed outright leaves a directory genolc recognises.

    If the block fails and the directory, created by this call, holds nothing but the marker and run records, it is
    removed again, with the parents this call created: a command that failed before writing results leaves nothing.
    """
    p = check_output_dir(path, kind, legacy=legacy, replaces=False)
    created = _missing_dirs(p)
    try:
        p.mkdir(parents=True, exist_ok=True)
        if output_kind(p) is None:
            _write_marker(p, kind)
    except OSError as exc:
        _remove_empty(created)
        raise InputError(f"cannot create the {kind}", where=str(p),
                         fix=f"choose a writable location ({exc.strerror})") from None
    try:
        yield p
    except BaseException:
        if created and p.is_dir() and {entry.name for entry in p.iterdir()} <= {OUTPUT_MARKER, RUNS_DIRNAME}:
            shutil.rmtree(p, ignore_errors=True)
            _remove_empty(created[1:])
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename, fsyncing before the rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.tmp-", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_new_files(files: dict[Path, bytes]) -> None:
    """Write files that belong together (and do not exist yet) all or none: each goes to a temporary in its own
    folder and is fsynced, then all are renamed into place; a failure removes the temporaries and any file this call
    already renamed into place."""
    temps: dict[Path, str] = {}
    placed: list[Path] = []
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temps[path] = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(temps[path], 0o666 & ~_umask())
        for path, tmp in temps.items():
            os.replace(tmp, path)
            placed.append(path)
    except BaseException:
        for leftover in [*placed, *(Path(t) for p, t in temps.items() if p not in placed)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        raise


def genolc_cache_dir() -> Path:
    """genolc's folder in the user's cache directory: ``$XDG_CACHE_HOME/genolc`` (default ``~/.cache/genolc``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "genolc"


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())
