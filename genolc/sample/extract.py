"""Rebuild the bundled demo sample from ../shared/data (maintainers only; the package ships the result).

    python -m genolc.sample.extract /work/shared/data/human genolc/sample

Streams each source FASTA with the standard library (one is plain gzip, one bgzip), cuts a region, keeps case
(soft-mask), writes 60-column FASTA with a region header (``>chr2:1-600000``) so prepared coordinates are the
chromosome's. The pieces are bgzipped (BGZF), not plain gzip, because ``genolc score`` and ``genolc embed`` read a
genome by index; their ``.fai`` and ``.gzi`` indexes are written beside them, so an installed package needs no
writable folder. BGZF block headers carry no time, so the bytes, and their md5s in PROVENANCE.md, are reproducible.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

# (output name, source file, chromosome label, 1-based first base of the source record, 1-based inclusive region)
PIECES = [
    ("hg38_chr2_1-600000.fa.gz", "hg38_chr2_1-2333275.fa.gz", "chr2", 1, (1, 600_000)),
    ("GRCh37_chr22_20480001-20680000.fa.gz", "GRCh37_chr22_20000001-21000000.fa.gz", "22", 20_000_001,
     (20_480_001, 20_680_000)),
]
LINE = 60


def read_single_record(path: Path) -> str:
    with gzip.open(path, "rt") as fh:
        lines = fh.read().splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith(">")]
    if headers != [0]:
        raise SystemExit(f"{path}: expected exactly one record, found {len(headers)}")
    return "".join(line.strip() for line in lines[1:])


def main(source_dir: str, out_dir: str) -> None:
    out = Path(out_dir)
    for name, source, chrom, record_start, (first, last) in PIECES:
        seq = read_single_record(Path(source_dir) / source)
        piece = seq[first - record_start:last - record_start + 1]
        assert len(piece) == last - first + 1, (name, len(piece))
        body = "\n".join(piece[i:i + LINE] for i in range(0, len(piece), LINE))
        text = f">{chrom}:{first}-{last}\n{body}\n".encode()
        write_bgzf_fasta(out / name, text)
        print(f"{name}\t{len(piece)}")


def write_bgzf_fasta(path: Path, text: bytes) -> None:
    """``text`` as a BGZF file at ``path``, with the ``.fai`` and ``.gzi`` indexes pyfaidx reads it by."""
    import pyfaidx
    from Bio import bgzf

    for stale in (path, path.with_name(path.name + ".fai"), path.with_name(path.name + ".gzi")):
        stale.unlink(missing_ok=True)
    with bgzf.BgzfWriter(str(path), "wb") as fh:
        fh.write(text)
    pyfaidx.Fasta(str(path)).close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
