"""python benchmarks/bench_prepare.py [--data ../shared/data] [--repeats 5]

End-to-end throughput (Mbp/s) and peak RSS of `genolc prepare` (char tokenizer, --train all --heldout none
--all-records) beside Biopython and pyfaidx reading the same files, in one run on this machine:

- ``four_genomes``: four .fa.gz genomes (GRCh37 chrX 70 Mbp, yeast 12 Mbp, E. coli, M. tuberculosis); genolc
  prepare as the CLI runs it (a fresh process, start-up included, wall clock), genolc prepare() alone (imports
  excluded), genolc's reader alone (inflate + parse), and Biopython ``SeqIO.parse`` over ``gzip.open``, each
  touching every base (``len(str(record.seq))``). pyfaidx cannot read plain gzip (it needs bgzip), so:
- ``four_genomes_plain``: the same genomes inflated to plain FASTA in a temporary folder: genolc prepare, pyfaidx
  (``Fasta`` builds its .fai, then every record is read whole) and Biopython.
- ``chrX_twice_140Mbp_plain``: one 140 Mbp record, to show peak RSS does not grow with the record.

Every measurement runs in a fresh child process, unpinned (the fast path inflates and writes in threads of its
own; the machine's cores are shared, so ``load_average`` is recorded before and after); the tools take turns
round by round, so a load swing hits all of them alike. Figures are medians of --repeats runs (all runs listed);
RSS is the child's peak and ``cpu_seconds`` its user + system time (os.wait4), which a busy machine inflates far
less than the wall clock. Result: benchmarks/results/prepare_<date>.json (command, git SHA, machine).
Target (issue 20): >= 300 Mbp/s end to end from .fa.gz, peak RSS < 1.5 GB.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_MBPS = 300.0
TARGET_RSS_GB = 1.5
GENOMES = ("human/GRCh37_chrX_1-69999930.fa.gz", "other/Scerevisiae_S288C_R64_16chr.fa.gz",
           "other/Ecoli_K12_MG1655.fa.gz", "other/Mtb_H37Rv_NC_000962.2.fa.gz")

_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
mode = sys.argv[1]; out = sys.argv[2]; files = sys.argv[3:]
bases = 0
if mode == "genolc_prepare":
    from pathlib import Path
    from genolc.data.prepare import PrepareConfig, prepare
    t0 = time.perf_counter()
    prepare(PrepareConfig(genomes=tuple(map(Path, files)), out=Path(out), train="all", heldout=(),
                          all_records=True, progress=False))
    bases = sum(r["length_bases"] for r in json.loads((Path(out) / "manifest.json").read_text())["records"])
elif mode == "genolc_reader":
    from genolc.data import genome
    t0 = time.perf_counter()
    for path in files:
        for stream in genome.open_genome(path).records():
            for chunk in stream.chunks(1 << 24):
                bases += len(chunk)
elif mode == "biopython":
    import gzip
    from Bio import SeqIO
    t0 = time.perf_counter()
    for path in files:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
            for record in SeqIO.parse(fh, "fasta"):
                bases += len(str(record.seq))
elif mode == "pyfaidx":
    from pyfaidx import Fasta
    t0 = time.perf_counter()
    for path in files:
        fasta = Fasta(path, sequence_always_upper=False, rebuild=True)
        for name in fasta.keys():
            bases += len(str(fasta[name][:]))
        fasta.close()
print(json.dumps({"bases": bases, "seconds": time.perf_counter() - t0,
                  "seconds_with_imports": time.perf_counter() - t_start}))
"""


def _measure(tool: str, files: list[Path], tmp: Path, baseline: Path | None) -> dict:
    """``tool``, or ``tool@baseline``: the same genolc tool run from the ``--baseline`` source tree."""
    tool, _, at = tool.partition("@")
    code = baseline if at else REPO
    out = tmp / "ds"
    shutil.rmtree(out, ignore_errors=True)
    if tool == "genolc_prepare_cli":
        argv = [sys.executable, "-m", "genolc.cli", "prepare", *map(str, files), "-o", str(out), "--train", "all",
                "--heldout", "none", "--all-records", "--no-progress"]
        wall, _, rss, cpu = _timed_child(argv, tmp, code)
        manifest = json.loads((out / "manifest.json").read_text())
        bases = sum(r["length_bases"] for r in manifest["records"])
        shutil.rmtree(out)
        return {"bases": bases, "seconds": wall, "peak_rss_gb": rss, "cpu_seconds": cpu}
    _, stdout, rss, cpu = _timed_child([sys.executable, "-c", _CHILD, tool, str(out), *map(str, files)], tmp, code)
    shutil.rmtree(out, ignore_errors=True)
    for index in tmp.glob("*.fai"):
        index.unlink()
    figures = json.loads(stdout.strip().splitlines()[-1])
    return {"bases": figures["bases"], "seconds": figures["seconds"], "peak_rss_gb": rss, "cpu_seconds": cpu}


def _timed_child(argv: list[str], cwd: Path, code: Path) -> tuple[float, str, float, float]:
    """(wall seconds, stdout, peak RSS in GB, CPU seconds: user + system of the whole child)."""
    env = dict(os.environ, PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    stdout = proc.stdout.read()  # type: ignore[union-attr]
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed: {' '.join(argv[:4])}\n{stderr.decode()[-3000:]}")
    return wall, stdout.decode(), usage.ru_maxrss * 1024 / 1e9, usage.ru_utime + usage.ru_stime


def _compare(tools: list[str], files: list[Path], tmp: Path, repeats: int, baseline: Path | None) -> dict:
    if baseline is not None:
        tools = tools + [f"{t}@baseline" for t in tools if t.startswith("genolc")]
    runs: dict[str, list[dict]] = {tool: [] for tool in tools}
    for _ in range(repeats):
        for tool in tools:
            runs[tool].append(_measure(tool, files, tmp, baseline))
    result = {"files": [str(f) for f in files]}
    for tool, measured in runs.items():
        seconds = [r["seconds"] for r in measured]
        bases = measured[0]["bases"]
        result[tool] = {
            "bases": bases,
            "seconds_median": round(statistics.median(seconds), 3),
            "seconds_all": [round(s, 3) for s in seconds],
            "mbp_per_s_median": round(bases / statistics.median(seconds) / 1e6, 1),
            "mbp_per_s_best": round(bases / min(seconds) / 1e6, 1),
            "peak_rss_gb": round(max(r["peak_rss_gb"] for r in measured), 3),
            # The whole child's CPU time (imports included): what the work costs, whatever the load.
            "cpu_seconds_median": round(statistics.median(r["cpu_seconds"] for r in measured), 3),
        }
        print(tool, result[tool]["mbp_per_s_median"], "Mbp/s median", result[tool]["seconds_all"], flush=True)
    counts = {result[t]["bases"] for t in runs}
    result["same_bases_everywhere"] = len(counts) == 1
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a genolc source tree (e.g. `git archive main genolc | tar -x -C DIR`) whose genolc "
                             "tools run beside this one's, as ``TOOL@baseline``: before and after in one run")
    parser.add_argument("--baseline-commit", default=None, help="the commit --baseline was taken from, recorded")
    args = parser.parse_args()
    baseline = None if args.baseline is None else args.baseline.resolve()
    if baseline is not None and not (baseline / "genolc" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {baseline} holds no genolc package")
    files = [args.data.resolve() / g for g in GENOMES]
    for f in files:
        if not f.is_file():
            raise SystemExit(f"missing {f}; pass --data DIR (the folder holding human/ and other/)")

    sys.path.insert(0, str(REPO))
    from genolc.data import _fasta
    from genolc.runs import git_sha, host_info

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp_name:
        tmp = Path(tmp_name)
        gz_tools = ["genolc_prepare_cli", "genolc_prepare", "genolc_reader", "biopython"]
        results = {"four_genomes": _compare(gz_tools, files, tmp, args.repeats, baseline)}
        plain = []
        for f in files:
            plain.append(tmp / f.name.removesuffix(".gz"))
            with gzip.open(f, "rb") as src, open(plain[-1], "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        results["four_genomes_plain"] = _compare(["genolc_prepare_cli", "genolc_prepare", "pyfaidx", "biopython"],
                                                 plain, tmp, args.repeats, baseline)
        doubled = _doubled_chromosome(plain[0], tmp / "chrX_twice.fa")
        results["chrX_twice_140Mbp_plain"] = _compare(["genolc_prepare"], [doubled], tmp, max(1, args.repeats // 2),
                                                      None)
    load_after = os.getloadavg()

    end_to_end = results["four_genomes"]["genolc_prepare_cli"]
    record = {
        "benchmark": "prepare",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_sha": git_sha(),
        "baseline": None if baseline is None else {"path": str(baseline), "commit": args.baseline_commit},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": host_info() | {"cpu_model": _cpu_model(), "load_average_before": load_before,
                                 "load_average_after": load_after, "inflate_library": _fasta.INFLATE_LIBRARY},
        "targets": {"mbp_per_s_end_to_end_from_fa_gz": TARGET_MBPS, "peak_rss_gb": TARGET_RSS_GB},
        "results": results,
        "met": {
            "throughput": end_to_end["mbp_per_s_median"] >= TARGET_MBPS,
            "peak_rss": max(r["peak_rss_gb"] for group in results.values() for k, r in group.items()
                            if k.startswith("genolc") and "@" not in k) < TARGET_RSS_GB,
            "faster_than_biopython_from_fa_gz": end_to_end["mbp_per_s_median"]
            > results["four_genomes"]["biopython"]["mbp_per_s_median"],
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"prepare_{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["met"], indent=2))
    print(f"wrote {path}", file=sys.stderr)


def _doubled_chromosome(source: Path, dest: Path) -> Path:
    """A plain FASTA holding ``source``'s (single) record twice over as one 140 Mbp record, written streaming."""
    from genolc.data import genome

    with open(dest, "wb") as fh:
        fh.write(b">chrX_twice\n")
        for _ in range(2):
            for stream in genome.open_genome(source).records():
                for chunk in stream.chunks(1 << 24):
                    fh.write(chunk.tobytes())
                    fh.write(b"\n")
    return dest


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
