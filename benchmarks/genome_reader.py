"""python benchmarks/genome_reader.py [GENOME] [--repeats 3]

Throughput of genolc's genome reader alone (decompression + line-end removal + record splitting, no tokenizing)
on the 70 Mbp chrX file, beside plain zlib inflation of the same file as the floor, and peak RSS. Also times the
per-chunk helpers prepare calls (check_characters, softmask_flags, n_intervals, iupac_counts). Target: reader
>= 250 Mbp/s on one core. Writes benchmarks/results/genome_reader.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import zlib
from pathlib import Path

from genolc.data import genome

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "data" / "human" / "GRCh37_chrX_1-69999930.fa.gz"


def _inflate_only(path: Path) -> float:
    start = time.process_time()
    with open(path, "rb") as fh:
        decomp = zlib.decompressobj(31)
        while data := fh.read(1 << 20):
            while data:
                decomp.decompress(data, 1 << 22)
                data = decomp.unconsumed_tail
    return time.process_time() - start


def _read(path: Path, helpers: bool) -> tuple[float, int]:
    # CPU time of this process: the figure that matters for "one core", and less disturbed by other load.
    start = time.process_time()
    bases = 0
    for stream in genome.open_genome(path).records():
        for chunk in stream.chunks():
            if helpers:
                genome.check_characters(chunk, stream.info, bases)
                genome.softmask_flags(chunk)
                genome.n_intervals(chunk, bases)
                genome.iupac_counts(chunk)
            bases += chunk.size
    return time.process_time() - start, bases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("genome", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    inflate = min(_inflate_only(args.genome) for _ in range(args.repeats))
    reader = min(_read(args.genome, helpers=False) for _ in range(args.repeats))
    with_helpers = min(_read(args.genome, helpers=True) for _ in range(args.repeats))
    bases = reader[1]
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "git_sha": sha,
        "device": f"{platform.processor() or platform.machine()} (1 core, CPU)",
        "genome": str(args.genome),
        "bases": bases,
        "load_average_1min_before": round(load, 2),
        "timing": "min over repeats of process CPU seconds",
        "zlib_inflate_only_s": round(inflate, 3),
        "reader_s": round(reader[0], 3),
        "reader_mbp_per_s": round(bases / reader[0] / 1e6, 1),
        "reader_plus_helpers_s": round(with_helpers[0], 3),
        "reader_plus_helpers_mbp_per_s": round(bases / with_helpers[0] / 1e6, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    out = ROOT / "benchmarks" / "results" / "genome_reader.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
