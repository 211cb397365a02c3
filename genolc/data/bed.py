"""BED intervals (include regions, blacklists, gap tracks): 0-based half-open, chromosome aliases resolved.

``read_bed(path)`` returns ``{chrom: int64[k, 2]}`` with each chromosome's intervals sorted and merged (overlapping
or touching intervals joined), keyed by the canonical name (``22``, ``chr22`` and ``NC_000022.11`` land together).
'track' and 'browser' lines, '#' comments and blank lines are skipped; columns after the third are ignored.
Plain or gzip-compressed files are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from genolc.data.genome import canonical_chrom, merge_intervals
from genolc.errors import InputError
from genolc.fsutil import open_maybe_gzip

_INTEGER = re.compile(r"-?[0-9]+")
_FIX = "BED lines are 'chrom<TAB>start<TAB>end' with 0-based start < end; comment other lines out with '#'"


@dataclass(frozen=True)
class BedLine:
    lineno: int          # 1-based line in the file
    fields: list[str]    # every column as written
    chrom: str           # as written (not canonical)
    start: int           # 0-based
    end: int             # exclusive; start <= end
    where: str           # "file:line", for messages


def bed_lines(path: str | Path) -> Iterator[BedLine]:
    """The data lines of a BED file in file order (header, comment and blank lines skipped), each checked:
    InputError naming ``file:line`` for a line without three columns, non-numeric or invalid coordinates or an
    empty chromosome name; for a missing file, a directory or an unreadable one."""
    p = Path(path)
    if not p.exists():
        raise InputError("BED file not found", where=str(p), fix="check the path")
    if p.is_dir():
        raise InputError("expected a BED file but got a directory", where=str(p), fix="give the .bed file inside it")
    for lineno, line in _lines(p):
        text = line.strip()
        if not text or text.startswith("#") or text.split(None, 1)[0] in ("track", "browser"):
            continue
        fields = text.split("\t") if "\t" in text else text.split()
        where = f"{p}:{lineno}"
        if len(fields) < 3:
            raise InputError(f"BED line has {len(fields)} column(s), needs at least 3: {text[:80]!r}", where=where, fix=_FIX)
        # ASCII digits only: int() also takes '1_000', ' 12' and digits of other scripts.
        if not all(_INTEGER.fullmatch(f) for f in fields[1:3]):
            raise InputError(
                f"BED start/end are not whole numbers: {fields[1][:20]!r}, {fields[2][:20]!r}", where=where, fix=_FIX)
        start, end = int(fields[1]), int(fields[2])
        if start < 0 or end < start:
            raise InputError(f"BED interval {start}-{end} is invalid (needs 0 <= start <= end)", where=where, fix=_FIX)
        chrom = fields[0].strip()
        if not canonical_chrom(chrom):
            raise InputError("BED line has an empty chromosome name", where=where, fix=_FIX)
        yield BedLine(lineno, fields, chrom, start, end, where)


def read_bed(path: str | Path) -> dict[str, np.ndarray]:
    """Intervals per canonical chromosome name, sorted and merged; InputError naming ``file:line`` for a bad line."""
    starts: dict[str, list[int]] = {}
    ends: dict[str, list[int]] = {}
    for line in bed_lines(path):
        chrom = canonical_chrom(line.chrom)
        starts.setdefault(chrom, []).append(line.start)
        ends.setdefault(chrom, []).append(line.end)
    return {
        chrom: merge_intervals(np.stack([np.asarray(starts[chrom], np.int64), np.asarray(ends[chrom], np.int64)], axis=1))
        for chrom in starts
    }


def _lines(path: Path):
    try:
        with open_maybe_gzip(path, "rt", encoding="utf-8", errors="replace") as handle:
            for lineno, line in enumerate(handle, start=1):
                if "\x00" in line:
                    raise InputError("not a BED file: it holds binary data", where=f"{path}:{lineno}", fix=_FIX)
                yield lineno, line
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read the BED file ({exc})", where=str(path), fix="check or re-create the file") from None
