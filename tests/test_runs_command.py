"""`genolc runs ls|show|diff` over real finetune runs (successful, failed on bad input, interrupted), and finetune's
per-step routing figures and TensorBoard log."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from click.testing import CliRunner

from conftest import shared_file
from genolc.cli import main
from genolc.data.prepare import PrepareConfig, prepare
from genolc.train.config import TrainConfig
from genolc.train.loop import METRICS, TrainHooks, TrainingInterrupted, finetune

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(data, out, **changes):
    settings = dict(seq_len=64, steps=2, warmup_steps=1, lr=3e-3, progress=False, routing_group=32)
    return TrainConfig(data=data, out=out, **{**settings, **changes})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = prepare(PrepareConfig(genomes=(shared_file("other/lambda_phage_NC_001416.1.fa.gz"),), out=root / "ds",
                                 train="all", heldout=(), progress=False))
    tensorboard = importlib.util.find_spec("tensorboard") is not None
    finetune(_config(data, root / "ok", log=("tensorboard",) if tensorboard else ()))

    def stop(step, metrics):
        raise KeyboardInterrupt
    with pytest.raises(TrainingInterrupted):
        finetune(_config(data, root / "interrupted"), TrainHooks(on_step_end=stop))
    (root / "not-a-dataset").mkdir()
    # A run directory the user made beforehand stays after a failure (a new one is removed), holding the record.
    (root / "failed").mkdir()
    failed = CliRunner().invoke(main, ["finetune", "--data", str(root / "not-a-dataset"), "--seq", "64",
                                       "--steps", "1", "--out", str(root / "failed"), "--no-progress"])
    assert failed.exit_code == 2, failed.output
    manifest = data / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=1))   # same content, another md5
    finetune(_config(data, root / "lower-lr", lr=1e-3))
    return root


def test_runs_ls_lists_successful_failed_and_interrupted_runs(runs):
    result = CliRunner().invoke(main, ["runs", "ls", str(runs)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[-1].rsplit("/", 1)[-1]: line for line in result.output.splitlines()[1:]}
    assert set(rows) == {"ds", "ok", "interrupted", "failed", "lower-lr"}
    assert rows["ds"].split()[:3][::2] == ["prepare", "ok"]
    assert rows["ok"].split()[0] == "finetune" and " ok " in rows["ok"] and "final_loss" in rows["ok"]
    assert " interrupted " in rows["interrupted"] and "steps 1/2" in rows["interrupted"]
    assert " failed " in rows["failed"] and "not a genolc dataset" in rows["failed"]


def test_runs_ls_keeps_an_interrupted_record_s_own_figures_after_a_resume(runs, tmp_path):
    """The interrupted invocation's row shows where it stopped (step, loss, tokens), not the resumed run's summary."""
    out = tmp_path / "resumed"

    def stop(step, metrics):
        raise KeyboardInterrupt
    with pytest.raises(TrainingInterrupted):
        finetune(_config(runs / "ds", out, steps=3, checkpoint_every=1), TrainHooks(on_step_end=stop))
    first = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    finetune(_config(runs / "ds", out, steps=3, checkpoint_every=1, resume=True))
    steps = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    result = CliRunner().invoke(main, ["runs", "ls", str(out)])
    assert result.exit_code == 0, result.output
    interrupted, resumed = result.output.splitlines()[1:]
    assert " interrupted " in interrupted and "steps 1/3" in interrupted
    assert f"final_loss {first[-1]['loss']:.4g}" in interrupted and f"tokens {first[-1]['tokens']}" in interrupted
    assert " ok " in resumed and "steps 3/3" in resumed
    assert f"final_loss {steps[-1]['loss']:.4g}" in resumed and f"tokens {steps[-1]['tokens']}" in resumed
    from genolc.runs_command import find_records

    shown = CliRunner().invoke(main, ["runs", "show", str(find_records(out)[0])])
    assert "figures:  steps 1/3" in shown.output
    # A run that fails before it writes a summary shows none, not the earlier run's.
    failed = CliRunner().invoke(main, ["finetune", "--data", str(runs / "ds"), "--seq", "64", "--steps", "3",
                                       "--resume", "--lr", "1", "--out", str(out), "--no-progress"])
    assert failed.exit_code == 2, failed.output
    last = CliRunner().invoke(main, ["runs", "ls", str(out)]).output.splitlines()[-1]
    assert " failed " in last and "steps" not in last and "final_loss" not in last


def test_runs_show_prints_one_record(runs):
    result = CliRunner().invoke(main, ["runs", "show", str(runs / "failed")])
    assert result.exit_code == 0, result.output
    assert "status:   failed" in result.output and "not a genolc dataset" in result.output
    assert "  seq_len: 64" in result.output


def test_runs_diff_finds_a_changed_config_field_and_a_changed_input_file(runs):
    result = CliRunner().invoke(main, ["runs", "diff", str(runs / "ok"), str(runs / "lower-lr")])
    assert result.exit_code == 0, result.output
    config, inputs = result.output.split("inputs:")
    assert "  lr: A 0.003  B 0.001" in config and "  out: A" in config and "log" in config
    assert "steps" not in config.replace("warmup_steps", "")
    assert "manifest.json: A " in inputs
    same = CliRunner().invoke(main, ["runs", "diff", str(runs / "ok"), str(runs / "ok")])
    assert "same config and inputs" in same.output


def test_runs_refuse_a_directory_without_records(runs):
    result = CliRunner().invoke(main, ["runs", "show", str(runs / "not-a-dataset")])
    assert result.exit_code == 2 and "no run record found" in result.output


def test_runs_show_on_a_folder_of_outputs_names_them(runs):
    result = CliRunner().invoke(main, ["runs", "show", str(runs)])
    assert result.exit_code == 2, result.output
    assert f"no run record of its own; it holds the outputs of other runs ({runs / 'ds'}, {runs / 'failed'}, " \
           in result.output
    assert f"show one with `genolc runs show {runs / 'ds'}`, or list them all with `genolc runs ls {runs}`" \
           in result.output


def test_runs_ls_counts_a_copied_output_s_run_once(runs, tmp_path):
    for name in ("a-copy", "b-copy"):
        shutil.copytree(runs / "ok", tmp_path / name)
    result = CliRunner().invoke(main, ["runs", "ls", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [row] = result.output.splitlines()[1:]
    assert row.split()[0] == "finetune" and row.endswith(str(tmp_path / "a-copy"))


def test_finetune_logs_routing_per_step_and_to_tensorboard(runs):
    lines = [json.loads(line) for line in (runs / "ok" / METRICS).read_text().splitlines()]
    for metrics in lines:
        layers = metrics["routing_busiest_over_mean"]
        assert layers and set(layers) == set(metrics["moe_load_max_over_mean"])
        # The hooks see exactly the tokens the MoE counted (no double count from the backward pass).
        assert layers == pytest.approx(metrics["moe_load_max_over_mean"])
        assert set(metrics["routing_drop_c1"]) == set(layers) and "routing_drop_c2" in metrics
    [record] = (runs / "ok" / "runs").glob("*_finetune.json")
    routing = json.loads(record.read_text())["outputs"]["routing"]
    assert all(figures["tokens"] == 2 * 64 for figures in routing.values())
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [events] = (runs / "ok" / "tensorboard").glob("events.out.tfevents.*")
    board = EventAccumulator(str(events.parent))
    board.Reload()
    tags = board.Tags()["scalars"]
    assert {"loss", "lr", "tokens_per_s", "memory_gib"} <= set(tags)
    assert any(t.startswith("moe_load_max_over_mean/layer_") for t in tags)
    assert [e.value for e in board.Scalars("loss")] == pytest.approx([m["loss"] for m in lines])


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_log_wandb_without_wandb_says_how_to_install_it_and_leaves_nothing(runs):
    result = CliRunner().invoke(main, ["finetune", "--data", str(runs / "ds"), "--seq", "64", "--steps", "1",
                                       "--log", "wandb", "--out", str(runs / "wandb-run"), "--no-progress"])
    assert result.exit_code == 2 and "pip install wandb" in result.output
    assert not (runs / "wandb-run").exists()


def test_a_failing_wandb_init_is_one_clear_error(runs, tmp_path, monkeypatch):
    """wandb.init raising (here a stand-in module: bad settings, no network for online mode) is one message naming
    the wandb folder and the way out, exit 2, no traceback; the new run directory is not left behind."""
    import sys
    import types

    class UsageError(Exception):
        pass

    def init(**kwargs):
        raise UsageError("Invalid project name 'genolc': cannot reach the server\nmore detail")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    out = tmp_path / "wandb-broken"
    result = CliRunner().invoke(main, ["finetune", "--data", str(runs / "ds"), "--seq", "64", "--steps", "1",
                                       "--log", "wandb", "--out", str(out), "--no-progress"])
    assert result.exit_code == 2, result.output + repr(result.exception)
    message = result.output.strip().splitlines()[-1]
    assert message.startswith("genolc: error: --log wandb: wandb.init failed (UsageError: Invalid project name")
    assert "more detail" not in message and "--log tensorboard" in message and "WANDB_" in message
    assert str(out / "wandb") in message and "Traceback" not in result.output
    assert not out.exists()


def test_log_wandb_writes_an_offline_run(runs):
    pytest.importorskip("wandb")
    finetune(_config(runs / "ds", runs / "wandb-ok", log=("wandb",)))
    assert any((runs / "wandb-ok" / "wandb").rglob("*.wandb"))


@pytest.mark.parametrize("changes", [dict(chunk=32), dict(recompute=True)], ids=["chunked", "recompute"])
def test_routing_counts_each_token_once_with_chunks_and_recompute(runs, tmp_path, changes):
    # The chunked step's fill pass runs without grad and recompute replays layers in backward: neither is tallied.
    finetune(_config(runs / "ds", tmp_path / "run", steps=1, **changes))
    [metrics] = [json.loads(line) for line in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert ("chunk" in metrics) == ("chunk" in changes)
    assert metrics["routing_busiest_over_mean"] == pytest.approx(metrics["moe_load_max_over_mean"])
    [record] = (tmp_path / "run" / "runs").glob("*_finetune.json")
    assert all(f["tokens"] == 64 for f in json.loads(record.read_text())["outputs"]["routing"].values())
