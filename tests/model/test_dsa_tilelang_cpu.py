"""CPU-side checks of the TileLang sparse-attention forward: input validation and launch configs, with TileLang
blocked from importing (the kernel itself needs CUDA; tests/gpu and benchmarks/bench_dsa_tilelang.py run it)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from genolc.model.ops.dsa import tilelang_fwd


@pytest.fixture(name="no_tilelang")
def no_tilelang_fixture(monkeypatch):
    """Any ``import tilelang`` raises ImportError while the test runs; the module is reloaded under that block."""
    monkeypatch.setitem(sys.modules, "tilelang", None)
    monkeypatch.setitem(sys.modules, "tilelang.language", None)
    return importlib.reload(tilelang_fwd)


def _inputs(batch=1, length=5, heads=8, rank=256, kv_len=9, width=7, dtype=torch.bfloat16):
    q_lat = torch.randn(batch, length, heads, rank).to(dtype)
    latent = torch.randn(batch, kv_len, rank).to(dtype)
    indices = torch.randint(-1, kv_len, (batch, length, width), dtype=torch.int32)
    return q_lat, latent, indices


def test_module_import_does_not_import_tilelang(no_tilelang):
    assert sys.modules["tilelang"] is None
    assert no_tilelang.padded_heads(8) == 16 and no_tilelang.padded_heads(12) == 16
    assert no_tilelang.padded_heads(17) == 32


@pytest.mark.parametrize("change, message", [
    (lambda q, c, i: (q[0], c, i), "q_lat must be"),
    (lambda q, c, i: (q, c[..., :128], i), "match q_lat"),
    (lambda q, c, i: (q, c, i[:, :3]), "indices"),
    (lambda q, c, i: (q, c, i[..., :0]), "at least one slot"),
    (lambda q, c, i: (q.float(), c.float(), i), "dtype"),
    (lambda q, c, i: (q, c.half(), i), "dtype"),
    (lambda q, c, i: (q, c, i.long()), "int32"),
    (lambda q, c, i: (q.transpose(1, 2).contiguous().transpose(1, 2), c, i), "q_lat must be contiguous"),
    (lambda q, c, i: (q, c, i.transpose(1, 2).contiguous().transpose(1, 2)), "indices must be contiguous"),
    (lambda q, c, i: (q.repeat(1, 1, 5, 1), c, i), "H must be"),
    (lambda q, c, i: (q[..., :200].contiguous(), c[..., :200].contiguous(), i), "R must be"),
])
def test_bad_inputs_raise_value_error(no_tilelang, change, message):
    q_lat, latent, indices = change(*_inputs())
    with pytest.raises(ValueError, match=message):
        no_tilelang.sparse_latent_attention_forward(q_lat, latent, indices, 0.1)


@pytest.mark.parametrize("scale", [0.0, -0.1, float("nan"), float("inf"), "0.1"])
def test_bad_scale_raises(no_tilelang, scale):
    with pytest.raises(ValueError, match="softmax_scale"):
        no_tilelang.sparse_latent_attention_forward(*_inputs(), scale)


def test_cpu_tensors_raise_instead_of_falling_back(no_tilelang):
    """Valid shapes on CPU: a clear ValueError naming the reference, never a silent fallback."""
    for dtype in (torch.bfloat16, torch.float16):
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            no_tilelang.sparse_latent_attention_forward(*_inputs(dtype=dtype, heads=12, rank=384), 0.1)


def test_launch_configs(no_tilelang):
    config_cls = no_tilelang.KernelConfig
    for rank in (256, 384, 512):
        no_tilelang.default_config(rank).check(rank)
    assert no_tilelang.default_config(256) == config_cls(64, 2, 128)
    assert no_tilelang.default_config(384) == config_cls(64, 2, 128)
    config_cls(64, 2, 256).check(384)
    with pytest.raises(ValueError, match="multiples of"):
        config_cls(16, 2, 128).check(256)                     # 16 slots cannot split over 4 warps of 8 columns
    with pytest.raises(ValueError, match="multiples of"):
        config_cls(64, 2, 256).check(96)
    with pytest.raises(ValueError, match="num_stages"):
        config_cls(64, 0, 128).check(256)
    with pytest.raises(ValueError, match="threads"):
        config_cls(64, 2, 96).check(256)
