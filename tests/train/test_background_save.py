"""Checkpoints written in the background (genolc/train/background_save.py): what is written is the state at the save,
whatever training does meanwhile; a failed write surfaces and leaves the previous checkpoint; buffers are reused."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from genolc.train import background_save
from genolc.train import state as st
from genolc.train.background_save import BackgroundCheckpoints, CheckpointWriteError
from tests.train.test_train_state import _setup, _train


def _held_writes(monkeypatch) -> threading.Event:
    """Background writes wait for the returned event before writing anything."""
    release = threading.Event()
    write = background_save.write_snapshot

    def held(*args, **kwargs):
        assert release.wait(timeout=60)
        return write(*args, **kwargs)

    monkeypatch.setattr(background_save, "write_snapshot", held)
    return release


def test_background_checkpoint_holds_the_state_at_the_save(tmp_path, monkeypatch):
    model, opt = _setup()
    _train(model, opt, 2)
    checkpoints = BackgroundCheckpoints(tmp_path, tokenizer=None, keep=2)
    release = _held_writes(monkeypatch)
    path = checkpoints.save(2, model=model, optimizer=opt, trainer_state={"tokens": 7}, background=True)
    assert path.name == "step-000002" and not path.exists() and checkpoints.pending
    assert checkpoints.poll() is None and checkpoints.written is None
    expected = _train(model, opt, 3)            # training goes on while the checkpoint waits to be written
    release.set()
    assert checkpoints.wait() == path and checkpoints.written == path and not checkpoints.pending

    model2, opt2 = _setup(seed=99)
    state = st.load_checkpoint(path, model=model2, optimizer=opt2)
    assert state["step"] == 2 and state["tokens"] == 7
    assert _train(model2, opt2, 3) == expected


def test_failed_background_write_raises_and_keeps_the_previous(tmp_path, monkeypatch):
    model, opt = _setup()
    checkpoints = BackgroundCheckpoints(tmp_path, tokenizer=None, keep=1)
    first = checkpoints.save(1, model=model, optimizer=opt, trainer_state={}, background=False)
    _train(model, opt, 1)

    def boom(name):
        if name == st.OPTIMIZER_STATE:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(st, "after_file_written", boom)
    checkpoints.save(2, model=model, optimizer=opt, trainer_state={}, background=True)
    with pytest.raises(CheckpointWriteError, match="checkpoint of step 2 .No space left on device.; the last complete "
                                                   "checkpoint is .*step-000001"):
        checkpoints.wait()
    assert checkpoints.written == first and not checkpoints.pending
    root = st.checkpoint_root(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]        # no temporary left, step 1 kept
    monkeypatch.setattr(st, "after_file_written", None)
    assert checkpoints.save(3, model=model, optimizer=opt, trainer_state={}, background=False).is_dir()
    assert [s for s, _ in st.list_checkpoints(root)] == [3]


def test_a_save_waits_for_the_one_before_and_reuses_its_buffers(tmp_path, monkeypatch):
    model, opt = _setup()
    _train(model, opt, 1)
    checkpoints = BackgroundCheckpoints(tmp_path, tokenizer=None, keep=2)
    release = _held_writes(monkeypatch)
    checkpoints.save(1, model=model, optimizer=opt, trainer_state={}, background=True)
    first = checkpoints._buffers
    _train(model, opt, 1)
    saver = threading.Thread(target=checkpoints.save, args=(2,),
                             kwargs=dict(model=model, optimizer=opt, trainer_state={}, background=True))
    saver.start()
    saver.join(timeout=0.5)
    assert saver.is_alive()                     # the second save waits for the first write
    release.set()
    saver.join(timeout=60)
    assert checkpoints.wait().name == "step-000002"
    second = checkpoints._buffers
    weight = "0.weight"
    assert second.weights[weight].data_ptr() == first.weights[weight].data_ptr()   # the same host buffer, refilled
    assert torch.equal(second.weights[weight], model.state_dict()[weight])
    moments = second.optimizer["state"][0]["exp_avg"]
    assert moments.data_ptr() == first.optimizer["state"][0]["exp_avg"].data_ptr()
    assert torch.equal(moments, opt.state_dict()["state"][0]["exp_avg"])
    assert [s for s, _ in st.list_checkpoints(st.checkpoint_root(tmp_path))] == [1, 2]


def test_snapshot_copies_everything_off_the_live_state():
    model, opt = _setup()
    _train(model, opt, 1)
    trainer_state = {"samplers": {"64": {"step": 3}}}
    snapshot = st.snapshot_checkpoint(1, model=model, optimizer=opt, trainer_state=trainer_state)
    before = {k: v.clone() for k, v in snapshot.weights.items()}
    lr = snapshot.optimizer["param_groups"][0]["lr"]
    _train(model, opt, 1)
    opt.param_groups[0]["lr"] = 5.0
    trainer_state["samplers"]["64"]["step"] = 9
    assert all(torch.equal(snapshot.weights[k], v) for k, v in before.items())
    assert snapshot.optimizer["param_groups"][0]["lr"] == lr
    assert snapshot.trainer_state["samplers"]["64"]["step"] == 3 and snapshot.trainer_state["step"] == 1


def test_host_room_for_twice_the_buffers():
    model, opt = _setup()
    _train(model, opt, 1)
    nbytes = background_save.snapshot_bytes(model, opt)
    params = list(model.parameters())
    # fp32 weights and AdamW's two moments, and its step count per parameter tensor.
    assert nbytes == 3 * 4 * sum(p.numel() for p in params) + 4 * len(params)
    assert background_save.host_room_for(nbytes, 2 * nbytes) and not background_save.host_room_for(nbytes, nbytes)


def _finetune_cli(tmp_path, steps: int):
    """`genolc finetune` of `tiny` on the sample DNA, a checkpoint every step (two kept): its result and run folder."""
    from click.testing import CliRunner

    from genolc.cli import main as cli
    from genolc.sample import sample_files

    runner = CliRunner()
    data, run = tmp_path / "data", tmp_path / "run"
    prepared = runner.invoke(cli, ["prepare", str(sample_files()[0]), "--out", str(data), "--train", "all",
                                   "--heldout", "none", "--no-progress"])
    assert prepared.exit_code == 0, prepared.output
    return runner.invoke(cli, ["finetune", "--data", str(data), "--model", "tiny", "--seq", "128", "--steps",
                               str(steps), "--checkpoint-every", "1", "--keep", "2", "--out", str(run),
                               "--no-progress", "--threads", "1"]), run


@pytest.mark.parametrize("free_bytes, expected", [(1 << 50, [True, True, False]), (0, [False, False, False])])
def test_trainer_writes_checkpoints_but_the_last_in_the_background(tmp_path, monkeypatch, free_bytes, expected):
    """Where the host has room for the buffers; the last checkpoint, and every one without room, in the foreground."""
    from genolc.train import run_checkpoints

    flags = []
    save = BackgroundCheckpoints.save

    def spy(self, step, **kwargs):
        flags.append(kwargs["background"])
        return save(self, step, **kwargs)

    monkeypatch.setattr(BackgroundCheckpoints, "save", spy)
    monkeypatch.setattr(run_checkpoints, "host_free_bytes_per_process", lambda: free_bytes)
    trained, run = _finetune_cli(tmp_path, steps=3)
    assert trained.exit_code == 0, trained.output
    assert flags == expected
    summary = json.loads((run / "summary.json").read_text())
    assert summary["checkpoints_in_background"] == sum(expected) and summary["checkpoint_seconds"] > 0
    assert [s for s, _ in st.list_checkpoints(st.checkpoint_root(run))] == [2, 3]
    assert not any(p.name.startswith(".") for p in st.checkpoint_root(run).iterdir())


def test_a_failed_background_write_stops_the_run_in_one_line(tmp_path, monkeypatch):
    def full_disk(name):
        if name == st.OPTIMIZER_STATE and threading.current_thread().name == "genolc checkpoint 2":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(st, "after_file_written", full_disk)
    trained, run = _finetune_cli(tmp_path, steps=6)
    assert trained.exit_code == 2, trained.output
    errors = [line for line in trained.output.splitlines() if line.startswith("genolc: error:")]
    assert len(errors) == 1 and "could not write the checkpoint of step 2 (No space left on device)" in errors[0]
    assert "step-000001" in errors[0] and "--resume" in errors[0]
    root = st.checkpoint_root(run)
    assert [s for s, _ in st.list_checkpoints(root)] == [1]
    assert not any(p.name.startswith(".") for p in root.iterdir())


def test_a_stop_waits_for_the_checkpoint_being_written(tmp_path, monkeypatch):
    """A stop right after a background save: the run ends once that checkpoint is whole, and names it."""
    import signal

    from genolc.data.prepare import PrepareConfig, prepare
    from genolc.sample import sample_files
    from genolc.train import loop
    from genolc.train.config import TrainConfig

    data = prepare(PrepareConfig(genomes=(sample_files()[0],), out=tmp_path / "data", train="all", heldout=(),
                                 progress=False))
    release = _held_writes(monkeypatch)

    def ctrl_c_while_writing(self, stop):
        # A Ctrl-C that arrives while the first checkpoint is still being written.
        if self.checkpoints.writer.pending:
            stop.received = signal.SIGINT
        return stop.received is not None

    monkeypatch.setattr(loop._Trainer, "_stop_requested", ctrl_c_while_writing)
    summarised = []
    write_summary = loop._Trainer._write_summary

    def summary_of_whole_checkpoints(self, status, final, losses):
        summarised.append(final is not None and (final / st.TRAINER_STATE).is_file())
        return write_summary(self, status, final, losses)

    monkeypatch.setattr(loop._Trainer, "_write_summary", summary_of_whole_checkpoints)
    threading.Timer(0.5, release.set).start()
    config = TrainConfig(data=data, out=tmp_path / "run", model="tiny", seq_len=128, steps=6, checkpoint_every=2,
                         progress=False)
    with pytest.raises(loop.TrainingInterrupted, match="after step 2 of 6; saved .*step-000002"):
        loop.finetune(config)
    root = st.checkpoint_root(tmp_path / "run")
    assert [s for s, _ in st.list_checkpoints(root)] == [2] and release.is_set()
    assert not any(p.name.startswith(".") for p in root.iterdir())
    assert summarised == [True]             # the summary named a checkpoint already whole
    summary = json.loads((tmp_path / "run" / loop.SUMMARY).read_text())
    assert summary["status"] == "interrupted" and summary["final_checkpoint"].endswith("step-000002")
