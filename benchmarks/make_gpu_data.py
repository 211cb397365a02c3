"""Make .gpudata/ (ignored by git) for the H200 benchmarks: what `run` carries must fit 64 MiB with the packages.

    python benchmarks/make_gpu_data.py        # from the repository root; reads ../shared/data (GENOLC_SHARED_DATA)

Writes the first 24 Mbp of the GRCh37 chrX piece as ``.gpudata/GRCh37_chrX_1-24000000.fa.gz`` (header
``>X:1-24000000``, so prepare's region offsets keep chrX coordinates; 7 MB) and copies the GRCh37 chr22 piece. The
benchmarks hold out ``X:1-8000000`` for evaluation and train on the rest.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("GENOLC_SHARED_DATA", ROOT.parent / "shared" / "data"))
BASES = 24_000_000


def main() -> None:
    out_dir = ROOT / ".gpudata"
    out_dir.mkdir(exist_ok=True)
    target = out_dir / "GRCh37_chrX_1-24000000.fa.gz"
    written = 0
    with gzip.open(SHARED / "human" / "GRCh37_chrX_1-69999930.fa.gz", "rt") as source, \
            gzip.open(target, "wt", compresslevel=6) as out:
        source.readline()
        out.write(f">X:1-{BASES} GRCh37 chrX, first {BASES // 1_000_000} Mbp\n")
        for line in source:
            piece = line.strip()[: BASES - written]
            out.write(piece + "\n")
            written += len(piece)
            if written >= BASES:
                break
    shutil.copy(SHARED / "human" / "GRCh37_chr22_20000001-21000000.fa.gz", out_dir)
    print(f"wrote {target} ({written:,} bases)")


if __name__ == "__main__":
    main()
