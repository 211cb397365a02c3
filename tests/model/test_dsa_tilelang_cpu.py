"""CPU-side checks of the TileLang sparse-attention forward: input validation and launch configs, with TileLang
blocked from importing (the kernel itself needs CUDA; tests/gpu and benchmarks/bench_dsa_tilelang.py run it)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from genolc.model.ops.dsa.tilelang import forward as tilelang_forward


@pytest.fixture(name="no_tilelang")
def no_tilelang_fixture(monkeypatch):
    """Any ``import tilelang`` raises ImportError while the test runs; the module is reloaded under that block."""
    monkeypatch.setitem(sys.modules, "tilelang", None)
    monkeypatch.setitem(sys.modules, "tilelang.language", None)
    return importlib.reload(tilelang_forward)


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


@pytest.fixture(name="no_tilelang_backward")
def no_tilelang_backward_fixture(no_tilelang):
    """tilelang_backward reloaded while ``import tilelang`` is blocked (after tilelang_forward, which it imports)."""
    from genolc.model.ops.dsa.tilelang import backward as tilelang_backward

    return importlib.reload(tilelang_backward)


def _backward_inputs(**kwargs):
    q_lat, latent, indices = _inputs(**kwargs)
    out = torch.randn_like(q_lat)
    lse = torch.randn(q_lat.shape[:3])
    d_out = torch.randn_like(q_lat)
    return q_lat, latent, indices, out, lse, d_out


def test_backward_module_import_does_not_import_tilelang(no_tilelang_backward):
    assert sys.modules["tilelang"] is None
    assert no_tilelang_backward.default_backward_config(384).rank_parts == 3


@pytest.mark.parametrize("change, message", [
    (lambda q, c, i, o, l, g: (q, c, i, o[..., :128].contiguous(), l, g), "out must be"),
    (lambda q, c, i, o, l, g: (q, c, i, o.half(), l, g), "out must be"),
    (lambda q, c, i, o, l, g: (q, c, i, o, l[..., :3].contiguous(), g), "lse must be"),
    (lambda q, c, i, o, l, g: (q, c, i, o, l.double(), g), "lse must be"),
    (lambda q, c, i, o, l, g: (q, c, i, o, l.transpose(1, 2).contiguous().transpose(1, 2), g), "lse must be"),
    (lambda q, c, i, o, l, g: (q, c, i, o, l, g[:, :2]), "d_out must be"),
    (lambda q, c, i, o, l, g: (q, c, i.long(), o, l, g), "int32"),
    (lambda q, c, i, o, l, g: (q.float(), c.float(), i, o.float(), l, g.float()), "dtype"),
])
def test_backward_bad_inputs_raise_value_error(no_tilelang_backward, change, message):
    q_lat, latent, indices, out, lse, d_out = change(*_backward_inputs())
    with pytest.raises(ValueError, match=message):
        no_tilelang_backward.check_backward_inputs(q_lat, latent, indices, out, lse, d_out, 0.1)


def test_backward_on_cpu_raises_instead_of_falling_back(no_tilelang_backward):
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        no_tilelang_backward.sparse_latent_attention_backward(*_backward_inputs(heads=12, rank=384), 0.1)


def test_autograd_op_on_cpu_raises(no_tilelang_backward):
    q_lat, latent, indices = _inputs()
    with pytest.raises(ValueError, match="reference.sparse_latent_attention"):
        no_tilelang_backward.sparse_latent_attention(q_lat.requires_grad_(), latent, indices, 0.1)


def test_prepare_inputs_narrows_indices_and_unifies_dtypes(no_tilelang_backward):
    q_lat, latent, indices = _inputs()
    wide = indices.long().transpose(1, 2).contiguous().transpose(1, 2)           # int64, last stride != 1
    q2, c2, i2 = no_tilelang_backward.prepare_tilelang_inputs(q_lat, latent.float(), wide)
    assert q2.dtype == c2.dtype == torch.float32                                   # fp32 then fails check_inputs
    assert i2.dtype == torch.int32 and i2.is_contiguous() and torch.equal(i2, indices)
    with pytest.raises(ValueError, match="dtype"):
        no_tilelang_backward.check_inputs(q2, c2, i2, 0.1)
    q3, c3, i3 = no_tilelang_backward.prepare_tilelang_inputs(q_lat, latent, indices)
    assert q3.dtype == c3.dtype == torch.bfloat16 and i3.data_ptr() == indices.data_ptr()


def test_backward_launch_configs(no_tilelang_backward):
    config_cls = no_tilelang_backward.BackwardConfig
    expected_parts = {64: 1, 128: 1, 256: 2, 384: 3, 512: 4, 480: 5}
    for rank, parts in expected_parts.items():
        config = no_tilelang_backward.default_backward_config(rank)
        config.check(rank)
        assert config.rank_parts == parts and rank // parts <= 128
    # Base (H = 12, R = 384): Q, dO, two 32-slot gathered stages, P and dS, one fp32 [32, 128] dC slice.
    base = no_tilelang_backward.default_backward_config(384)
    assert base.shared_bytes(12, 384) == 2 * 16 * 384 * 2 + 2 * 32 * 384 * 2 + 2 * 16 * 32 * 2 + 32 * 128 * 4
    assert base.shared_bytes(12, 384) < 227 * 1024
    with pytest.raises(ValueError, match="multiple of 32"):
        no_tilelang_backward.default_backward_config(80)
    with pytest.raises(ValueError, match="rank_parts"):
        config_cls(rank_parts=3).check(256)
    with pytest.raises(ValueError, match="multiples of"):
        config_cls(rank_parts=8).check(384)                   # 48-column slices cannot split over 4 warps of 8
    with pytest.raises(ValueError, match="multiples of"):
        config_cls(32, 2, 256).check(384)                     # 32 slots over 8 warps
    with pytest.raises(ValueError, match="threads"):
        config_cls(16, 2, 128).check(256)
    with pytest.raises(ValueError, match="num_stages"):
        config_cls(32, 4, 128).check(256)


def test_compile_once_builds_each_key_once_and_different_keys_at_once(monkeypatch):
    """The TileLang kernels' compile cache (forward.compile_once, which the backward modules use too): one compile
    per (builder, key) however many threads ask, and two keys compiling at the same time (the kernel warm-up's
    threads rely on it). tilelang.compile is stubbed: no TileLang on CPU."""
    import sys
    import threading
    import types

    from genolc.model.ops.dsa.tilelang import forward

    both_started = threading.Barrier(2, timeout=10)
    compiled = []

    def fake_compile(func, target, pass_configs):
        compiled.append(func)
        if func in ("A", "B"):
            both_started.wait()      # times out (BrokenBarrierError) if the two keys compiled one after the other
        return f"kernel {func}"

    monkeypatch.setitem(sys.modules, "tilelang", types.SimpleNamespace(compile=fake_compile))
    monkeypatch.setattr(forward, "pass_configs", lambda: {})
    forward._compiled.cache_clear()

    def build(name):
        return name

    results = []
    threads = [threading.Thread(target=lambda n=name: results.append(forward.compile_once(build, n)))
               for name in ("A", "B", "A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["kernel A", "kernel A", "kernel B", "kernel B"]
    assert sorted(compiled) == ["A", "B"]
    assert forward.compile_once(build, "C") == "kernel C" and compiled.count("C") == 1
    forward._compiled.cache_clear()
