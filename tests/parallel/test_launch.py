"""Which rank writes and speaks under torchrun (genolc/parallel/launch.py): one rule for the command, the trainer and
the mesh."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import shared_file

from genolc.cli import main
from genolc.data.prepare import PrepareConfig, prepare
from genolc.parallel import launch
from genolc.parallel.mesh import init_mesh

LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def char_data(tmp_path_factory) -> Path:
    return prepare(PrepareConfig(genomes=(shared_file(LAMBDA),), out=tmp_path_factory.mktemp("char") / "ds",
                                 train="all", heldout=(), progress=False))


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_rank_without_world_size_is_a_single_process_that_writes_everything(char_data, tmp_path, no_torchrun,
                                                                            one_thread):
    """RANK alone (a scheduler's, not torchrun's) is one process: the mesh, the command and the run record all take
    it as the writer (the command used to skip its output claim, its run record and printing the checkpoint)."""
    no_torchrun.setenv("RANK", "3")
    assert launch.writes_outputs() and init_mesh(1, "cpu").writes
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["finetune", "--no-progress", "--data", str(char_data), "--seq", "64",
                                       "--steps", "1", "--lr", "1e-3", "--warmup", "0", "--device", "cpu",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out / "checkpoints" / "step-000001") in result.output.splitlines()
    assert len(list((out / "runs").glob("*_finetune.json"))) == 1


@pytest.mark.parametrize("env,writes", [({}, True), ({"RANK": "0", "WORLD_SIZE": "2"}, True),
                                        ({"RANK": "1", "WORLD_SIZE": "2"}, False),
                                        ({"RANK": "1"}, True), ({"RANK": "one", "WORLD_SIZE": "2"}, True)])
def test_one_rule_decides_the_writer(no_torchrun, env, writes):
    for name, value in env.items():
        no_torchrun.setenv(name, value)
    assert launch.writes_outputs() is writes
    assert launch.rank_writes(launch.env_rank()) is writes


ARGS = ["--seq", "64", "--steps", "1", "--device", "cpu", "--no-progress"]


def _torchrun_rank(monkeypatch, rank: int, rendezvous: bool = True) -> None:
    """This process as rank ``rank`` of 2 under torchrun (no process group is ever joined by these tests)."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    if rendezvous:
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setattr(launch, "QUIET_EXIT_DELAY_S", 0.0)


def _finetune(char_data, tmp_path, *args):
    return CliRunner().invoke(main, ["finetune", "--data", str(char_data), "--out", str(tmp_path / "run"),
                                     *ARGS, *args])


BAD_OPTIONS = {"cp": ["--cp", "3"], "model-and-init": ["--model", "tiny", "--init", "somewhere"],
               "config": ["--softmask-weight", "1.5"], "usage": ["--no-such-option"]}


@pytest.mark.parametrize("bad", BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_an_option_error_is_printed_by_rank_0_alone(char_data, tmp_path, no_torchrun, bad):
    _torchrun_rank(no_torchrun, 0)
    said = _finetune(char_data, tmp_path, *bad)
    assert said.exit_code == 2, said.output
    assert said.output.count("Error") + said.output.count("error:") == 1 and "Traceback" not in said.output
    _torchrun_rank(no_torchrun, 1)
    quiet = _finetune(char_data, tmp_path, *bad)
    assert quiet.exit_code == 2 and quiet.output == ""
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("line", [["--no-such-option", "finetune"], ["no-such-command"]],
                         ids=["option", "command"])
def test_a_top_level_usage_error_is_printed_by_rank_0_alone(no_torchrun, line):
    _torchrun_rank(no_torchrun, 0)
    said = CliRunner().invoke(main, line)
    assert said.exit_code == 2 and said.output.count("Error") == 1, said.output
    _torchrun_rank(no_torchrun, 1)
    quiet = CliRunner().invoke(main, line)
    assert quiet.exit_code == 2 and quiet.output == ""


def test_rank_variables_without_a_rendezvous_still_say_the_error(char_data, tmp_path, no_torchrun):
    """RANK=1 WORLD_SIZE=2 without MASTER_ADDR/PORT is no torchrun launch: no rank 0 exists to speak for it."""
    _torchrun_rank(no_torchrun, 1, rendezvous=False)
    result = _finetune(char_data, tmp_path, "--cp", "3")
    assert result.exit_code == 2
    assert result.output.count("genolc: error:") == 1 and "--cp 3 does not divide the 2 processes" in result.output


def test_an_error_one_rank_can_meet_alone_is_said_by_that_rank(char_data, tmp_path, no_torchrun):
    """No CUDA device on this rank's node: the other ranks may have one, so rank 1 must say it."""
    _torchrun_rank(no_torchrun, 1)
    result = _finetune(char_data, tmp_path, "--device", "cuda")
    assert result.exit_code == 2
    assert result.output.count("genolc: error:") == 1 and "no CUDA device is visible" in result.output


@pytest.mark.slow
def test_torchrun_prints_a_shared_option_error_once(char_data, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "genolc.cli", "finetune", "--data", str(char_data), "--out", str(tmp_path / "run"),
                           "--cp", "3", *ARGS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stderr.count("genolc: error:") == 1, done.stderr[-4000:]
