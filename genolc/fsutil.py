"""Filesystem helpers: atomic outputs, md5 of inputs, writable-directory checks.

Outputs appear whole or not at all: a directory is built under a temporary name beside its destination and
renamed into place; a file is written to a temporary name and renamed. A failure removes the temporary.
Temporaries are created private (mode 0700/0600) and given the usual umask-derived mode just before the rename,
so a finished output is as readable as one written with plain ``open``/``mkdir``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from genolc.errors import InputError

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


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, what: str = "output directory") -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``final`` only if the block succeeds."""
    final_path = ensure_writable_parent(final, what)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final_path.name}.tmp-", dir=final_path.parent))
    except OSError as exc:
        # os.access can say yes where creating fails (root on a read-only or virtual file system).
        raise InputError(f"cannot write the {what}", where=str(final_path.parent),
                         fix=f"choose a writable location ({exc.strerror})") from None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final_path.exists():
        old = final_path.parent / f".{final_path.name}.old-{os.getpid()}"
        os.replace(final_path, old)
    os.replace(tmp, final_path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())
