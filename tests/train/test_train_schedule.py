"""LR schedule and sequence-length warm-up shapes."""

from __future__ import annotations

import math

import pytest

from genolc.errors import ConfigError
from genolc.train.config import TrainConfig, changed_for_resume
from genolc.train.schedule import indexer_mode_at, lr_at, stage_lengths, step_shape


def make(**kw) -> TrainConfig:
    base = dict(data="d", out="o", seq_len=256, steps=20, lr=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    return TrainConfig(**{**base, **kw})


def test_lr_warmup_then_cosine_to_min():
    cfg = make()
    lrs = [lr_at(s, cfg) for s in range(cfg.steps)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))   # monotone decay after warm-up
    mid = 4 + (cfg.steps - 4 - 1) / 2
    assert lr_at(int(mid), cfg) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 4) / 15)))


def test_lr_without_warmup_starts_at_peak():
    cfg = make(warmup_steps=0)
    assert lr_at(0, cfg) == pytest.approx(1e-3)


def test_seq_warmup_holds_tokens_per_step():
    cfg = make(seq_warmup=(64, 128), seq_warmup_steps=3, micro_batch=2, grad_accum=3)
    shapes = [step_shape(s, cfg) for s in range(cfg.steps)]
    assert [s.seq_len for s in shapes[:7]] == [64, 64, 64, 128, 128, 128, 256]
    assert {s.tokens for s in shapes} == {256 * 2 * 3}
    assert shapes[0].windows == 8 and shapes[3].windows == 4 and shapes[6].windows == 2
    assert {s.grad_accum for s in shapes} == {3}
    # sampler micro indices of one step are all distinct
    s0 = shapes[0]
    idx = [s0.sampler_micro(m, w) for m in range(s0.grad_accum) for w in range(s0.windows)]
    assert sorted(idx) == list(range(24))
    assert stage_lengths(cfg) == (64, 128, 256)


@pytest.mark.parametrize("bad", [dict(seq_warmup=(100,), seq_warmup_steps=2),       # does not divide 256
                                 dict(seq_warmup=(128, 64), seq_warmup_steps=2),     # not increasing
                                 dict(seq_warmup=(64,), seq_warmup_steps=0),         # no steps per stage
                                 dict(seq_warmup=(64, 128), seq_warmup_steps=10),    # no full-length steps left
                                 dict(softmask_weight=1.5), dict(indexer="sometimes"), dict(grad_accum=0)])
def test_bad_configs_raise(bad):
    with pytest.raises(ConfigError):
        make(**bad)


def test_indexer_modes():
    assert indexer_mode_at(0, make()) is None
    cfg = make(indexer="dense-then-sparse", indexer_dense_steps=5)
    assert [indexer_mode_at(s, cfg) for s in (0, 4, 5, 19)] == ["dense", "dense", "sparse", "sparse"]
    assert indexer_mode_at(3, make(indexer="sparse")) == "sparse"


def test_resume_compat_and_roundtrip():
    cfg = make(seq_warmup=(64,), seq_warmup_steps=2)
    saved = cfg.to_dict()
    assert TrainConfig.from_dict(saved) == cfg
    assert changed_for_resume(saved, cfg.replace(steps=40, resume=True)) == []
    assert changed_for_resume(saved, cfg.replace(lr=2e-3))[0].startswith("lr:")
