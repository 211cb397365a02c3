"""VCF reading for scoring: plain or gzip/bgzip text, no dependency beyond the standard library.

Each data line becomes one :class:`Variant` per ALT allele (multi-allelic records are split; ``allele_index`` says
which ALT it was, from 1). Alleles are classified here, before any model runs:

* ``symbolic`` — ``<DEL>``, ``<INS:ME>``, breakends (``N[chr1:123[``), the spanning deletion ``*`` and a missing
  ALT ``.``: skipped and counted;
* ``alt_equals_ref`` — ALT is REF (case ignored): no change to score, skipped and counted (a score of 0 would
  read as a neutral variant);
* ``too_long`` — REF or ALT longer than ``max_allele`` bases (not a small indel): skipped and counted;
* otherwise ``ok`` (the reference checks happen in :mod:`genolc.score.variants`).

A line that is not a VCF data line (fewer than 8 tab-separated columns, a POS that is not a positive integer, a REF
or ALT with characters other than bases) is an :class:`~genolc.errors.InputError` naming the file and line number.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from genolc.errors import InputError
from genolc.fsutil import open_maybe_gzip

FIXED_COLUMNS = ("CHROM", "POS", "ID", "REF", "ALT", "QUAL", "FILTER", "INFO")
DEFAULT_MAX_ALLELE = 50
_BASES_RE = re.compile(r"[ACGTNacgtn]+")
_SYMBOLIC_RE = re.compile(r"^<.*>$|[\[\]]|^\*$|^\.$")


@dataclass(frozen=True)
class Variant:
    line: int  # 1-based line number in the VCF
    fields: tuple[str, ...]  # the record's 8 fixed columns, ALT replaced by this allele
    chrom: str
    pos: int  # 1-based position of REF's first base
    ref: str
    alt: str
    allele_index: int  # which ALT of the record, from 1
    status: str  # "ok", "symbolic", "alt_equals_ref" or "too_long" here; variants.py adds reference checks

    @property
    def key(self) -> str:
        return f"{self.chrom}:{self.pos}:{self.ref}>{self.alt}"


@dataclass(frozen=True)
class VcfContents:
    path: Path
    header: list[str]  # meta lines ('##…') as read, without line ends
    columns: tuple[str, ...]  # the 8 fixed columns' names
    variants: list[Variant]
    records: int  # data lines read


def read_vcf(path: str | Path, *, max_allele: int = DEFAULT_MAX_ALLELE) -> VcfContents:
    """All variants of a VCF (one per ALT allele), classified; InputError for a file or line that is not VCF."""
    p = Path(path)
    if not p.is_file():
        raise InputError("VCF file not found", where=str(p), fix="check the path")
    header: list[str] = []
    variants: list[Variant] = []
    records = 0
    try:
        with open_maybe_gzip(p, "rt", encoding="utf-8", newline="") as fh:
            for number, raw in enumerate(fh, start=1):
                line = raw.rstrip("\r\n")
                if line.startswith("##"):
                    header.append(line)
                    continue
                if line.startswith("#") or not line.strip():
                    continue
                records += 1
                variants.extend(_parse_line(line, number, p, max_allele))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the VCF ({exc})", where=str(p),
                         fix="check the file is a complete plain, gzip or bgzip VCF") from None
    if records == 0:
        raise InputError("the VCF holds no variant records", where=str(p), fix="check the file")
    return VcfContents(p, header, FIXED_COLUMNS, variants, records)


def allele_status(ref: str, alt: str, max_allele: int = DEFAULT_MAX_ALLELE) -> str | None:
    """'ok', 'symbolic', 'alt_equals_ref' or 'too_long' for a REF that is bases; None when ALT is neither bases nor
    symbolic."""
    if _SYMBOLIC_RE.search(alt):
        return "symbolic"
    if not _BASES_RE.fullmatch(alt):
        return None
    if alt.upper() == ref.upper():
        return "alt_equals_ref"
    return "too_long" if max(len(ref), len(alt)) > max_allele else "ok"


def is_bases(text: str) -> bool:
    return _BASES_RE.fullmatch(text) is not None


def _parse_line(line: str, number: int, path: Path, max_allele: int) -> list[Variant]:
    where = f"{path}, line {number}"
    cols = line.split("\t")
    if len(cols) < 8:
        cols = line.split()
    if len(cols) < 8:
        raise InputError(f"a VCF data line needs 8 tab-separated columns (CHROM … INFO), this one has {len(cols)}",
                         where=where, fix="check the file is VCF and its columns are separated by tabs")
    chrom, pos_text, _, ref, alts = cols[:5]
    return site_variants(number, chrom, pos_text, ref, alts.split(","), fields=cols[:8], where=where,
                         fix="fix the line", max_allele=max_allele)


def site_variants(line: int, chrom: str, pos: object, ref: str, alts: Sequence[str], *,
                  fields: Sequence[str] | None = None, where: str, fix: str,
                  max_allele: int = DEFAULT_MAX_ALLELE) -> list[Variant]:
    """One :class:`Variant` per ALT of a site, after the checks every variant passes, from a VCF line or a
    DataFrame row: POS a positive integer, REF bases, each ALT bases or symbolic (InputError at ``where``
    otherwise). ``fields``: the record's 8 fixed columns (default: CHROM, POS and REF, the rest '.')."""
    position = _position(pos)
    if position is None:
        raise InputError(f"POS must be a positive integer, got {pos!r}", where=where, fix=fix)
    if not is_bases(ref):
        raise InputError(f"REF must be bases (A, C, G, T, N), got {ref[:40]!r}", where=where, fix=fix)
    fixed = tuple(fields) if fields is not None else (chrom, str(position), ".", ref) + (".",) * 4
    variants = []
    for index, alt in enumerate(alts, start=1):
        status = allele_status(ref, alt, max_allele)
        if status is None:
            raise InputError(f"ALT allele {index} must be bases, a symbolic allele (<…>), a breakend, '*' or '.', "
                             f"got {alt[:40]!r}", where=where, fix=fix)
        variants.append(Variant(line, fixed[:4] + (alt,) + fixed[5:], chrom, position, ref.upper(), alt.upper(),
                                index, status))
    return variants


def _position(pos: object) -> int | None:
    """A 1-based position given as text of ASCII digits (a VCF's POS) or as a whole number (a DataFrame cell)."""
    if isinstance(pos, bool):
        return None
    if isinstance(pos, numbers.Integral) or (isinstance(pos, float) and pos.is_integer()):
        value = int(pos)
    # isascii: str.isdigit accepts digits such as '²' that int() refuses.
    elif isinstance(pos, str) and pos.isascii() and pos.isdigit():
        value = int(pos)
    else:
        return None
    return value if value >= 1 else None
