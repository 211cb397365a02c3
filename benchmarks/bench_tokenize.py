"""python benchmarks/bench_tokenize.py [--genome FASTA.gz] [--repeats 3] [--bpe-bases 8000000]

Encode / decode / reverse-complement throughput of every genolc tokenizer on real DNA (the 70 Mbp GRCh37 chrX
piece, 5.4% N), in Mbp/s of sequence on one core (numpy is single-threaded here; the BPE encoder, genolc's numba
one unless GENOLC_BPE_ENCODER says otherwise, is timed with RAYON_NUM_THREADS=1 unless --bpe-threads says
otherwise). Each figure is the best of --repeats runs. BPE is trained with genolc's defaults (reservoir sample of 4 Mbp of the sequence,
vocabulary 4096) and, being ~20-60x slower than the table-driven tokenizers, timed on the first --bpe-bases
bases. Also checks the round trip on the measured data. Target: char encode >= 200 Mbp/s.
BPE encoding is also timed with each encoder (genolc's numba encoder and the `tokenizers` library's Rust one) on
each thread count of --bpe-thread-counts (default 1,2; each in a fresh process, since the Rust thread pool is sized
once per process; one untimed first call on 100 kb), medians of --repeats, with the ids checked identical across
encoders and thread counts; --bpe-only skips everything else. Target (issue 20): BPE encode >= 20 Mbp/s on
this 2-core machine.
Writes benchmarks/results/tokenize_<YYYY-MM-DD>.json with the command, git SHA, device and figures.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GENOME = ROOT.parent / "shared" / "data" / "human" / "GRCh37_chrX_1-69999930.fa.gz"


def _read_fasta_gz(path: Path):
    import numpy as np

    raw = gzip.open(path, "rb").read()
    body = b"".join(line for line in raw.splitlines() if not line.startswith(b">"))
    return np.frombuffer(body, dtype=np.uint8)


def _best_seconds(fn, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


_BPE_CHILD = r"""
import json, os, statistics, sys, time
import numpy as np
from genolc.tokenize import load_tokenizer
tok = load_tokenizer(sys.argv[1]); seq = np.load(sys.argv[2]); repeats = int(sys.argv[4])
start = time.perf_counter()
tok.encode(seq[:100_000])      # first call: numba's compile (or loading its cache), the Rust thread pool
first_call = time.perf_counter() - start
seconds = []
for _ in range(repeats):
    start = time.perf_counter()
    ids = tok.encode(seq)
    seconds.append(time.perf_counter() - start)
np.save(sys.argv[3], ids)
print(json.dumps({"seconds": seconds, "first_call_seconds": first_call, "load_average": os.getloadavg()}))
"""


def _bpe_thread_scaling(bpe, seq, thread_counts: list[int], repeats: int) -> dict:
    """BPE encode Mbp/s per encoder (genolc's numba encoder, the tokenizers library's) and thread count, each in a
    fresh process (the Rust thread pool is sized once per process); ids must not depend on either."""
    import statistics
    import tempfile

    import numpy as np

    from genolc.tokenize import save_tokenizer

    scaling: dict = {"bases": int(seq.shape[0]), "by_encoder": {}}
    with tempfile.TemporaryDirectory(prefix="bench_bpe_") as tmp:
        save_tokenizer(bpe, Path(tmp) / "bpe.json")
        np.save(Path(tmp) / "seq.npy", seq)
        first_ids = None
        for encoder in ("tokenizers", "numba"):
            scaling["by_encoder"][encoder] = {}
            for threads in thread_counts:
                env = dict(os.environ, RAYON_NUM_THREADS=str(threads), GENOLC_BPE_ENCODER=encoder,
                           PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
                done = subprocess.run([sys.executable, "-c", _BPE_CHILD, str(Path(tmp) / "bpe.json"),
                                       str(Path(tmp) / "seq.npy"), str(Path(tmp) / "ids.npy"), str(repeats)],
                                      capture_output=True, text=True, env=env, check=True)
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                ids = np.load(Path(tmp) / "ids.npy")
                first_ids = ids if first_ids is None else first_ids
                median = statistics.median(figures["seconds"])
                scaling["by_encoder"][encoder][str(threads)] = {
                    "encode_mbp_s_median": round(seq.shape[0] / median / 1e6, 2),
                    "encode_mbp_s_best": round(seq.shape[0] / min(figures["seconds"]) / 1e6, 2),
                    "seconds_all": [round(x, 3) for x in figures["seconds"]],
                    "first_call_seconds": round(figures["first_call_seconds"], 2),
                    "load_average_after": figures["load_average"],
                    "ids_identical_to_first": bool(np.array_equal(ids, first_ids)),
                }
                print(f"bpe encode, {encoder}, {threads} thread(s):", scaling["by_encoder"][encoder][str(threads)],
                      flush=True)
    return scaling


def _measure(tok, seq, repeats: int) -> dict:
    import numpy as np

    from genolc.tokenize import reverse_complement_bases

    n = int(seq.shape[0])
    t_enc, ids = _best_seconds(lambda: tok.encode(seq), repeats)
    t_dec, decoded = _best_seconds(lambda: tok.decode(ids), repeats)
    t_rc, rc = _best_seconds(lambda: tok.reverse_complement(ids), repeats)
    t_len, lengths = _best_seconds(lambda: tok.token_lengths(ids), repeats)
    t_amb, _ = _best_seconds(lambda: tok.ambiguous_mask(ids), repeats)
    ok_lengths = int(lengths.sum()) == n
    ok_rc = bool(np.array_equal(tok.decode(rc), reverse_complement_bases(decoded)))
    mbps = lambda seconds: round(n / seconds / 1e6, 1)  # noqa: E731
    return {"bases": n, "tokens": int(ids.shape[0]), "bases_per_token": round(n / ids.shape[0], 3),
            "encode_mbp_s": mbps(t_enc), "decode_mbp_s": mbps(t_dec), "reverse_complement_mbp_s": mbps(t_rc),
            "token_lengths_mbp_s": mbps(t_len), "ambiguous_mask_mbp_s": mbps(t_amb),
            "seconds": {"encode": round(t_enc, 4), "decode": round(t_dec, 4), "reverse_complement": round(t_rc, 4)},
            "checks": {"token_lengths_sum_to_bases": ok_lengths, "decode_of_rc_is_revcomp": ok_rc}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--genome", type=Path, default=DEFAULT_GENOME)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bpe-bases", type=int, default=8_000_000)
    parser.add_argument("--bpe-threads", type=int, default=1)
    parser.add_argument("--bpe-thread-counts", default="1,2",
                        help="comma-separated encoder thread counts for the BPE scaling figures")
    parser.add_argument("--bpe-only", action="store_true", help="only train BPE and time its encoder")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default benchmarks/results/tokenize_<date>.json)")
    args = parser.parse_args(argv)
    # Must be set before the Rust thread pool starts (first tokenizers call).
    os.environ["RAYON_NUM_THREADS"] = str(args.bpe_threads)

    import numpy as np

    from genolc.fsutil import atomic_write_json
    from genolc.tokenize import make_tokenizer

    start = time.perf_counter()
    seq = _read_fasta_gz(args.genome)
    read_s = time.perf_counter() - start
    print(f"read {seq.shape[0]:,} bases in {read_s:.1f} s", flush=True)

    results: dict[str, dict] = {}
    for spec in [] if args.bpe_only else ["char", "byte", "kmer:3", "kmer:6", "kmer:8"]:
        results[spec] = _measure(make_tokenizer(spec), seq, args.repeats)
        print(spec, {k: results[spec][k] for k in ("encode_mbp_s", "decode_mbp_s", "reverse_complement_mbp_s")},
              flush=True)

    start = time.perf_counter()
    bpe = make_tokenizer("bpe:4096", [seq])
    train_s = time.perf_counter() - start
    sub = seq[: args.bpe_bases]
    results["bpe:4096_threads"] = _bpe_thread_scaling(
        bpe, sub, [int(t) for t in args.bpe_thread_counts.split(",")], args.repeats)
    results["bpe:4096"] = _measure(bpe, sub, 1)
    results["bpe:4096"]["train_seconds"] = round(train_s, 2)
    results["bpe:4096"]["training"] = bpe.training
    results["bpe:4096"]["vocab_size"] = bpe.vocab_size
    results["bpe:4096"]["encoder_threads"] = args.bpe_threads
    sub_ids = bpe.encode(sub)
    acgt = ~bpe.ambiguous_mask(sub_ids)
    results["bpe:4096"]["mean_acgt_token_bases"] = round(float(bpe.token_lengths(sub_ids)[acgt].mean()), 3)
    print("bpe:4096", {k: results["bpe:4096"][k] for k in ("train_seconds", "encode_mbp_s", "decode_mbp_s",
                                                            "bases_per_token")}, flush=True)

    char_encode = results["char"]["encode_mbp_s"] if "char" in results else None
    record = {
        "benchmark": "tokenize",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_sha": _git_sha(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": {"cpu": _cpu_model(), "logical_cpus": os.cpu_count(), "python": platform.python_version(),
                   "numpy": np.__version__},
        "genome": {"path": str(args.genome), "bases": int(seq.shape[0]),
                   "n_fraction": round(float(np.isin(seq, np.frombuffer(b"Nn", np.uint8)).mean()), 4),
                   "read_seconds": round(read_s, 2)},
        "repeats": args.repeats,
        "unit": "Mbp of sequence per second (1e6 bases/s), best of repeats, one core",
        "target": {"char_encode_mbp_s": 200, "met": None if char_encode is None else char_encode >= 200,
                   "bpe_encode_mbp_s_two_cores": 20,
                   "bpe_met": max(r["encode_mbp_s_median"] for by_threads in
                                  results["bpe:4096_threads"]["by_encoder"].values() for r in by_threads.values())
                   >= 20},
        "load_average": os.getloadavg(),
        "results": results,
    }
    out = args.out or ROOT / "benchmarks" / "results" / f"tokenize_{datetime.date.today().isoformat()}.json"
    atomic_write_json(out, record)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
