"""benchmarks/bench_context_parallel.py split over two calls (--runs one, then --runs cp --one-gpu-from): on CPU with
the gloo backend and the tiny preset, the way a one-GPU reference too long for one device call is measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_context_parallel.py"
SAMPLE = ROOT / "genolc" / "sample" / "hg38_chr2_1-600000.fa.gz"


def _bench(out: Path, tag: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "BENCH_TAG": tag, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), "--fasta", str(SAMPLE), "--models", "tiny", "--lengths", "1k",
                           *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_a_one_gpu_record_of_other_steps_or_none_at_all_is_refused(tmp_path):
    record = tmp_path / "one.json"
    record.write_text(json.dumps({"setup": {"fasta": SAMPLE.name, "steps": 2, "recompute": False}, "rows": []}))
    refused = _bench(tmp_path, "_x", "--steps", "3", "--runs", "cp", "--one-gpu-from", str(record), timeout=120)
    assert refused.returncode != 0
    assert "same dataset, --steps and --recompute" in refused.stderr and "'steps': 3" in refused.stderr
    alone = _bench(tmp_path, "_x", "--steps", "2", "--runs", "cp", timeout=120)
    assert alone.returncode == 2 and "--runs cp and --one-gpu-from go together" in alone.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.json"]


@pytest.mark.slow
def test_split_calls_compare_the_same_windows(tmp_path):
    """The one-GPU reference of one step (--one-gpu-steps 1, for references whose two steps overrun a call)."""
    one = _bench(tmp_path, "_one", "--steps", "2", "--one-gpu-steps", "1", "--runs", "one", "--timeout", "300")
    assert one.returncode == 0, one.stderr[-2000:]
    record = tmp_path / next(p.name for p in tmp_path.iterdir() if p.name.endswith("_one.json"))
    rows = json.loads(record.read_text())["rows"]
    assert [("context_parallel" in row, row["one_gpu"]["ok"]) for row in rows] == [(False, True)]
    assert len(rows[0]["one_gpu"]["losses"]) == 1
    cp = _bench(tmp_path, "_cp", "--steps", "2", "--one-gpu-steps", "1", "--runs", "cp", "--one-gpu-from", str(record),
                "--timeout", "300")
    assert cp.returncode == 0, cp.stderr[-2000:]
    row = json.loads((tmp_path / record.name.replace("_one", "_cp")).read_text())["rows"][0]
    assert row["one_gpu"]["from_record"] == str(record)
    assert row["context_parallel"]["ok"] and row["first_loss_equal"], row
    assert row["first_loss_one_gpu"] == rows[0]["one_gpu"]["losses"][0]
    assert row["one_gpu_rate_is_first_step"] and len(row["context_parallel"]["losses"]) == 2


def test_a_reference_that_does_not_divide_the_cp_ranks_is_refused(tmp_path):
    refused = _bench(tmp_path, "_x", "--steps", "2", "--cp", "4", "--reference-cp", "3", timeout=120)
    assert refused.returncode == 2 and "--reference-cp must divide --cp" in refused.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_data_parallel_groups_are_compared_with_data_parallel_alone(tmp_path):
    """--dp 2 --cp 2 (four processes) against two data-parallel processes without CP: the same windows, so the
    same first loss; the rows carry each rank's host memory and the ideal speed-up is the CP size."""
    done = _bench(tmp_path, "_dp", "--steps", "2", "--dp", "2", "--cp", "2", "--timeout", "400", timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    record = next(p for p in tmp_path.iterdir() if p.name.endswith("_dp.json"))
    row = json.loads(record.read_text())["rows"][0]
    assert (row["dp"], row["cp"], row["reference_cp"]) == (2, 2, 1)
    assert "--nproc-per-node 2" in row["one_gpu"]["command"]
    assert "--nproc-per-node 4" in row["context_parallel"]["command"]
    assert len(row["context_parallel"]["peak_host_gib_ranks"]) == 4 and len(row["one_gpu"]["peak_host_gib_ranks"]) == 2
    assert row["first_loss_equal"], (row["first_loss_one_gpu"], row["first_loss_cp"])
    assert row["speedup"] == pytest.approx(2 * row["scaling_efficiency"], rel=1e-2)
