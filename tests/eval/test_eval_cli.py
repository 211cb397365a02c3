"""End-to-end `genolc eval` on the real chr22 piece with tiny randomly initialised models, and its bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from eval_helpers import CHR22

from genolc.cli import main

LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    from conftest import shared_file
    from genolc.data.dataset import PreparedDataset
    from genolc.model.model import build_model
    from genolc.model.presets import preset

    root = tmp_path_factory.mktemp("eval_cli")
    data = root / "data"
    result = CliRunner().invoke(main, ["prepare", str(shared_file(CHR22)), str(shared_file(LAMBDA)), "--train", "all",
                                       "--heldout", "chr22", "--out", str(data), "--no-progress"])
    assert result.exit_code == 0, result.output
    tok = PreparedDataset(data).tokenizer
    ckpts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = root / f"model{seed}"
        build_model(preset("tiny", vocab_size=tok.vocab_size)).save_pretrained(path, tokenizer=tok)
        ckpts.append(path)
    return data, ckpts[0], ckpts[1], root


def _run(args):
    return CliRunner().invoke(main, ["eval", *map(str, args)])


def test_eval_by_position_end_to_end(setup):
    data, model, baseline, root = setup
    out = root / "by_position"
    result = _run(["--by-position", "22", "--data", data, "--checkpoint", model, "--baseline", baseline, "--seq", "256",
                   "--context", "64", "--context-block", "64", "--rc-average", "--max-windows", "2",
                   "--first-bucket", "64", "--bootstrap", "100", "--per-target", "--out", out, "--no-progress"])
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "buckets.csv", "comparisons.csv", "windows.csv", "blocks.csv", "targets.csv.gz",
            "by_position.png", "runs"} <= names
    assert (out / "by_position.png").stat().st_size > 10_000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["windows"]["scored"] == 2 and summary["rc_average"] is True
    assert summary["buckets"]["labels"] == ["[0,64)", "[64,128)", "[128,256]"]
    buckets = pd.read_csv(out / "buckets.csv")
    assert set(buckets["series"]) == {"model", "baseline", "context:64"}
    full = buckets[(buckets["subset"] == "all")]
    assert full["bits_per_base"].notna().all() and (full["ci_low"] <= full["bits_per_base"]).all()
    # random models: around log2(16) = 4 bits per base, far from 0
    assert ((full["bits_per_base"] > 2.5) & (full["bits_per_base"] < 6)).all()
    # no soft-masked bases in this chr22 piece: that subset is reported empty, not NaN
    soft = buckets[buckets["subset"] == "softmasked"]
    assert soft["empty"].all() and soft["bits_per_base"].isna().all()
    cmp = pd.read_csv(out / "comparisons.csv")
    assert set(cmp["comparison"]) == {"model - baseline", "context:64 - model"}
    # (under --rc-average even early buckets differ: their reverse-strand half sees the whole rest of the window)
    shown = cmp[cmp["subset"] == "all"]
    assert shown["delta_bits_per_base"].notna().all() and (shown["ci_low"] <= shown["ci_high"]).all()
    assert cmp.loc[cmp["subset"] == "softmasked", "empty"].all()
    windows = pd.read_csv(out / "windows.csv")
    assert len(windows) == 2 and (windows["chrom_start"] >= 20000001).all()
    assert (windows["chrom_end"] - windows["chrom_start"] + 1 == 257).all()
    targets = pd.read_csv(out / "targets.csv.gz")
    all_row = next(r for r in summary["bucket_stats"] if r["series"] == "model" and r["subset"] == "all"
                   and r["bucket"] == "all")
    assert len(targets) == all_row["tokens"]
    assert targets["position"].max() == 255                      # RC averaging drops each window's last target
    record = json.loads(next((out / "runs").glob("*_eval.json")).read_text())
    assert record["status"] == "ok" and str(out / "summary.json") in record["outputs"]
    # The per-bucket table ends the output, as the demo prints it: one row per bucket and one for all targets.
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("bucket "))
    assert [c.strip() for c in lines[header].split("  ") if c.strip()][:3] == ["bucket", "tokens", "model bits/base"]
    assert "baseline bits/base" in lines[header] and "context:64 bits/base" in lines[header]
    rows = {line.split()[0]: line for line in lines[header + 2:header + 6]}
    assert list(rows) == ["[0,64)", "[64,128)", "[128,256]", "all"]
    for label, line in rows.items():
        model_bits = full.loc[(full["series"] == "model") & (full["bucket"] == label), "bits_per_base"].item()
        assert line.split()[2] == f"{model_bits:.4f}"
    assert any(line.startswith("- model - baseline: ") for line in lines[header + 6:])
    assert lines[-1] == f"wrote {out}"


def test_eval_pooled_heldout_with_max_tokens(setup):
    data, model, _, root = setup
    out = root / "pooled"
    result = _run(["--by-position", "heldout", "--data", data, "--checkpoint", model, "--seq", "256",
                   "--max-tokens", "600", "--bootstrap", "20", "--out", out, "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == ["chr22"] and summary["config"]["records"] == "heldout"
    # 600 tokens hold two whole windows of 257; they are spread over the tiling, not its first two
    assert summary["windows"]["scored"] == 2 and summary["windows"]["tokens"] == 514
    starts = pd.read_csv(out / "windows.csv")["chrom_start"].tolist()
    assert starts[1] - starts[0] > 100_000


def test_eval_needle_end_to_end(setup):
    data, model, _, root = setup
    out = root / "needle"
    result = _run(["--needle", "chr22", "--data", data, "--checkpoint", model, "--seq", "256", "--needle-bases", "16",
                   "--needle-trials", "2", "--needle-distance", "32", "--needle-distance", "200", "--out", out,
                   "--no-progress", "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    assert {"summary.json", "needle.csv", "needle_summary.csv", "needle.png"} <= {p.name for p in out.iterdir()}
    per_d = pd.read_csv(out / "needle_summary.csv")
    assert per_d["distance"].tolist() == [32, 200] and per_d["trials"].tolist() == [2, 2]


@pytest.mark.parametrize("args,message", [
    (["--by-position", "chr21", "--seq", "256"], "not in the dataset"),
    (["--by-position", "NC_001416.1", "--seq", "256"], "train split"),
    (["--by-position", "chr22", "--seq", "2M"], "longer than held-out record"),
    (["--by-position", "chr22", "--needle", "--seq", "256"], "exactly one of"),
    (["--by-position", "chr22", "--context", "300", "--seq", "256"], "--context 300"),
    (["--by-position", "chr22"], "Missing option '--seq'"),
])
def test_eval_bad_input_one_clear_error(setup, args, message):
    data, model, _, root = setup
    out = root / "bad"
    result = _run([*args, "--data", data, "--checkpoint", model, "--out", out, "--no-progress"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()
    if "not in the dataset" in message:
        assert "chr22 (heldout)" in result.output


def test_eval_refuses_a_checkpoint_with_another_tokenizer(setup, tmp_path):
    from genolc.tokenize import make_tokenizer, save_tokenizer

    data, model, _, _ = setup
    other = tmp_path / "kmer_model"
    shutil.copytree(model, other)
    save_tokenizer(make_tokenizer("kmer:2"), other / "tokenizer.json")
    result = _run(["--by-position", "chr22", "--data", data, "--checkpoint", other, "--seq", "256",
                   "--out", tmp_path / "o", "--no-progress"])
    assert result.exit_code == 2 and "tokenizer" in result.output and "differs from the dataset's" in result.output


def test_eval_takes_a_finetune_run_directory_as_its_newest_checkpoint(setup, tmp_path):
    data, model, baseline, _ = setup
    run = tmp_path / "run"
    for step, source in ((1, baseline), (3, model)):
        saved = run / "checkpoints" / f"step-{step:06d}"
        shutil.copytree(source, saved)
        (saved / "trainer_state.json").write_text(json.dumps({"version": 1, "step": step,
                                                               "config": {"data": str(data)}}))
    out = tmp_path / "eval"
    result = _run(["--by-position", "chr22", "--data", data, "--checkpoint", run, "--seq", "256", "--max-windows", "1",
                   "--bootstrap", "20", "--out", out, "--no-progress"])
    assert result.exit_code == 0, result.output
    newest = run / "checkpoints" / "step-000003"
    assert result.stderr.splitlines() == [f"genolc: --checkpoint {run}: using the run's newest checkpoint {newest}"]
    assert json.loads((out / "summary.json").read_text())["config"]["checkpoint"] == str(newest)

    empty = tmp_path / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    result = _run(["--by-position", "chr22", "--data", data, "--checkpoint", model, "--baseline", empty, "--seq",
                   "256", "--out", tmp_path / "never", "--no-progress"])
    assert result.exit_code == 2 and result.output.count("genolc: error:") == 1
    assert "--baseline: this finetune run directory has no complete checkpoint" in result.output
    assert not (tmp_path / "never").exists()


def test_needle_progress_bar_counts_every_forward_pass(setup, tmp_path, monkeypatch):
    from genolc.eval import by_position, needle

    class Bar:
        def __init__(self, total):
            self.total, self.n, self.closed = total, 0, False
            bars.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True

    bars = []
    monkeypatch.setattr(by_position, "_progress", lambda total, enabled, *args: Bar(total) if enabled else None)
    # What is counted here is forward passes, not their values: a uniform guess stands in for the 4k-token forwards.
    monkeypatch.setattr(needle, "score_full", lambda scorer, ids: np.full(len(ids) - 1, np.log(0.25)))
    data, model, _, _ = setup
    out = tmp_path / "needle"
    # Default distances at 4k windows: 1k, 2k and the largest that fits, so three forward passes per trial.
    result = _run(["--needle", "--data", data, "--checkpoint", model, "--seq", "4k", "--needle-bases", "16",
                   "--needle-trials", "2", "--bootstrap", "20", "--out", out])
    assert result.exit_code == 0, result.output
    rows = len(pd.read_csv(out / "needle.csv"))
    assert rows == 6 and len(bars) == 1
    assert (bars[0].total, bars[0].n, bars[0].closed) == (rows, rows, True)
