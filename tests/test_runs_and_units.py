"""Run records, atomic outputs and length parsing: the small pieces every command stands on."""

from __future__ import annotations

import json
import os
import stat

import pytest

from genolc.errors import ConfigError, InputError, RefusedOutputError
from genolc.fsutil import OUTPUT_MARKER, atomic_dir, atomic_write_json, file_md5, output_dir, output_kind
from genolc.runs import run_record
from genolc.units import format_length, parse_length


@pytest.mark.parametrize(
    "text,tokens",
    [("512k", 524288), ("1M", 1048576), ("1m", 1048576), ("524288", 524288), (" 64K ", 65536), ("0.5k", 512), (7, 7)],
)
def test_parse_length_accepts_the_documented_forms(text, tokens):
    assert parse_length(text) == tokens


@pytest.mark.parametrize("text", ["", "abc", "1.5", "-4k", "0", "12 kb", "1e6"])
def test_parse_length_rejects_with_a_config_error(text):
    with pytest.raises(ConfigError):
        parse_length(text)


def test_format_length_inverts_parse_length():
    for tokens in (1024, 524288, 1048576, 1000, 3 * 1024 * 1024):
        assert parse_length(format_length(tokens)) == tokens


def test_run_record_written_on_success_with_inputs_and_status(tmp_path):
    src = tmp_path / "input.txt"
    src.write_text("ACGT\n")
    out = tmp_path / "out"
    with run_record("prepare", out, {"seq": 512, "path": src}) as rec:
        rec.add_input(src)
        out.mkdir()
    records = list((out / "runs").glob("*_prepare.json"))
    assert len(records) == 1
    data = json.loads(records[0].read_text())
    assert data["status"] == "ok" and data["error"] is None
    assert data["args"] == {"seq": 512, "path": str(src)}
    assert data["inputs"] == {str(src.resolve()): file_md5(src)}
    assert data["command"] == "prepare" and data["genolc_version"]
    assert data["started"] <= data["ended"]


def test_run_record_keeps_the_error_of_a_failed_command(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError):
        with run_record("eval", out, {}):
            raise InputError("bad checkpoint", where="x.safetensors", fix="pass a genolc checkpoint")
    (record,) = (out / "runs").glob("*_eval.json")
    data = json.loads(record.read_text())
    assert data["status"] == "failed"
    assert data["error"] == "bad checkpoint (x.safetensors). pass a genolc checkpoint."


def test_failed_command_without_output_leaves_nothing_behind(tmp_path):
    out = tmp_path / "never-made"
    with pytest.raises(InputError):
        with run_record("prepare", out, {}):
            raise InputError("missing genome")
    assert not out.exists()


def test_two_records_in_the_same_second_do_not_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for _ in range(3):
        with run_record("prepare", out, {}):
            pass
    assert len(list((out / "runs").glob("*_prepare.json"))) == 3


def test_atomic_dir_leaves_no_trace_on_failure_and_replaces_on_success(tmp_path):
    final = tmp_path / "dataset"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("killed")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    with atomic_dir(final) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == [OUTPUT_MARKER, "b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


def test_atomic_dir_replaces_only_genolc_output_of_its_own_kind(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("important")
    with pytest.raises(RefusedOutputError, match=r"holds files genolc did not write \(notes.txt\)") as refused:
        with atomic_dir(mine, "evaluation output directory"):
            pytest.fail("the block must not run")
    assert str(mine) in refused.value.message and "choose a new or empty directory" in refused.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and (mine / "notes.txt").read_text() == "important"

    dataset = tmp_path / "dataset"
    with atomic_dir(dataset, "dataset directory") as tmp:
        (tmp / "manifest.json").write_text("{}")
    assert output_kind(dataset) == "dataset directory"
    with pytest.raises(RefusedOutputError, match="holds a genolc dataset directory"):
        with atomic_dir(dataset, "evaluation output directory"):
            pass
    with atomic_dir(dataset, "dataset directory") as tmp:
        (tmp / "manifest.json").write_text('{"again": 1}')
    assert json.loads((dataset / "manifest.json").read_text()) == {"again": 1}

    # written before outputs carried the marker: recognised by what the caller names
    older = tmp_path / "older"
    older.mkdir()
    (older / "manifest.json").write_text("{}")
    with atomic_dir(older, "dataset directory", legacy=("manifest.json",)) as tmp:
        (tmp / "manifest.json").write_text("[]")
    assert output_kind(older) == "dataset directory"

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(RefusedOutputError, match="is a file"):
        with atomic_dir(blocker, "checkpoint directory"):
            pass
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("out", [".", "..", "sub/.."])
def test_atomic_dir_never_replaces_the_working_directory(tmp_path, monkeypatch, out):
    work = tmp_path / "work"
    with atomic_dir(work, "evaluation output directory") as tmp:
        (tmp / "summary.json").write_text("{}")
    (work / "sub").mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(RefusedOutputError, match="the current directory or one above it"):
        with atomic_dir(out, "evaluation output directory"):
            pass
    assert sorted(p.name for p in work.iterdir()) == [OUTPUT_MARKER, "sub", "summary.json"]


def test_a_failed_atomic_dir_removes_the_parents_it_created(tmp_path):
    (tmp_path / "existing").mkdir()
    final = tmp_path / "existing" / "new" / "deeper" / "out"
    with pytest.raises(InputError):
        with atomic_dir(final, "dataset directory"):
            raise InputError("bad genome")
    assert list(tmp_path.iterdir()) == [tmp_path / "existing"] and not any((tmp_path / "existing").iterdir())


def test_output_dir_claims_marks_and_cleans_up(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text("my own results")
    with pytest.raises(RefusedOutputError, match=r"refusing to write into it"):
        with output_dir(mine, "run directory"):
            pytest.fail("the block must not run")
    assert [p.name for p in mine.iterdir()] == ["summary.json"]

    run = tmp_path / "new" / "run"
    with pytest.raises(InputError):
        with output_dir(run, "run directory"), run_record("finetune", run, {}):
            assert output_kind(run) == "run directory"
            raise InputError("dataset not found")
    assert not (tmp_path / "new").exists()            # failed before writing results: nothing left

    with pytest.raises(InputError):
        with output_dir(run, "run directory"):
            (run / "metrics.jsonl").write_text("{}\n")
            raise InputError("diverged")
    assert sorted(p.name for p in run.iterdir()) == [OUTPUT_MARKER, "metrics.jsonl"]
    with output_dir(run, "run directory"):            # an earlier run's directory is taken again
        pass
    older = tmp_path / "older"
    (older / "runs").mkdir(parents=True)
    (older / "runs" / "20260101T000000Z_1_finetune.json").write_text("{}")
    with output_dir(older, "run directory", legacy=("runs/*_finetune.json",)):
        pass
    assert output_kind(older) == "run directory"


def test_no_run_record_is_written_into_a_refused_directory(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("important")
    with pytest.raises(RefusedOutputError):
        with run_record("convert", mine, {}), atomic_dir(mine, "checkpoint directory"):
            pass
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_atomic_write_json_round_trips(tmp_path):
    target = tmp_path / "sub" / "m.json"
    atomic_write_json(target, {"a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2]}
    assert [p.name for p in target.parent.iterdir()] == ["m.json"]


def test_error_message_has_what_where_fix():
    err = InputError("file not found", where="/x/y.fa", fix="check the path")
    assert err.message == "file not found (/x/y.fa). check the path."


def test_atomic_outputs_get_the_umask_mode_not_the_private_temporary_one(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_dir(tmp_path / "ds") as tmp:
            atomic_write_json(tmp / "manifest.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "ds").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "ds" / "manifest.json").stat().st_mode) == 0o640


def test_a_user_requested_stop_is_recorded_as_interrupted(tmp_path):
    class Stopped(InputError):
        run_status = "interrupted"

    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(Stopped):
        with run_record("finetune", out, {}):
            raise Stopped("stopped by SIGINT after step 3 of 10")
    (record,) = (out / "runs").glob("*_finetune.json")
    assert json.loads(record.read_text())["status"] == "interrupted"


def test_stop_signals_first_is_noted_second_stops_at_once(capsys):
    import signal

    from genolc.signals import Interrupted, StopSignals

    stop = StopSignals("finishing the current window")
    stop._handle(signal.SIGTERM, None)
    assert stop.received == signal.SIGTERM and stop.name == "SIGTERM"
    assert "SIGTERM received: finishing the current window (send it again" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)
    assert Interrupted("stopped", signal.SIGTERM).exit_code == 143 and Interrupted("stopped").exit_code == 130
    assert Interrupted("stopped").run_status == "interrupted"
