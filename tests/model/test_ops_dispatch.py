"""genolc.model.ops.dispatch on CPU: reference results, and no triton / fla / tilelang import anywhere."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys

import pytest
import torch

from genolc.model.layers.moe import Experts
from genolc.model.ops import dispatch
from genolc.model.ops.dsa import reference as dsa_reference
from genolc.model.ops.indexer import reference as indexer_reference
from genolc.model.ops.kda import reference as kda_reference
from genolc.model.ops.moe.swiglu import clamped_swiglu
from genolc.model.presets import tiny


def test_dispatch_imports_no_gpu_packages():
    code = (
        "import sys, torch\n"
        "from genolc.model.ops import dispatch\n"
        "q = torch.randn(1, 9, 2, 8); g = -torch.rand(1, 9, 2, 8)\n"
        "dispatch.chunk_kda(q, q, q, g, torch.rand(1, 9, 2), use_qk_l2norm_in_kernel=True)\n"
        "idx = dispatch.select_indices(torch.randn(1, 9, 2, 8), torch.rand(1, 9, 2), torch.randn(1, 2, 8),\n"
        "                              kpool=4, topk=4, select_tail=True, softmax_scale=0.3)\n"
        "dispatch.sparse_latent_attention(q, q[:, :, 0], idx, 0.3)\n"
        "bad = [m for m in ('triton', 'fla', 'tilelang') if m in sys.modules]\n"
        "print('LOADED', bad)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout


def test_cpu_calls_equal_references():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 70, 3, 8) for _ in range(3))
    g, beta = -torch.rand(2, 70, 3, 8), torch.rand(2, 70, 3)
    got, got_state = dispatch.chunk_kda(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref, ref_state = kda_reference.chunk_kda(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert torch.equal(got, ref) and torch.equal(got_state, ref_state)

    index_q, weights, pooled = torch.randn(2, 70, 2, 8), torch.rand(2, 70, 2), torch.randn(2, 17, 8)
    kwargs = dict(kpool=4, topk=16, select_tail=True, softmax_scale=0.3)
    indices = dispatch.select_indices(index_q, weights, pooled, **kwargs)
    assert torch.equal(indices, indexer_reference.select_indices(index_q, weights, pooled, **kwargs))

    latent = k[:, :, 0]
    assert torch.equal(dispatch.sparse_latent_attention(q, latent, indices.int(), 0.3),
                       dsa_reference.sparse_latent_attention(q, latent, indices.int(), 0.3))


def test_cpu_routed_experts_equal_a_per_token_loop():
    config = tiny()
    torch.manual_seed(1)
    experts = Experts(config)
    x = torch.randn(33, config.hidden_size)
    expert_ids = torch.randint(0, config.n_routed_experts, (33, config.num_experts_per_tok))
    weights = torch.rand(33, config.num_experts_per_tok)
    got, got_counts = dispatch.routed_experts(x, expert_ids, weights, experts.gate_up_proj, experts.down_proj,
                                              experts.swiglu_limit)
    expected = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for e, w in zip(expert_ids[n].tolist(), weights[n]):
            gate, up = (experts.gate_up_proj[e] @ x[n]).chunk(2)
            expected[n] += w * (experts.down_proj[e] @ clamped_swiglu(gate, up, experts.swiglu_limit))
    assert torch.equal(got_counts, torch.bincount(expert_ids.flatten(), minlength=config.n_routed_experts))
    assert torch.allclose(got, expected, atol=1e-6)


def _fake_find_spec(installed: bool):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "tilelang":
            return object() if installed else None
        return real(name, *args, **kwargs)
    return find_spec


@pytest.mark.parametrize("dtype, heads, rank, installed, expected", [
    (torch.bfloat16, 12, 384, True, "tilelang"),
    (torch.float16, 32, 512, True, "tilelang"),
    (torch.float32, 12, 384, True, "triton"),            # TileLang kernels take half precision only
    (torch.bfloat16, 40, 384, True, "triton"),           # more heads than one TileLang block holds
    (torch.bfloat16, 12, 392, True, "triton"),           # rank not a multiple of 16
    (torch.bfloat16, 12, 384, False, "triton"),          # TileLang not installed
])
def test_dsa_kernel_family(dtype, heads, rank, installed, expected, monkeypatch, caplog):
    monkeypatch.delenv(dispatch.DSA_KERNELS_ENV, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec(installed))
    monkeypatch.setattr(dispatch, "_logged_choices", set())
    q_lat = torch.zeros(1, 3, heads, rank, dtype=dtype)
    with caplog.at_level(logging.INFO, logger=dispatch.__name__):
        assert dispatch.dsa_kernel_family(q_lat, torch.zeros(1, 3, rank, dtype=dtype)) == expected
        dispatch.dsa_kernel_family(q_lat, torch.zeros(1, 3, rank, dtype=dtype))
    assert len([r for r in caplog.records if expected in r.getMessage()]) == 1     # logged once, not per call


def test_dsa_kernel_family_forced_by_environment(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec(True))
    q_lat, latent = torch.zeros(1, 3, 12, 384, dtype=torch.bfloat16), torch.zeros(1, 3, 384, dtype=torch.bfloat16)
    monkeypatch.setenv(dispatch.DSA_KERNELS_ENV, "triton")
    assert dispatch.dsa_kernel_family(q_lat, latent) == "triton"
    monkeypatch.setenv(dispatch.DSA_KERNELS_ENV, "cuda")
    with pytest.raises(ValueError, match="GENOLC_DSA_KERNELS='cuda' is not a DSA kernel family"):
        dispatch.dsa_kernel_family(q_lat, latent)
