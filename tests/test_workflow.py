"""The Snakemake workflow: lint is clean, the config schema rejects bad configs, `.test` runs the whole DAG."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / "workflows"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def _snakemake(workdir: Path, *args: str, timeout: int = 500) -> subprocess.CompletedProcess:
    if not SNAKEMAKE.exists():
        pytest.fail(f"snakemake not installed beside {sys.executable} (pip install -e '.[workflows]')")
    return subprocess.run([str(SNAKEMAKE), "-s", str(WORKFLOW / "Snakefile"), "--directory", str(workdir), *args],
                          capture_output=True, text=True, timeout=timeout)


def _test_dir(tmp_path: Path, edit=None) -> Path:
    work = tmp_path / "wf"
    shutil.copytree(WORKFLOW / ".test" / "config", work / "config")
    if edit is not None:
        path = work / "config" / "config.yaml"
        config = yaml.safe_load(path.read_text())
        edit(config)
        path.write_text(yaml.safe_dump(config))
    return work


def test_lint_is_clean(tmp_path):
    result = _snakemake(_test_dir(tmp_path), "--lint", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations, your workflow is in a good condition" in result.stdout + result.stderr


def test_schema_rejects_a_bad_config(tmp_path):
    def bad(config):
        config["runs"]["tiny-long"]["steps"] = 0

    result = _snakemake(_test_dir(tmp_path, bad), "-n", timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "steps" in output and "minimum" in output, output


def test_cross_references_are_checked_in_one_message(tmp_path):
    def bad(config):
        config["evals"]["tiny-long"]["baseline"] = "no-such-run"
        config["evals"]["tiny-long"]["heldout"] = ["chr21"]
        config["evals"]["tiny-long"]["contexts"] = ["4k"]
        config["runs"]["tiny-short"]["seq"] = "12q"

    result = _snakemake(_test_dir(tmp_path, bad), "-n", timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("invalid workflow config (config/config.yaml):") == 1, output
    for problem in ("evals.tiny-long names unknown baseline 'no-such-run'",
                    "evals.tiny-long.heldout ['chr21'] is not among genome set 'sample'",
                    "evals.tiny-long.contexts 4k must be shorter than its seq 1024",
                    "cannot read runs.tiny-short.seq '12q'"):
        assert problem in output, output
    assert "Traceback" not in output


def test_cross_reference_errors_name_a_configfile_given_on_the_command_line(tmp_path):
    work = _test_dir(tmp_path)
    mine = tmp_path / "my.yaml"
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    config["evals"]["tiny-long"]["baseline"] = "no-such-run"
    mine.write_text(yaml.safe_dump(config))
    # the usage the Snakefile's docstring shows: snakemake's --configfile paths are Path objects, not str
    result = _snakemake(work, "--configfile", str(mine), "-n", timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count(f"invalid workflow config ({mine}, config/config.yaml):") == 1, output
    assert "evals.tiny-long names unknown baseline 'no-such-run'" in output, output
    assert "TypeError" not in output and "Traceback" not in output


def test_dot_test_runs_the_whole_dag_on_cpu(tmp_path):
    work = _test_dir(tmp_path)
    result = _snakemake(work, "--cores", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rule_log in ("prepare/sample.log", "finetune/tiny-short.log", "finetune/tiny-long.log",
                     "eval/tiny-long/chr22.log", "report/report.log"):
        assert (work / "logs" / rule_log).is_file(), rule_log
    assert (work / "results/prepared/sample/manifest.json").is_file()
    assert (work / "results/runs/tiny-long/checkpoints/step-000003/model.safetensors").is_file()
    evaluation = work / "results/eval/tiny-long/chr22"
    for name in ("summary.json", "buckets.csv", "comparisons.csv", "by_position.png"):
        assert (evaluation / name).is_file(), name
    summary = (work / "results/report/summary.md").read_text()
    assert "## tiny-long / chr22" in summary
    assert "baseline bits/base" in summary and "context:128 bits/base" in summary
    assert "model - baseline:" in summary and "context:128 - model:" in summary
    assert (work / "results/report/tiny-long_chr22.png").is_file()
    # nothing left to do: a second invocation is a no-op
    again = _snakemake(work, "--cores", "2", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
