"""python benchmarks/prepare_stage_costs.py [GENOME] [--repeats 3]

What each unavoidable step of `genolc prepare` costs per base on one core, and the throughput they allow (issue 20:
>= 300 Mbp/s end to end from .fa.gz). Every step runs on 4 MB blocks, as prepare does, so the cost is for data in
cache rather than for first-touch pages:

- inflate: ISA-L (or zlib) over the whole .fa.gz, per output byte;
- line-end removal: ``bytes.translate`` (prepare's parser);
- md5 of the upper-cased sequence (the manifest's ``md5_upper``), which must run in order over a record;
- the scan: prepare's own ``RecordWriter._scan`` (soft-mask flags, upper-casing, N flags and counts, the char
  tokenizer's pair lookup, the unusual-byte check).

Process CPU time (user and system: fresh arrays' page faults count), best of --repeats. The sum is what these
steps cost as prepare runs them, before any pipeline overhead; two cores allow at most ``2 / sum`` bases per
second. Writes benchmarks/results/prepare_stage_costs_<date>.json (or $OUT).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from genolc.data._fasta import INFLATE_LIBRARY, _inflate_lib  # noqa: E402
from genolc.data.genome import RecordInfo  # noqa: E402
from genolc.data.prepare_record import RecordWriter, RegionMask  # noqa: E402
from genolc.fsutil import atomic_write_json  # noqa: E402
from genolc.runs import git_sha  # noqa: E402
from genolc.tokenize import make_tokenizer  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "data" / "human" / "GRCh37_chrX_1-69999930.fa.gz"
BLOCK = 1 << 22


def best_cpu_seconds(work, repeats: int) -> float:
    work()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("genome", type=Path, nargs="?", default=DEFAULT)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    raw = args.genome.read_bytes()

    def inflate() -> bytes:
        out = []
        decompressor = _inflate_lib.decompressobj(16 + 15)
        for start in range(0, len(raw), 1 << 20):
            out.append(decompressor.decompress(raw[start:start + (1 << 20)]))
        return b"".join(out)

    text = inflate()
    text_blocks = [text[i:i + BLOCK] for i in range(0, len(text), BLOCK)]
    seq = text[text.index(b"\n") + 1:].translate(None, b"\n")
    bases = np.frombuffer(seq, dtype=np.uint8)
    blocks = [bases[i:i + BLOCK] for i in range(0, len(bases), BLOCK)]
    upper_blocks = [np.bitwise_and(b, 0xDF) for b in blocks]
    with tempfile.TemporaryDirectory() as scratch:
        # prepare's own per-chunk scan (RecordWriter._scan, the char tokenizer's checking pair lookup included) on a
        # writer whose files go to a scratch folder.
        info = RecordInfo(index=0, name="chrX", description="chrX", chrom="chrX", start=1, source=str(args.genome))
        writer = RecordWriter(Path(scratch), "chrX", info, make_tokenizer("char"), np.dtype("<u2"), write=True,
                              mask=RegionMask(None, None, "chrX", 1))

        def scan() -> None:
            for block in blocks:
                writer._scan(block, 0, True)

        scan_seconds = best_cpu_seconds(scan, args.repeats)
        writer.finish()

    def md5() -> None:
        digest = hashlib.md5()
        for block in upper_blocks:
            digest.update(block.data)

    stages = {
        f"inflate ({INFLATE_LIBRARY})": best_cpu_seconds(inflate, args.repeats),
        "line-end removal": best_cpu_seconds(lambda: [b.translate(None, b"\n") for b in text_blocks], args.repeats),
        "md5 of the upper-cased sequence": best_cpu_seconds(md5, args.repeats),
        "scan (RecordWriter._scan: flags, upper, N, pair lookup, check)": scan_seconds,
    }
    ns = {name: round(seconds / len(bases) * 1e9, 2) for name, seconds in stages.items()}
    total = sum(ns.values())
    record = {"command": "python benchmarks/prepare_stage_costs.py " + " ".join(sys.argv[1:]),
              "git_sha": os.environ.get("GENOLC_GIT_SHA") or git_sha() or "unknown",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_average_before": list(os.getloadavg())},
              "genome": str(args.genome), "bases": len(bases), "block_bytes": BLOCK,
              "ns_per_base_one_core": ns, "sum_ns_per_base": round(total, 2),
              "ceiling_mbp_per_s": {"one core": round(1e3 / total, 1), "two cores": round(2e3 / total, 1)}}
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"prepare_stage_costs_{dt.date.today().isoformat()}.json"
    atomic_write_json(path, record)
    for name, value in ns.items():
        print(f"{name:64s} {value:6.2f} ns/base")
    print(f"{'sum':64s} {total:6.2f} ns/base -> at most {2e3 / total:.0f} Mbp/s on two cores")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
