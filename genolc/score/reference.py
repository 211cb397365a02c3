"""Reference access by index: pyfaidx over a plain or bgzip FASTA with its .fai (and .gzi), one window at a time.

Scoring 100 variants in hg38 reads 100 windows, not 3 Gbp. Records are named as ``genolc prepare`` names them
(:func:`genolc.data.genome.parse_header`): chromosome aliases (``22``/``chr22``/``NC_000022.11``) and region headers
(``>22:20000001-21000000``, ``>chr3 42000000 44000000``) place a record at its chromosome coordinates, so a VCF
position ``chr22:20000101`` is base 101 of the record ``22:20000001-21000000``. genolc's own streaming reader stays
for ``prepare``'s one pass over whole genomes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genolc.data import _fasta
from genolc.data.genome import canonical_chrom, parse_header
from genolc.errors import InputError


@dataclass(frozen=True)
class ReferenceRecord:
    name: str  # the FASTA record's name (first word of its header)
    chrom: str  # canonical chromosome name
    start: int  # 1-based chromosome coordinate of the record's first base
    length: int  # bases in the record

    @property
    def end(self) -> int:
        """1-based inclusive chromosome coordinate of the record's last base."""
        return self.start + self.length - 1


class Reference:
    """An indexed FASTA: ``fetch(record, start0, stop0)`` returns uint8 ASCII bases (case kept) of one stretch."""

    def __init__(self, path: str | Path):
        import pyfaidx

        self.path = Path(path)
        if not self.path.is_file():
            raise InputError("genome file not found", where=str(self.path), fix="check the path")
        with open(self.path, "rb") as fh:
            magic = fh.read(64)
        if magic[:2] == _fasta.GZIP_MAGIC and not _fasta.is_bgzf(magic):
            raise InputError(
                "the genome is gzip-compressed but not with bgzip, so it cannot be read by index",
                where=str(self.path),
                fix=f"recompress it: zcat {self.path.name} | bgzip > genome.fa.gz && samtools faidx genome.fa.gz "
                    "(or decompress it)")
        try:
            self._fasta = pyfaidx.Fasta(str(self.path), as_raw=True, sequence_always_upper=False,
                                        duplicate_action="stop")
        except (pyfaidx.FastaIndexingError, pyfaidx.UnsupportedCompressionFormat, ValueError, OSError,
                ImportError) as exc:
            raise InputError(f"cannot index the genome FASTA ({exc})", where=str(self.path),
                             fix="index it with samtools faidx (a bgzip FASTA also needs its .gzi), or make its "
                                 "folder writable so the index can be built") from None
        self.records: list[ReferenceRecord] = []
        for index, name in enumerate(self._fasta.keys()):
            record = self._fasta[name]
            info = parse_header(index, record.long_name, str(self.path))
            self.records.append(ReferenceRecord(name, info.chrom, info.start, len(record)))
        self._by_chrom: dict[str, list[ReferenceRecord]] = {}
        for rec in self.records:
            self._by_chrom.setdefault(rec.chrom, []).append(rec)

    def close(self) -> None:
        self._fasta.close()

    def __enter__(self) -> "Reference":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def has_chrom(self, chrom: str) -> bool:
        return canonical_chrom(chrom) in self._by_chrom

    def chrom_names(self) -> list[str]:
        return list(self._by_chrom)

    def locate(self, chrom: str, start: int, end: int) -> ReferenceRecord | None:
        """The record holding 1-based inclusive ``start..end`` of ``chrom`` (None if no record holds all of it)."""
        for rec in self._by_chrom.get(canonical_chrom(chrom), []):
            if rec.start <= start and end <= rec.end:
                return rec
        return None

    def span(self, chrom: str) -> tuple[int, int] | None:
        """1-based first and last chromosome coordinates the reference holds for ``chrom`` (None if absent)."""
        recs = self._by_chrom.get(canonical_chrom(chrom))
        if not recs:
            return None
        return min(r.start for r in recs), max(r.end for r in recs)

    def fetch(self, record: ReferenceRecord, start0: int, stop0: int) -> np.ndarray:
        """uint8 ASCII bases of record offsets ``start0..stop0`` (0-based half-open, clipped to the record)."""
        start0, stop0 = max(0, int(start0)), min(record.length, int(stop0))
        if stop0 <= start0:
            return np.empty(0, dtype=np.uint8)
        text = self._fasta[record.name][start0:stop0]
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8).copy()
