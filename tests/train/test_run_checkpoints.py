"""A run's checkpoints on their own (genolc/train/run_checkpoints.py): where a run resumes from, what a save leaves
as the last good checkpoint on each rank, and a failed background write as the run stops."""

from __future__ import annotations

import threading

import pytest

from genolc.errors import ConfigError, InputError
from genolc.tokenize import CharTokenizer, save_tokenizer
from genolc.tokenize.kmer import KmerTokenizer
from genolc.train import background_save
from genolc.train import state as st
from genolc.train.config import TrainConfig
from genolc.train.run_checkpoints import RunCheckpoints, check_checkpoint_tokenizer, find_resume_point
from tests.train.test_train_state import _setup, _train


def _config(tmp_path, **changes) -> TrainConfig:
    return TrainConfig(data=tmp_path / "data", out=tmp_path / "run", seq_len=64, **changes)


def _checkpoints(tmp_path, said: list[str], *, writes: bool = True, barriers: list[int] | None = None,
                 resumed_from=None) -> RunCheckpoints:
    return RunCheckpoints(tmp_path / "run", tokenizer=None, keep=2, writes=writes,
                          barrier=lambda: barriers.append(1) if barriers is not None else None, say=said.append,
                          resumed_from=resumed_from)


def _saved_run(tmp_path, config: TrainConfig, tokenizer=None):
    """A run directory with one checkpoint of step 3, trained with ``config``."""
    model, opt = _setup()
    checkpoints = _checkpoints(tmp_path, [])
    path = checkpoints.save(3, model=model, optimizer=opt, trainer_state=lambda: {"config": config.to_dict()})
    if tokenizer is not None:
        save_tokenizer(tokenizer, path / "tokenizer.json")
    return path


def test_a_fresh_run_has_nothing_to_resume(tmp_path):
    said = []
    root = st.checkpoint_root(tmp_path / "run")
    assert find_resume_point(root, _config(tmp_path), CharTokenizer(), said.append) is None and said == []
    assert find_resume_point(root, _config(tmp_path, resume=True), CharTokenizer(), said.append) is None
    assert len(said) == 1 and "no checkpoint under" in said[0] and "starting from step 0" in said[0]


def test_resume_finds_the_newest_checkpoint_of_the_same_settings(tmp_path):
    saved = _saved_run(tmp_path, _config(tmp_path), CharTokenizer())
    root = st.checkpoint_root(tmp_path / "run")
    assert find_resume_point(root, _config(tmp_path, resume=True), CharTokenizer(), print) == saved


def test_checkpoints_without_resume_are_refused(tmp_path):
    _saved_run(tmp_path, _config(tmp_path))
    with pytest.raises(ConfigError, match="already holds checkpoints") as error:
        find_resume_point(st.checkpoint_root(tmp_path / "run"), _config(tmp_path), CharTokenizer(), print)
    assert "--resume" in error.value.fix


def test_resume_with_other_settings_names_them(tmp_path):
    _saved_run(tmp_path, _config(tmp_path))
    with pytest.raises(ConfigError, match="settings differ") as error:
        find_resume_point(st.checkpoint_root(tmp_path / "run"), _config(tmp_path, resume=True, lr=1e-3),
                          CharTokenizer(), print)
    assert "lr: saved 0.0003, now 0.001" in str(error.value)


def test_resume_on_a_dataset_of_another_tokenizer_names_the_run_dataset(tmp_path):
    _saved_run(tmp_path, _config(tmp_path), CharTokenizer())
    with pytest.raises(InputError, match="different tokenizer") as error:
        find_resume_point(st.checkpoint_root(tmp_path / "run"), _config(tmp_path, resume=True), KmerTokenizer(3),
                          print)
    assert f"--data {tmp_path / 'data'}" in error.value.fix


def test_checkpoint_tokenizer_check(tmp_path):
    """No tokenizer file, or a text tokenizer: nothing to check; a genome tokenizer must equal the dataset's."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    assert not check_checkpoint_tokenizer(folder, CharTokenizer(), tmp_path / "data")
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    assert not check_checkpoint_tokenizer(folder, CharTokenizer(), tmp_path / "data")
    save_tokenizer(CharTokenizer(), folder / "tokenizer.json")
    assert check_checkpoint_tokenizer(folder, CharTokenizer(), tmp_path / "data")
    with pytest.raises(InputError, match=r"different tokenizer \(kmer, k=3") as error:
        check_checkpoint_tokenizer(folder, KmerTokenizer(3), tmp_path / "data")
    assert "genolc prepare --tokenizer" in error.value.fix


def test_saves_move_the_last_good_checkpoint(tmp_path, monkeypatch):
    model, opt = _setup()
    resumed = tmp_path / "earlier"
    checkpoints = _checkpoints(tmp_path, [], resumed_from=resumed)
    assert checkpoints.last_good == resumed
    first = checkpoints.save(1, model=model, optimizer=opt, trainer_state=dict)
    assert checkpoints.last_good == first and first.is_dir() and checkpoints.in_background == 0
    assert checkpoints.seconds > 0

    release = threading.Event()
    write = background_save.write_snapshot
    monkeypatch.setattr(background_save, "write_snapshot",
                        lambda *args, **kwargs: release.wait(timeout=60) and write(*args, **kwargs))
    _train(model, opt, 1)
    second = checkpoints.save(2, model=model, optimizer=opt, trainer_state=dict, background=True)
    checkpoints.poll()
    assert checkpoints.last_good == first and not second.exists()    # not whole yet
    release.set()
    checkpoints.wait()
    assert checkpoints.last_good == second and checkpoints.in_background == 1


def test_a_rank_that_does_not_write_names_rank_zeros_checkpoint(tmp_path):
    model, opt = _setup()
    barriers = []

    def never(*args, **kwargs):
        raise AssertionError("only rank 0 builds the trainer state")

    checkpoints = _checkpoints(tmp_path, [], writes=False, barriers=barriers)
    path = checkpoints.save(4, model=model, optimizer=opt, trainer_state=never, background=True)
    assert path == st.checkpoint_root(tmp_path / "run") / "step-000004" == checkpoints.last_good
    assert barriers == [1] and not path.exists()


def test_settle_says_a_failed_background_write_and_keeps_the_last_whole_one(tmp_path, monkeypatch):
    model, opt = _setup()
    said = []
    checkpoints = _checkpoints(tmp_path, said)
    first = checkpoints.save(1, model=model, optimizer=opt, trainer_state=dict)

    def full_disk(name):
        if name == st.OPTIMIZER_STATE:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(st, "after_file_written", full_disk)
    checkpoints.save(2, model=model, optimizer=opt, trainer_state=dict, background=True)
    checkpoints.settle()
    assert checkpoints.last_good == first
    assert len(said) == 1 and "No space left on device" in said[0] and "last complete one is kept" in said[0]
