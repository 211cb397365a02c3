"""`torchrun --nproc-per-node 2 -m genolc.cli finetune --cp 2` on CPU (gloo), whole windows (zigzag; KDA by state
and by heads) and chunked (contiguous; zigzag with --compile on): trains, checkpoints once, and its steps' losses
equal the single-process eager run's on the same data and seed (to fp32 rounding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, shared_file

from genolc.data.prepare import PrepareConfig, prepare

LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"
# A window not a multiple of the pool size (4) nor of the zigzag piece count (4); indexer KL and balance loss on.
ARGS = ["--seq", "301", "--steps", "2", "--lr", "1e-3", "--warmup", "1", "--indexer", "sparse", "--moe-balance",
        "0.05", "--device", "cpu", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def char_data(tmp_path_factory) -> Path:
    return prepare(PrepareConfig(genomes=(shared_file(LAMBDA),), out=tmp_path_factory.mktemp("char") / "ds",
                                 train="all", heldout=(), progress=False))


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def single_run(char_data, tmp_path_factory) -> Path:
    single = tmp_path_factory.mktemp("single") / "run"
    done = subprocess.run([sys.executable, "-m", "genolc.cli", "finetune", "--data", str(char_data), "--out",
                           str(single), *ARGS], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return single


@pytest.mark.parametrize("extra", [[], pytest.param(["--chunk", "151", "--cp-layout", "contiguous"],
                                                   marks=pytest.mark.slow), ["--cp-kda", "heads"],
                                   pytest.param(["--chunk", "151", "--compile", "on"], marks=pytest.mark.slow)],
                         ids=["whole", "chunked", "kda-heads", "chunked-compiled"])
def test_torchrun_cp2_matches_one_process(char_data, single_run, tmp_path, extra, one_thread):
    parallel = tmp_path / "cp2"
    env = {**_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}   # not the user's cache: compile here
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "genolc.cli", "finetune", "--data", str(char_data), "--out", str(parallel),
                           "--cp", "2", *ARGS, *extra], env=env, capture_output=True, text=True,
                          timeout=900 if "--compile" in extra else 300)   # compiling on CPU takes minutes
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines() == [str(parallel / "checkpoints" / "step-000002")]
    assert (parallel / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    summary = json.loads((parallel / "summary.json").read_text())
    assert summary["status"] == "ok"
    layout = "contiguous" if "contiguous" in extra else "zigzag"
    kda = "heads" if "heads" in extra else "state"
    assert summary["mesh"] == {"world_size": 2, "data_parallel": 1, "context_parallel": 2, "cp_layout": layout,
                               "cp_kda": kda}
    assert f"context_parallel(cp=2, {layout}, kda {kda})" in summary["transforms"]
    assert any(t.startswith("compile(") for t in summary["transforms"]) == ("--compile" in extra)
    assert any((tmp_path / "inductor").rglob("*.py")) == ("--compile" in extra)      # graphs were really built
    assert len(summary["peak_memory_gib_ranks"]) == 2
    assert len(summary["peak_host_memory_gib_ranks"]) == 2 and min(summary["peak_host_memory_gib_ranks"]) > 0.1
    expected, got = _metrics(single_run), _metrics(parallel)
    assert [m["step"] for m in got] == [1, 2]
    assert [m["step_strategy"] for m in got] == ["chunked" if "--chunk" in extra else "whole"] * 2
    for one, two in zip(expected, got):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
        assert two["aux_moe_balance"] == pytest.approx(one["aux_moe_balance"], rel=1e-5)
        assert two["moe_load_max_over_mean"] == one["moe_load_max_over_mean"]
    # Only rank 0 wrote: one run record.
    assert len(list((parallel / "runs").glob("*_finetune.json"))) == 1


def test_cp_that_does_not_divide_the_processes_is_one_clear_error(char_data, tmp_path, monkeypatch):
    """As rank 0 of 2 processes would see it under torchrun (the check runs before any process group exists)."""
    from click.testing import CliRunner

    from genolc.cli import main

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = CliRunner().invoke(main, ["finetune", "--data", str(char_data), "--out", str(tmp_path / "run"),
                                       "--cp", "3", *ARGS])
    assert result.exit_code == 2, result.output
    assert result.output.count("genolc: error:") == 1 and "Traceback" not in result.output
    assert "--cp 3 does not divide the 2 processes torchrun started" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_data_parallel_times_context_parallel_matches_data_parallel_alone(char_data, tmp_path, one_thread):
    """4 processes as 2 data-parallel groups of --cp 2 train the same windows as 2 processes without CP."""
    runs = {}
    for procs, cp in ((2, 1), (4, 2)):
        out = tmp_path / f"n{procs}-cp{cp}"
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               str(procs), "-m", "genolc.cli", "finetune", "--data", str(char_data), "--out", str(out),
                               "--cp", str(cp), *ARGS], env=_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        runs[cp] = _metrics(out)
    summary = json.loads((tmp_path / "n4-cp2" / "summary.json").read_text())
    assert summary["mesh"]["data_parallel"] == 2 and summary["mesh"]["context_parallel"] == 2
    for one, two in zip(runs[1], runs[2]):
        assert two["tokens"] == one["tokens"] == one["step"] * 2 * 301
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
        assert two["aux_moe_balance"] == pytest.approx(one["aux_moe_balance"], rel=1e-5)
