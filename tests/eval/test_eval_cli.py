"""End-to-end `genolc eval` on the real chr22 piece with tiny randomly initialised models, and its bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    from genolc.model.checkpoint import save_pretrained
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
        save_pretrained(build_model(preset("tiny", vocab_size=tok.vocab_size)), path, tokenizer=tok)
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
    # Two windows of 257 tokens: every bucket lies in 2 bootstrap blocks, each window's one. Their intervals are
    # written, say so, and are marked where they are printed.
    assert summary["estimator"]["few_blocks_for_ci"] == 10
    assert (full["blocks"] == 2).all() and (shown["blocks"] == 2).all()
    assert all(r["blocks"] == 2 for r in summary["bucket_stats"] + summary["comparisons"] if r["subset"] == "all")
    assert all(line.endswith("]*") for line in rows.values())
    compared = [line for line in lines if line.startswith("- ")]
    assert len(compared) == 2 and all(line.endswith("*)") for line in compared)
    assert lines[-2].startswith("* the interval rests on fewer than 10 bootstrap blocks")
    remedy = ("evaluate more held-out sequence" if summary["windows"]["scored"] == summary["windows"]["tiled"]
              else "score more windows (--max-windows, --max-tokens)")
    assert lines[-2].endswith(f"{remedy} to firm it up")


def test_eval_by_position_over_ten_windows_marks_no_interval(setup):
    data, model, baseline, root = setup
    out = root / "ten_windows"
    result = _run(["--by-position", "22", "--data", data, "--checkpoint", model, "--baseline", baseline, "--seq", "64",
                   "--max-windows", "10", "--first-bucket", "32", "--bootstrap", "20", "--out", out, "--no-progress"])
    assert result.exit_code == 0, result.output
    buckets, cmp = pd.read_csv(out / "buckets.csv"), pd.read_csv(out / "comparisons.csv")
    assert (buckets.loc[buckets["subset"] == "all", "blocks"] == 10).all()
    assert (cmp.loc[cmp["subset"] == "all", "blocks"] == 10).all()
    assert (buckets.loc[buckets["subset"] == "softmasked", "blocks"] == 0).all()
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("bucket "))
    printed = lines[header:]
    assert len([line for line in printed if line.endswith("]")]) == 3        # [0,32), [32,64], all
    assert any(line.startswith("- model - baseline: ") and line.endswith(")") for line in printed)
    assert "*" not in "\n".join(printed)


def test_eval_pooled_heldout_with_max_tokens(setup):
    data, model, _, root = setup
    out = root / "pooled"
    result = _run(["--by-position", "heldout", "--data", data, "--checkpoint", model, "--seq", "256",
                   "--max-tokens", "600", "--bootstrap", "20", "--out", out, "--no-progress", "--threads", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == ["chr22"] and summary["config"]["records"] == "heldout"
    # The thread count asked for is the one used, and both outputs say so (genolc.threads).
    record = json.loads(next((out / "runs").glob("*_eval.json")).read_text())
    assert (summary["threads"], summary["threads_rule"]) == (1, "--threads") == tuple(record["compute"].values())
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
    summary = json.loads((out / "summary.json").read_text())
    assert summary["threads"] >= 1 and summary["threads_rule"]              # chosen by the rule, and why


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


@pytest.mark.parametrize("mode,extra,named", [
    (["--routing"], ["--baseline", "other"], "--baseline (read by --by-position) does not apply to --routing"),
    (["--routing"], ["--seed", "3", "--bootstrap", "10"],
     "--bootstrap (read by --by-position and --needle), --seed (read by --by-position and --needle) do not apply "
     "to --routing"),
    (["--needle"], ["--context", "64", "--per-target"],
     "--context (read by --by-position), --per-target (read by --by-position) do not apply to --needle"),
    (["--needle"], ["--max-tokens", "1k"], "--max-tokens (read by --by-position and --routing)"),
    (["--by-position", "chr22"], ["--needle-trials", "2"], "--needle-trials (read by --needle)"),
    (["--by-position", "chr22"], ["--routing-group", "4k"], "--routing-group (read by --routing)"),
])
def test_eval_refuses_an_option_the_mode_does_not_use(tmp_path, mode, extra, named):
    """An option of another mode is one error naming it, the mode and the mode that reads it, before anything is
    read or written (the inputs here do not even exist)."""
    out = tmp_path / "out"
    result = _run([*mode, *extra, "--data", tmp_path / "data", "--checkpoint", tmp_path / "model", "--seq", "1k",
                   "--out", out])
    assert result.exit_code == 2, result.output
    assert result.output.count("genolc: error:") == 1 and named in result.output
    assert "Traceback" not in result.output and not out.exists()


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


def test_eval_never_replaces_a_directory_genolc_did_not_write(setup, tmp_path, monkeypatch):
    data, model, _, _ = setup
    mine = tmp_path / "d"
    mine.mkdir()
    (mine / "notes.txt").write_text("important\n")
    common = ["--data", data, "--checkpoint", model, "--seq", "256", "--bootstrap", "10", "--no-progress"]
    by_position = ["--by-position", "chr22", "--max-windows", "1"]
    for mode in (by_position, ["--needle", "chr22", "--needle-bases", "16", "--needle-trials", "1"]):
        result = _run([*mode, *common, "--out", mine])
        assert result.exit_code == 2, result.output
        assert result.output.count("genolc: error:") == 1 and "Traceback" not in result.output
        assert "holds files genolc did not write (notes.txt)" in result.output and str(mine) in result.output
        assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "important\n"
    # --out . : the working directory is never replaced, even when it is empty
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = _run([*by_position, *common, "--out", "."])
    assert result.exit_code == 2 and "the current directory" in result.output
    assert not any(work.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["d", "work"]
    # an earlier evaluation's directory is replaced whole, by a new output with its own run record
    own = tmp_path / "own"
    for _ in range(2):
        result = _run([*by_position, *common, "--out", own])
        assert result.exit_code == 0, result.output
    assert (own / "summary.json").is_file() and len(list((own / "runs").glob("*_eval.json"))) == 1


def test_eval_stopped_at_once_writes_nothing(setup, tmp_path, monkeypatch):
    import genolc.eval.by_position as by_position

    data, model, _, _ = setup
    real, calls = by_position.window_data, []

    def second_ctrl_c(dataset, w):
        calls.append(w)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(dataset, w)

    monkeypatch.setattr(by_position, "window_data", second_ctrl_c)
    out = tmp_path / "o"
    result = _run(["--by-position", "chr22", "--data", data, "--checkpoint", model, "--seq", "256",
                   "--max-windows", "3", "--out", out, "--no-progress"])
    assert result.exit_code == 130, result.output
    assert "eval stopped at once (a second Ctrl-C, or one before the first piece of work finished); nothing was " \
           "written" in result.output and "Aborted" not in result.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_ctrl_c_in_eval_keeps_the_windows_scored_and_exits_130(setup, tmp_path):
    data, model, _, _ = setup
    out = tmp_path / "interrupted"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "genolc.cli", "eval", "--by-position", "chr22", "--data", str(data), "--checkpoint",
         str(model), "--seq", "256", "--max-windows", "200", "--bootstrap", "20", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        # As from an interactive shell: a test runner started in the background passes SIGINT on as ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, deadline = b"", time.monotonic() + 240
    try:
        # The progress bar (on stderr) shows the first window done: then Ctrl-C.
        while not re.search(rb"\b[1-9][0-9]*/200\b", seen):
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk and time.monotonic() < deadline, seen.decode(errors="replace")
            seen += chunk
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = (seen + err).decode(errors="replace")
    assert proc.returncode == 130, stderr
    assert "SIGINT received: finishing the current window" in stderr
    message = re.search(r"genolc: error: eval stopped by SIGINT after (\d+) of 200 windows; their results are "
                        r"written, marked interrupted", stderr)
    assert message and "Aborted" not in stderr and "Traceback" not in stderr, stderr
    scored = int(message.group(1))
    assert 1 <= scored < 200
    # The windows scored are printed like a finished run's, headed as interrupted.
    printed = rest.decode()
    assert f"(chr22; INTERRUPTED: {scored} of 200 windows scored):" in printed, printed
    assert "model bits/base" in printed and "wrote" not in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["windows"]["scored"] == scored and summary["windows"]["selected"] == 200
    assert len(pd.read_csv(out / "windows.csv")) == scored and (out / "by_position.png").is_file()
    record = json.loads(next((out / "runs").glob("*_eval.json")).read_text())
    assert record["status"] == "interrupted" and f"after {scored} of 200 windows" in record["error"]
    assert str(out / "summary.json") in record["outputs"]


def test_ctrl_c_in_the_needle_prints_the_trials_done(setup, tmp_path, monkeypatch):
    from genolc.eval import needle

    passes = []

    def uniform_then_ctrl_c(scorer, ids):
        passes.append(len(ids))
        if len(passes) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return np.full(len(ids) - 1, np.log(0.25))

    # A uniform guess stands in for the forwards; the first one is followed by a Ctrl-C, so trial 0 finishes alone.
    monkeypatch.setattr(needle, "score_full", uniform_then_ctrl_c)
    # As in an interactive shell: a test runner started in the background inherits SIGINT as ignored.
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.default_int_handler)
    data, model, _, _ = setup
    out = tmp_path / "needle"
    result = _run(["--needle", "--data", data, "--checkpoint", model, "--seq", "4k", "--needle-bases", "16",
                   "--needle-trials", "3", "--needle-distance", "1k", "--bootstrap", "20", "--out", out,
                   "--no-progress"])
    assert result.exit_code == 130, result.output
    assert result.stdout.splitlines()[0] == "INTERRUPTED: 1 of 3 needle trials done"
    assert result.stdout.splitlines()[1].startswith("D=1024: first copy 2.000, second copy 2.000 bits/base")
    assert "eval stopped by SIGINT after 1 of 3 needle trials" in result.stderr and len(passes) == 1
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


def test_the_few_blocks_note_asks_for_more_sequence_once_every_window_is_scored():
    """--max-windows cannot add blocks when every tiled window was scored: the note then asks for more sequence."""
    from genolc.eval.report import few_blocks_note

    row = {"comparison": "model - baseline", "subset": "all", "bucket": "all", "delta_bits_per_base": -0.01,
           "ci_low": -0.02, "ci_high": 0.0, "blocks": 3}
    summary = {"bucket_stats": [], "comparisons": [row], "windows": {"tiled": 3, "scored": 3}}
    assert few_blocks_note(summary)[0].endswith("evaluate more held-out sequence to firm it up")
    summary["windows"] = {"tiled": 30, "scored": 3}
    assert few_blocks_note(summary)[0].endswith("score more windows (--max-windows, --max-tokens) to firm it up")
    assert few_blocks_note({**summary, "comparisons": [{**row, "blocks": 10}]}) == []
