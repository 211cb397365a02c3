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
