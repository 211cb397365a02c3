"""`genolc demo` end to end in its smallest form, and the bundled sample's provenance."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from genolc.cli import main
from genolc.demo.config import DemoConfig
from genolc.demo.pipeline import demo_plan
from genolc.demo.pipeline import main as demo_main
from genolc.errors import InputError
from genolc.sample import SAMPLE_DIR, sample_files


def test_bundled_sample_matches_its_provenance():
    provenance = (SAMPLE_DIR / "PROVENANCE.md").read_text()
    total = 0
    for path in sample_files():
        total += path.stat().st_size
        row = next(line for line in provenance.splitlines() if line.startswith(f"| {path.name} |"))
        seq_md5, file_md5 = re.findall(r"\b[0-9a-f]{32}\b", row)
        with gzip.open(path, "rt") as fh:
            header, *lines = fh.read().splitlines()
        sequence = "".join(lines)
        assert hashlib.md5(sequence.upper().encode()).hexdigest() == seq_md5
        assert hashlib.md5(path.read_bytes()).hexdigest() == file_md5
        first, last = map(int, header.split(":")[1].split("-"))
        assert len(sequence) == last - first + 1
    assert total < 1.5e6


@pytest.fixture(scope="module")
def smoke_demo(tmp_path_factory):
    """`genolc demo --smoke` run once from another directory (its output lands under the working directory)."""
    root = tmp_path_factory.mktemp("demo")
    elsewhere = root / "somewhere"
    elsewhere.mkdir()
    here = Path.cwd()
    os.chdir(elsewhere)
    try:
        result = CliRunner().invoke(main, ["demo", "--smoke", "--no-progress"])
    finally:
        os.chdir(here)
    assert result.exit_code == 0, result.output
    return elsewhere / "genolc-demo", result


@pytest.fixture
def earlier_demo(smoke_demo, tmp_path):
    """A copy of the smoke demo's output, for a test to re-run the demo into."""
    return Path(shutil.copytree(smoke_demo[0], tmp_path / "demo", symlinks=True))


def _stage_contents(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the stage folders and the demo's state, with its bytes and modification time."""
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(out.rglob("*")) if p.is_file() and p.relative_to(out).parts[0] in
            ("init", "run", "eval", "report", "genolc-demo.json")}


def _failing_finetune(config, *args, **kwargs):
    (config.out / "checkpoints").mkdir(parents=True)
    (config.out / "checkpoints" / "partial").write_text("half-written")
    raise InputError("the disk is full", where=str(config.out), fix="free some space")


def test_demo_smoke_end_to_end(smoke_demo, tmp_path):
    out, result = smoke_demo
    report = out / "report"
    assert f"report: {report}" in result.output
    # bucket, tokens, then model, baseline (the untrained initialisation) and context-control bits/base
    assert re.search(r"^\[128,256\]\s+258(\s+\d\.\d{4}){3}\s", result.output, re.M), result.output
    assert re.search(r"^- model - baseline: -\d\.\d{4} bits/base", result.output, re.M), result.output
    for name in ("README.md", "by_position.png", "buckets.csv", "comparisons.csv", "eval_summary.json",
                 "train_metrics.jsonl", "train_summary.json", "commands.sh"):
        assert (report / name).stat().st_size > 0, name
    assert (report / "by_position.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = {p.name.rsplit("_", 1)[1]: json.loads(p.read_text()) for p in (report / "runs").glob("*.json")}
    assert sorted(records) == ["demo.json", "eval.json", "finetune.json", "prepare.json"]
    assert records["demo.json"]["copy_of"] == str(next((out / "runs").glob("*_demo.json")))
    for content in records.values():
        assert content["status"] == "ok"
        assert not any("shared" in Path(p).parts for p in content["inputs"]), content["inputs"]
    assert sorted(records["demo.json"]["inputs"]) == sorted(str(p) for p in sample_files())
    summary = json.loads((report / "eval_summary.json").read_text())
    assert summary["records"] == ["chr22"] and summary["windows"]["scored"] == 2
    assert {r["series"] for r in summary["bucket_stats"]} == {"model", "baseline", "context:32"}
    assert summary["config"]["baseline"] == str(out / "init")
    assert json.loads((report / "train_summary.json").read_text())["config"]["init"] == str(out / "init")
    gain = next(r for r in summary["comparisons"] if r["comparison"] == "model - baseline" and r["bucket"] == "all"
                and r["subset"] == "all")
    assert "model - baseline" in (report / "README.md").read_text() and gain["delta_bits_per_base"] < 0
    commands = (report / "commands.sh").read_text()
    assert "-m genolc.demo init" in commands and "--baseline" in commands
    assert "genolc finetune" in commands and "--steps 2" in commands and "--context 32" in commands
    assert len(list((out / "run" / "checkpoints").iterdir())) >= 1
    # the commands reproduce the evaluation: same seed, same windows; values agree up to float reduction order,
    # since the replay's process may use another number of CPU threads than this test's
    rerun = tmp_path / "rerun"
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(["sh", str(report / "commands.sh"), str(rerun)], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    first = pd.read_csv(report / "buckets.csv")
    second = pd.read_csv(rerun / "eval" / "buckets.csv")
    pd.testing.assert_frame_equal(first, second, check_exact=False, rtol=1e-3, atol=1e-4)
    # a second run reuses the directory (prepare is a no-op) and starts the run afresh
    out = Path(shutil.copytree(out, tmp_path / "again", symlinks=True))
    again = CliRunner().invoke(main, ["demo", "--smoke", "--no-progress", "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert json.loads((out / "report" / "train_summary.json").read_text())["resumed_from_step"] == 0
    assert not (out / ".demo-previous").exists()
    assert len(list((out / "run" / "runs").glob("*.json"))) == 1
    assert len(list((out / "report" / "runs").glob("*_demo.json"))) == 1


def test_demo_rerun_refuses_stage_folders_holding_user_files(earlier_demo):
    (earlier_demo / "run" / "notes.txt").write_text("my notes")
    (earlier_demo / "report" / "mine").mkdir()
    (earlier_demo / "report" / "mine" / "table.csv").write_text("a,b")
    before = _stage_contents(earlier_demo)
    result = CliRunner().invoke(main, ["demo", "--smoke", "--no-progress", "--out", str(earlier_demo)])
    assert result.exit_code == 2, result.output
    assert result.output.count("error:") == 1
    assert ("the demo directory holds files the demo did not write (run/notes.txt, report/mine/table.csv) where it "
            f"rebuilds init/, run/, eval/, report/ on every run; refusing to run ({earlier_demo})") in result.output
    assert "move those files out of the demo directory, or choose another --out" in result.output
    assert _stage_contents(earlier_demo) == before
    assert not (earlier_demo / ".demo-previous").exists()


def test_demo_rerun_refuses_stage_folders_of_a_demo_that_did_not_list_its_files(earlier_demo):
    state = json.loads((earlier_demo / "genolc-demo.json").read_text())
    (earlier_demo / "genolc-demo.json").write_text(json.dumps({"plan": state["plan"], "seed": state["seed"]}))
    before = _stage_contents(earlier_demo)
    result = CliRunner().invoke(main, ["demo", "--smoke", "--no-progress", "--out", str(earlier_demo)])
    assert result.exit_code == 2, result.output
    assert "init/, run/, eval/, report/ come from an earlier genolc demo that did not list" in result.output
    assert _stage_contents(earlier_demo) == before


def test_demo_rerun_that_fails_keeps_the_earlier_output(earlier_demo, monkeypatch):
    before = _stage_contents(earlier_demo)
    monkeypatch.setattr("genolc.train.loop.finetune", _failing_finetune)
    result = CliRunner().invoke(main, ["demo", "--smoke", "--no-progress", "--out", str(earlier_demo)])
    assert result.exit_code == 2, result.output
    assert "the disk is full" in result.output
    assert "the earlier demo's init/, run/, eval/, report/ are back" in result.output
    assert _stage_contents(earlier_demo) == before
    assert not (earlier_demo / ".demo-previous").exists()
    failed = json.loads(max((earlier_demo / "runs").glob("*_demo.json")).read_text())
    assert failed["status"] == "failed" and "the disk is full" in failed["error"]


def test_demo_rerun_after_one_killed_halfway_puts_the_earlier_output_back(earlier_demo, monkeypatch):
    from genolc.demo.pipeline import _set_aside, demo_plan

    before = _stage_contents(earlier_demo)
    # A re-run killed outright (no clean-up) while fine-tuning: earlier stages set aside, init/ and run/ half new.
    _set_aside(earlier_demo, demo_plan(DemoConfig(smoke=True)), 0)
    for stage in ("init", "run"):
        (earlier_demo / stage).mkdir()
        (earlier_demo / stage / "partial").write_text("half-written")
    monkeypatch.setattr("genolc.train.loop.finetune", _failing_finetune)
    result = CliRunner().invoke(main, ["demo", "--smoke", "--no-progress", "--out", str(earlier_demo)])
    assert result.exit_code == 2, result.output
    assert "stopped before it finished" in result.output and "the disk is full" in result.output
    assert _stage_contents(earlier_demo) == before
    assert not (earlier_demo / ".demo-previous").exists()


def test_demo_first_run_that_fails_keeps_its_output_for_the_next(tmp_path, monkeypatch):
    out = tmp_path / "demo"
    monkeypatch.setattr("genolc.train.loop.finetune", _failing_finetune)
    for attempt in range(2):
        result = CliRunner().invoke(main, ["demo", "--smoke", "--no-progress", "--out", str(out)])
        assert result.exit_code == 2 and "the disk is full" in result.output, result.output
        assert (out / "run" / "checkpoints" / "partial").is_file() and (out / "init" / "config.json").is_file()
        state = json.loads((out / "genolc-demo.json").read_text())
        assert state["status"] == "failed" and "checkpoints/partial" in state["stages"]["run"]


def test_runs_ls_and_show_on_a_demo_directory(smoke_demo):
    out = smoke_demo[0]
    listed = CliRunner().invoke(main, ["runs", "ls", str(out)])
    assert listed.exit_code == 0, listed.output
    rows = [line.split() for line in listed.output.splitlines()[1:]]
    assert sorted((row[0], row[-1]) for row in rows) == [
        ("demo", str(out)), ("eval", str(out / "eval")), ("finetune", str(out / "run")), ("prepare", str(out / "data"))]
    shown = CliRunner().invoke(main, ["runs", "show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"^command:\s+demo$", shown.output, re.M) and re.search(r"^status:\s+ok$", shown.output, re.M)
    assert f"  run: {out / 'run'}" in shown.output
    assert f"runs of the outputs under {out} (`genolc runs ls {out}` lists them" in shown.output
    assert shown.output.endswith("".join(f"  {out / stage}\n" for stage in ("data", "eval", "run")))


def test_init_command_reports_a_missing_dataset(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        demo_main(["init", "--data", str(tmp_path / "absent"), "--out", str(tmp_path / "init")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("python -m genolc.demo: error:") and "absent" in err
    assert not (tmp_path / "init").exists()


def test_demo_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["demo", "--smoke", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "demo directory already holds files genolc did not write (mine.txt)" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_demo_refuses_cuda_without_a_device_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr("genolc.demo.pipeline._cuda_available", lambda: False)
    result = CliRunner().invoke(main, ["demo", "--device", "cuda", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "no CUDA device is visible" in result.output
    assert not (tmp_path / "out").exists()


def test_demo_plan_sizes(monkeypatch):
    monkeypatch.setattr("genolc.demo.pipeline._cuda_available", lambda: False)
    cpu = demo_plan(DemoConfig())
    assert (cpu.model, cpu.device, cpu.eval_seq, cpu.first_bucket) == ("tiny", "cpu", 2048, 256)
    assert demo_plan(DemoConfig(seq=1024, steps=5)).contexts == (128,)
    assert demo_plan(DemoConfig(seq=100)).contexts == (25,)
    gpu = demo_plan(DemoConfig(device="cuda"))
    assert gpu.model == "small" and gpu.train_seq > cpu.train_seq
