"""Make .gpudata/ (ignored by git) for the H200 runs: what `run` carries must fit 64 MiB with the packages.

    python benchmarks/make_gpu_data.py        # from the repository root; reads ../shared/data (GENOLC_SHARED_DATA)

Writes the first 24 Mbp of the GRCh37 chrX piece as ``.gpudata/GRCh37_chrX_1-24000000.fa.gz`` (header
``>X:1-24000000``, so prepare's region offsets keep chrX coordinates; 7 MB) and copies the other human pieces the
flagship experiment (experiments/long_context_dna.py, benchmarks/run_flagship.sh) trains on or holds out: hg38 chr2
(0.75 MB), GRCh37 chr22, hg19 chr3/chr4/chr5 and GRCh38 chr19 (3.3 MB together); 10.1 MB in all, beside the 47 MB of
.gpu/. The long-context benchmarks hold out ``X:1-8000000`` for evaluation and train on the rest.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("GENOLC_SHARED_DATA", ROOT.parent / "shared" / "data"))
BASES = 24_000_000
# Copied whole: the flagship experiment's second training piece and its held-out pieces (about 8 Mbp).
PIECES = ("hg38_chr2_1-2333275.fa.gz", "GRCh37_chr22_20000001-21000000.fa.gz", "hg19_chr3_42000000-44000000.fa.gz",
          "hg19_chr4_103000000-105000000.fa.gz", "hg19_chr5_124000000-126000000.fa.gz",
          "GRCh38p12_chr19_NT_011295.12_18775270-19883859.fa.gz")


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
    for name in PIECES:
        if not (out_dir / name).exists():
            shutil.copy(SHARED / "human" / name, out_dir)
    total = sum(path.stat().st_size for path in out_dir.iterdir())
    print(f"wrote {target} ({written:,} bases) and copied {len(PIECES)} pieces; {out_dir} holds {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
