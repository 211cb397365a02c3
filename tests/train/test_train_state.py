"""Checkpoint save/load on a small module: exact restore, atomicity under a failed save, keep-last-N, RNG."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from genolc.errors import InputError
from genolc.train import state as st


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def _train(model, opt, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 8)          # draws from the global torch RNG, so RNG restore matters
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_save_load_resumes_bitwise(tmp_path):
    model, opt = _setup()
    _train(model, opt, 3)
    path = st.save_checkpoint(tmp_path, 3, model=model, optimizer=opt, tokenizer=None,
                              trainer_state={"tokens": 123}, keep=2)
    assert path.name == "step-000003"
    expected = _train(model, opt, 4)

    model2, opt2 = _setup(seed=99)     # different init and RNG: everything must come from the checkpoint
    state = st.load_checkpoint(path, model=model2, optimizer=opt2)
    assert state["step"] == 3 and state["tokens"] == 123
    assert _train(model2, opt2, 4) == expected


def test_rng_roundtrip():
    saved = st.capture_rng()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    st.restore_rng(saved)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, opt = _setup()
    st.save_checkpoint(tmp_path, 1, model=model, optimizer=opt, tokenizer=None, trainer_state={}, keep=1)
    _train(model, opt, 1)

    def boom(name):
        if name == st.OPTIMIZER_STATE:
            raise RuntimeError("disk vanished")

    monkeypatch.setattr(st, "after_file_written", boom)
    with pytest.raises(RuntimeError):
        st.save_checkpoint(tmp_path, 2, model=model, optimizer=opt, tokenizer=None, trainer_state={}, keep=1)
    root = st.checkpoint_root(tmp_path)
    assert [s for s, _ in st.list_checkpoints(root)] == [1]
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]   # temp dir removed, step 1 kept despite keep=1
    model2, opt2 = _setup(5)
    st.load_checkpoint(root / "step-000001", model=model2, optimizer=opt2)


def test_keep_last_n_and_sweep(tmp_path):
    model, opt = _setup()
    for step in range(1, 5):
        st.save_checkpoint(tmp_path, step, model=model, optimizer=opt, tokenizer=None, trainer_state={}, keep=2)
    root = st.checkpoint_root(tmp_path)
    assert [s for s, _ in st.list_checkpoints(root)] == [3, 4]
    stale = root / ".step-000005.tmp-abc"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    assert st.latest_checkpoint(root).name == "step-000004"
    assert st.sweep_temporaries(root) == [stale] and not stale.exists()


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(InputError, match="trainer_state.json"):
        st.read_trainer_state(tmp_path)


def test_resolve_checkpoint_takes_a_runs_newest_complete_checkpoint_and_says_so(tmp_path, capsys):
    model, opt = _setup()
    for step in (2, 10):
        st.save_checkpoint(tmp_path / "run", step, model=model, optimizer=opt, tokenizer=None, trainer_state={},
                           keep=5)
    (tmp_path / "run" / "checkpoints" / ".step-000012.tmp-1").mkdir()        # a save cut short
    (tmp_path / "run" / "checkpoints" / "step-000011").mkdir()               # no trainer_state.json: incomplete
    newest = tmp_path / "run" / "checkpoints" / "step-000010"
    assert st.resolve_checkpoint(tmp_path / "run", "--checkpoint") == newest
    said = capsys.readouterr().err.splitlines()
    assert said == [f"genolc: --checkpoint {tmp_path / 'run'}: using the run's newest checkpoint {newest}"]
    # A checkpoint directory, or something that is neither (left for the model loader to report), is kept quietly.
    (newest / "config.json").write_text("{}")
    assert st.resolve_checkpoint(newest, "--checkpoint") == newest
    assert st.resolve_checkpoint(tmp_path / "nowhere", "--init") == tmp_path / "nowhere"
    assert capsys.readouterr().err == ""


def test_resolve_checkpoint_is_said_by_the_writing_rank_alone(tmp_path, capsys, monkeypatch):
    """Under torchrun every rank resolves --init; only global rank 0 says which checkpoint it took."""
    model, opt = _setup()
    st.save_checkpoint(tmp_path / "run", 2, model=model, optimizer=opt, tokenizer=None, trainer_state={}, keep=5)
    newest = tmp_path / "run" / "checkpoints" / "step-000002"
    said = {}
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert st.resolve_checkpoint(tmp_path / "run", "--init") == newest
        said[rank] = capsys.readouterr().err
    assert said["1"] == "" and "using the run's newest checkpoint" in said["0"]


@pytest.mark.parametrize("leftover", ["checkpoints", "metrics.jsonl"])
def test_resolve_checkpoint_refuses_a_run_without_a_checkpoint(tmp_path, leftover):
    run = tmp_path / "run"
    run.mkdir()
    if leftover == "checkpoints":
        (run / "checkpoints" / ".step-000004.tmp-7").mkdir(parents=True)
    else:
        (run / "metrics.jsonl").write_text("")
    with pytest.raises(InputError, match="finetune run directory has no complete checkpoint") as info:
        st.resolve_checkpoint(run, "--init")
    assert "--init" in info.value.message and str(run) in info.value.message
