"""`genolc finetune` on the command line: a short happy path, and one clear error (exit 2) per bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import shared_file

from genolc.cli import main
from genolc.data.prepare import PrepareConfig, prepare
from genolc.train import step_plans
from genolc.train.config import TrainConfig
from genolc.train.loop import TrainHooks, finetune
from genolc.train.plan import OutOfMemoryPlanError

pytestmark = pytest.mark.usefixtures("one_thread")

LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"


@pytest.fixture(scope="module")
def char_data(tmp_path_factory) -> Path:
    return prepare(PrepareConfig(genomes=(shared_file(LAMBDA),), out=tmp_path_factory.mktemp("char") / "ds",
                                 train="all", heldout=(), progress=False))


def _run(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["finetune", "--no-progress", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def _error(*args) -> str:
    code, output = _run(*args)
    assert code == 2, output
    assert output.count("genolc: error:") == 1 and "Traceback" not in output
    return output


def test_cli_trains_and_prints_the_checkpoint(char_data, tmp_path):
    code, output = _run("--data", char_data, "--seq", "64", "--steps", "2", "--out", tmp_path / "run",
                        "--lr", "1e-3", "--warmup", "1")
    assert code == 0, output
    assert str(tmp_path / "run" / "checkpoints" / "step-000002") in output.splitlines()
    assert (tmp_path / "run" / "summary.json").is_file()
    # --stream-dtype auto on CPU (fp32, no autocast) keeps the streams in fp32: no transform applied.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stream_dtype"] == "float32" and not any(t.startswith("streams") for t in summary["transforms"])
    # Running again into the same --out without --resume would mix two runs.
    assert "pass --resume" in _error("--data", char_data, "--seq", "64", "--steps", "2", "--out", tmp_path / "run")
    # Resuming with a setting that changes what steps compute is refused, naming it.
    out = _error("--data", char_data, "--seq", "64", "--steps", "2", "--out", tmp_path / "run", "--lr", "5e-3",
                 "--warmup", "1", "--resume")
    assert "lr: saved 0.001, now 0.005" in out


def test_warmup_not_shorter_than_the_run_is_one_warning_not_an_error(char_data, tmp_path):
    result = CliRunner().invoke(main, ["finetune", "--no-progress", "--data", str(char_data), "--seq", "64",
                                       "--steps", "2", "--warmup", "2", "--lr", "1e-3", "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("step-000002")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("genolc: warning:")]
    assert warnings == ["genolc: warning: --warmup 2 >= --steps 2: every step is a warm-up step, so the learning "
                        "rate only ramps up (to 0.001 at the last step; --lr 0.001) and never decays"]
    # --init takes that run directory as its newest checkpoint, says which, and warns of nothing at --warmup 1.
    result = CliRunner().invoke(main, ["finetune", "--no-progress", "--data", str(char_data), "--seq", "64",
                                       "--steps", "2", "--warmup", "1", "--init", str(tmp_path / "run"),
                                       "--out", str(tmp_path / "from_run")])
    assert result.exit_code == 0, result.output
    newest = tmp_path / "run" / "checkpoints" / "step-000002"
    assert result.stderr.splitlines()[0] == f"genolc: --init {tmp_path / 'run'}: using the run's newest checkpoint " \
                                            f"{newest}"
    assert "warning" not in result.stderr
    (tmp_path / "crashed" / "checkpoints").mkdir(parents=True)
    out = _error("--data", char_data, "--seq", "64", "--init", tmp_path / "crashed", "--out", tmp_path / "never")
    assert "--init: this finetune run directory has no complete checkpoint" in out
    assert not (tmp_path / "never").exists()


def test_resume_on_a_finished_run_or_another_tokenizer_says_what_to_do(char_data, tmp_path):
    run = ("--seq", "64", "--out", tmp_path / "run", "--lr", "1e-3", "--warmup", "1")
    assert _run("--data", char_data, "--steps", "2", *run)[0] == 0
    code, output = _run("--data", char_data, "--steps", "2", *run, "--resume")
    assert code == 0 and "already at step 2" in output and "raise --steps" in output
    kmer_data = prepare(PrepareConfig(genomes=(shared_file(LAMBDA),), out=tmp_path / "kmer", train="all",
                                      heldout=(), tokenizer="kmer:2", progress=False))
    out = _error("--data", kmer_data, "--steps", "3", *run, "--resume")
    # The advice is to resume on the run's own dataset, not to start from a preset (which --resume cannot do).
    assert "different tokenizer" in out and f"--data {char_data}" in out and "--model" not in out


def test_dataset_missing(tmp_path):
    out = _error("--data", tmp_path / "nope", "--seq", "64", "--out", tmp_path / "run")
    assert "prepared dataset not found" in out and "genolc prepare" in out
    assert not (tmp_path / "run").exists()


def test_dataset_tokenizer_differs_from_checkpoint(char_data, tmp_path):
    from genolc.model.checkpoint import save_pretrained
    from genolc.model.model import build_model
    from genolc.model.presets import preset
    from genolc.tokenize import make_tokenizer

    kmer_data = prepare(PrepareConfig(genomes=(shared_file(LAMBDA),), out=tmp_path / "kmer", train="all",
                                      heldout=(), tokenizer="kmer:2", progress=False))
    char = make_tokenizer("char")
    save_pretrained(build_model(preset("tiny", vocab_size=char.vocab_size)), tmp_path / "ckpt", tokenizer=char)
    out = _error("--data", kmer_data, "--seq", "64", "--init", tmp_path / "ckpt", "--out", tmp_path / "run")
    assert "different tokenizer" in out and "kmer" in out


def test_seq_longer_than_every_training_chromosome(char_data, tmp_path):
    out = _error("--data", char_data, "--seq", "64k", "--out", tmp_path / "run")
    assert "longer than every training chromosome" in out and "48502 tokens" in out and "--seq 48501" in out


def test_seq_not_a_multiple_of_the_kernel_chunk(char_data, tmp_path, monkeypatch):
    # On CUDA the KDA kernels need 64-token multiples; the CPU reference takes any length. Simulate the CUDA rule.
    import genolc.train.plan as plan

    monkeypatch.setattr(plan, "required_seq_multiple", lambda device_type: 64)
    out = _error("--data", char_data, "--seq", "100", "--out", tmp_path / "run")
    assert "not a multiple of 64" in out and "use 128 or 64" in out


def test_out_is_a_file_and_options_named_in_errors(char_data, tmp_path):
    (tmp_path / "a-file").write_text("x")
    assert "run directory is a file, not a directory" in _error("--data", char_data, "--seq", "64", "--out",
                                                                 tmp_path / "a-file")
    assert "(--warmup)" in _error("--data", char_data, "--seq", "64", "--warmup", "-1", "--out", tmp_path / "run")
    assert "(--moe-bias-rate)" in _error("--data", char_data, "--seq", "64", "--moe-bias-rate", "-1e-3", "--out",
                                         tmp_path / "run")
    assert "(--keep)" in _error("--data", char_data, "--seq", "64", "--keep", "0", "--out", tmp_path / "run")


def test_out_holding_other_files_is_refused_and_a_failed_start_leaves_nothing(char_data, tmp_path, monkeypatch):
    mine = tmp_path / "d"
    mine.mkdir()
    (mine / "summary.json").write_text("my results")
    for out in (mine, "."):
        monkeypatch.chdir(mine if out == "." else tmp_path)
        message = _error("--data", char_data, "--seq", "64", "--steps", "1", "--out", out)
        assert "run directory already holds files genolc did not write (summary.json)" in message
        assert str(mine) in message and "refusing to write into it" in message
        assert [p.name for p in mine.iterdir()] == ["summary.json"]
        assert (mine / "summary.json").read_text() == "my results"
    # A run that fails before writing results leaves no directory behind (nor the parents it created).
    message = _error("--data", char_data, "--seq", "64", "--init", tmp_path / "nowhere",
                     "--out", tmp_path / "new" / "run")
    assert "nowhere" in message and not (tmp_path / "new").exists()


def test_model_and_init_together(char_data, tmp_path):
    assert "--model and --init" in _error("--data", char_data, "--seq", "64", "--model", "tiny", "--init",
                                          tmp_path, "--out", tmp_path / "run")


def test_out_of_memory_names_the_estimate_and_an_option(char_data, tmp_path):
    def oom(step, micro, loss):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    cfg = TrainConfig(data=char_data, out=tmp_path / "run", seq_len=64, steps=3, progress=False)
    with pytest.raises(OutOfMemoryPlanError) as info:
        finetune(cfg, TrainHooks(on_loss=oom))
    message = info.value.message
    assert "out of device memory at --seq 64: estimated" in message and "GiB" in message
    assert "try --recompute" in message and "step 1" in message


def test_a_window_that_does_not_fit_is_refused_before_the_first_step_on_cpu(char_data, tmp_path, monkeypatch):
    """On every device the plan is checked before any step: --chunk off with a window estimated beyond the memory
    available is one clear error naming the estimate and an option that fits (here the chunked step), with no step
    run; --chunk auto takes that option itself, says so, and trains."""
    monkeypatch.setattr(step_plans, "device_budget_bytes", lambda device: 200 * 2**20)
    out = _error("--data", char_data, "--seq", "4096", "--steps", "1", "--chunk", "off", "--out", tmp_path / "off")
    assert "out of device memory at --seq 4k: estimated 1" in out and "on a 0.2 GiB device" in out
    assert "try --chunk 512 (estimated to fit)" in out
    assert not (tmp_path / "off" / "metrics.jsonl").exists()

    code, output = _run("--data", char_data, "--seq", "4096", "--steps", "1", "--lr", "1e-3", "--warmup", "1",
                        "--out", tmp_path / "auto")
    assert code == 0, output
    assert "--seq 4k: chunked step, --chunk" in output and "choose with --chunk" in output
    metrics = (tmp_path / "auto" / "metrics.jsonl").read_text()
    assert '"step_strategy": "chunked"' in metrics


def test_chunk_option_spellings(char_data, tmp_path):
    from genolc.train.command import parse_chunk

    assert parse_chunk("auto") is None and parse_chunk("off") == 0 and parse_chunk("64k") == 65536
    assert "--chunk" in _error("--data", char_data, "--seq", "64", "--chunk", "lots", "--out", tmp_path / "r")
    # A chunk that covers the window is the whole-window step.
    code, output = _run("--data", char_data, "--seq", "64", "--steps", "1", "--chunk", "1k", "--out", tmp_path / "w",
                        "--lr", "1e-3", "--warmup", "1")
    assert code == 0 and "whole-window step" in output and "covers the window" in output, output


def test_a_strategy_that_adds_recompute_gets_it_applied(char_data, tmp_path, monkeypatch):
    """--chunk auto on a GPU may add per-layer recompute (genolc.train.strategy); the trainer then wraps the layers
    itself and records it, though --recompute was not given. Forced here on the CPU through the chooser."""
    import dataclasses
    import json

    from genolc.train import strategy as strategy_module

    def with_recompute(*args, **kwargs):
        return dataclasses.replace(strategy_module.choose_strategy(*args, **kwargs), chunk=32, recompute=True,
                                   reason="test")

    monkeypatch.setattr(step_plans, "choose_strategy", with_recompute)
    code, output = _run("--data", char_data, "--seq", "64", "--steps", "1", "--lr", "1e-3", "--warmup", "1",
                        "--out", tmp_path / "rc")
    assert code == 0, output
    assert "--chunk 32 with per-layer recompute" in output
    summary = json.loads((tmp_path / "rc" / "summary.json").read_text())
    assert any(t.startswith("recompute(") for t in summary["transforms"]), summary["transforms"]


def test_a_tight_cpu_plan_has_freed_tensors_returned_to_the_system(char_data, tmp_path, monkeypatch):
    """genolc/hostmem.py: when the plan times glibc's measured heap overhead would not fit the free memory, the
    trainer fixes glibc's mmap threshold (a stand-in here, so the test process's malloc is untouched), says so and
    records it; with room to spare it leaves malloc alone (the fix makes steps slower)."""
    import json

    from genolc import hostmem

    calls = []
    monkeypatch.setattr(hostmem, "return_large_frees_to_the_system", lambda: calls.append(1) or True)
    code, output = _run("--data", char_data, "--seq", "64", "--steps", "1", "--warmup", "1", "--out", tmp_path / "a")
    assert code == 0, output
    assert calls == [] and json.loads((tmp_path / "a" / "summary.json").read_text())["malloc_mmap_threshold"] is None
    monkeypatch.setattr(hostmem, "HEAP_OVERHEAD", 1e9)
    code, output = _run("--data", char_data, "--seq", "64", "--steps", "2", "--warmup", "1", "--out", tmp_path / "b")
    assert code == 0, output
    assert calls == [1] and "freed tensors of 1 MiB or more go back to the system" in output
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["malloc_mmap_threshold"] == 1 << 20


def test_recompute_added_for_the_longest_length_is_planned_for_the_shorter_ones(char_data, tmp_path, monkeypatch):
    """With --seq-warmup, the longest window is planned first: recompute its strategy adds wraps the layers for every
    length, so the warm-up length's strategy (and its hardware FLOPs) say recompute too."""
    import dataclasses
    import json

    from genolc.train import strategy as strategy_module

    def recompute_for_the_longest(*args, **kwargs):
        chosen = strategy_module.choose_strategy(*args, **kwargs)
        if kwargs["seq_len"] == 64:
            return dataclasses.replace(chosen, chunk=32, recompute=True, reason="test")
        return chosen

    monkeypatch.setattr(step_plans, "choose_strategy", recompute_for_the_longest)
    code, output = _run("--data", char_data, "--seq", "64", "--seq-warmup", "32", "--seq-warmup-steps", "1",
                        "--steps", "2", "--warmup", "1", "--out", tmp_path / "rc")
    assert code == 0, output
    summary = json.loads((tmp_path / "rc" / "summary.json").read_text())
    assert [t for t in summary["transforms"] if t.startswith("recompute(")] == ["recompute(4 layers, for --seq 64)"]
    assert len(summary["step_strategies"]) == 2
    assert all("with per-layer recompute" in s for s in summary["step_strategies"]), summary["step_strategies"]


def test_a_run_from_init_reports_no_preset(char_data, tmp_path):
    """Under --init the model is the checkpoint's: summary.json and the run record show model null, not the preset
    field's default (they said "tiny" for any checkpoint)."""
    first = CliRunner().invoke(main, ["finetune", "--no-progress", "--data", str(char_data), "--seq", "64",
                                      "--steps", "1", "--warmup", "1", "-o", str(tmp_path / "run")])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, ["finetune", "--no-progress", "--data", str(char_data), "--seq", "64",
                                      "--steps", "1", "--warmup", "1", "--init", str(tmp_path / "run"),
                                      "--out", str(tmp_path / "from_run")])
    assert again.exit_code == 0, again.output
    newest = tmp_path / "run" / "checkpoints" / "step-000001"
    summary = json.loads((tmp_path / "from_run" / "summary.json").read_text())["config"]
    assert (summary["model"], summary["init"]) == (None, str(newest))
    records = list((tmp_path / "from_run" / "runs").glob("*.json"))
    assert len(records) == 1
    assert json.loads(records[0].read_text())["args"]["model"] is None
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["config"]["model"] == "tiny"
