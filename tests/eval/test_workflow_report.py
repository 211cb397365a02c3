"""`python -m genolc.eval.report` (the workflow's report rule): one summary.md over real evaluations, inputs checked
before anything is written, and a report directory that is never one holding the user's files."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from eval_helpers import CHR22

from genolc.cli import main
from genolc.eval.report import main as report_main

LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A prepared chr22 dataset and a tiny random model: (root, data, model)."""
    import torch

    from conftest import shared_file
    from genolc.data.dataset import PreparedDataset
    from genolc.model.checkpoint import save_pretrained
    from genolc.model.model import build_model
    from genolc.model.presets import preset

    root = tmp_path_factory.mktemp("workflow_report")
    data = root / "data"
    prepared = CliRunner().invoke(main, ["prepare", str(shared_file(CHR22)), str(shared_file(LAMBDA)), "--train",
                                         "all", "--heldout", "chr22", "--out", str(data), "--no-progress"])
    assert prepared.exit_code == 0, prepared.output
    torch.manual_seed(0)
    save_pretrained(build_model(preset("tiny", vocab_size=PreparedDataset(data).tokenizer.vocab_size)),
                    root / "model", tokenizer=PreparedDataset(data).tokenizer)
    return root, data, root / "model"


def _evaluate(workspace, name: str, windows: int):
    """A by-position evaluation of ``windows`` windows at results/eval/NAME/chr22 as the workflow lays it out."""
    root, data, model = workspace
    out = root / "results" / "eval" / name / "chr22"
    result = CliRunner().invoke(main, ["eval", "--by-position", "chr22", "--data", str(data), "--checkpoint",
                                       str(model), "--seq", "128", "--context", "32", "--max-windows", str(windows),
                                       "--first-bucket", "32", "--bootstrap", "10", "--out", str(out),
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def evaluation(workspace):
    return _evaluate(workspace, "tiny", 1)


def _report(capsys, *args):
    with pytest.raises(SystemExit) as stop:
        report_main([str(a) for a in args])
    captured = capsys.readouterr()
    return stop.value.code, captured.out + captured.err


def test_report_writes_a_summary_and_replaces_its_own(evaluation, tmp_path, capsys):
    out = tmp_path / "report"
    report_main(["--out", str(out), str(evaluation)])
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# genolc workflow report") and "## tiny / chr22" in summary
    assert "context:32 bits/base" in summary and "![by position](tiny_chr22.png)" in summary
    # one window is one block: the comparisons have no interval, and say so instead of failing to format it
    assert "- context:32 - model: " in summary and "(no 95% CI: too few blocks to bootstrap)" in summary
    assert (out / "tiny_chr22.png").read_bytes() == (evaluation / "by_position.png").read_bytes()
    assert capsys.readouterr().out.strip() == str(out / "summary.md")
    report_main(["--out", str(out), str(evaluation)])
    assert sorted(p.name for p in out.iterdir()) == [".genolc-output.json", "summary.md", "tiny_chr22.png"]
    # A report written before outputs carried genolc's marker (its heading and plots only) is replaced too.
    (out / ".genolc-output.json").unlink()
    (out / "old_chr21.png").write_bytes(b"\x89PNG")
    report_main(["--out", str(out), str(evaluation)])
    assert not (out / "old_chr21.png").exists() and (out / ".genolc-output.json").is_file()


def test_report_marks_intervals_from_few_blocks_and_says_why(workspace, tmp_path):
    """Two windows: every bucket lies in 2 bootstrap blocks, so each interval is marked, with one footnote."""
    evaluation = _evaluate(workspace, "two", 2)
    out = tmp_path / "report"
    report_main(["--out", str(out), str(evaluation)])
    lines = (out / "summary.md").read_text().splitlines()
    table = [line for line in lines if line.startswith(("[", "all "))]
    assert len(table) == 4 and all(line.endswith("]*") for line in table)      # [0,32) … [64,128], all
    bullet = next(i for i, line in enumerate(lines) if line.startswith("- context:32 - model: "))
    assert lines[bullet].endswith("*)")
    assert lines[bullet + 1] == ""                                           # a paragraph, not part of the list
    assert lines[bullet + 2].startswith("\\* the interval rests on fewer than 10 bootstrap blocks")


@pytest.mark.parametrize("problem, message", [
    ("missing", "no such directory ({bad})"),
    ("empty", "not an evaluation output directory (no summary.json) ({bad})"),
    ("not json",
     "the evaluation summary cannot be read (Expecting value: line 1 column 1 (char 0)) ({bad}/summary.json)"),
    ("needle", "not the summary of a by-position evaluation (no 'bucket_stats') ({bad}/summary.json)"),
])
def test_report_bad_input_is_one_message_exit_2_and_creates_nothing(evaluation, tmp_path, capsys, problem, message):
    bad = tmp_path / "eval" / problem.replace(" ", "-") / "chr22"
    if problem != "missing":
        bad.mkdir(parents=True)
    if problem == "not json":
        (bad / "summary.json").write_text("")
    if problem == "needle":
        needle = json.loads((evaluation / "summary.json").read_text())
        del needle["bucket_stats"]
        (bad / "summary.json").write_text(json.dumps(needle))
    out = tmp_path / "new" / "report"
    code, output = _report(capsys, "--out", out, evaluation, bad)
    assert code == 2
    needle_hint = " (a --needle evaluation has no per-position table)" if problem == "needle" else ""
    assert output == (f"python -m genolc.eval.report: error: {message.format(bad=bad)}. pass directories written by "
                      f"genolc eval --by-position{needle_hint}.\n")
    assert not (tmp_path / "new").exists()


def test_report_refuses_a_folder_holding_the_user_s_summary(evaluation, tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "summary.md").write_text("# my own summary\n")
    code, output = _report(capsys, "--out", out, evaluation)
    assert code == 2
    assert ("error: the workflow report directory already holds files genolc did not write (summary.md); refusing "
            f"to replace it ({out})") in output
    assert [p.name for p in out.iterdir()] == ["summary.md"]
    assert (out / "summary.md").read_text() == "# my own summary\n"


def test_report_refuses_two_evaluations_whose_plots_would_share_a_name(evaluation, tmp_path, capsys):
    twin = tmp_path / "other" / "tiny" / "chr22"
    shutil.copytree(evaluation, twin)
    code, output = _report(capsys, "--out", tmp_path / "report", evaluation, twin)
    assert code == 2 and "their plots would both be tiny_chr22.png" in output
    assert not (tmp_path / "report").exists()
