"""KDA chunked reference: equals the step-by-step recurrence and transformers' chunk op, odd lengths, grads."""

from __future__ import annotations

import pytest
import torch

from genolc.model.ops.kda.reference import chunk_kda, recurrent_kda


def _inputs(batch=2, length=77, heads=3, key_dim=16, value_dim=8, seed=0, lower_bound=-5.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, heads, key_dim, generator=g)
    k = torch.randn(batch, length, heads, key_dim, generator=g)
    v = torch.randn(batch, length, heads, value_dim, generator=g)
    decay = lower_bound * torch.sigmoid(torch.randn(batch, length, heads, key_dim, generator=g))
    beta = torch.rand(batch, length, heads, generator=g)
    state = torch.randn(batch, heads, key_dim, value_dim, generator=g)
    return q, k, v, decay, beta, state


def _rms_close(actual, expected, tol):
    err = (actual - expected).pow(2).mean().sqrt() / (expected.pow(2).mean().sqrt() + 1e-12)
    assert err <= tol, f"RMS-relative error {err:.2e}"


@pytest.mark.parametrize("length,chunk_size", [(1, 64), (63, 64), (130, 64), (77, 16)])
def test_chunked_equals_recurrence(length, chunk_size):
    q, k, v, g, beta, state = _inputs(length=length)
    out, final = chunk_kda(q, k, v, g, beta, initial_state=state, output_final_state=True,
                           use_qk_l2norm_in_kernel=True, chunk_size=chunk_size)
    ref_out, ref_final = recurrent_kda(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True)
    _rms_close(out, ref_out, 1e-5)
    _rms_close(final, ref_final, 1e-5)


def test_strong_decay_over_long_chunks_stays_finite():
    # Per-step decay near the -5 lower bound: 64 steps reach exp(-320), which overflows if formed as exp(G)*exp(-G).
    q, k, v, _, beta, _ = _inputs(length=200)
    g = torch.full_like(q, -4.99)
    out, final = chunk_kda(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref_out, _ = recurrent_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    _rms_close(out, ref_out, 1e-5)


def test_matches_transformers_chunk_op():
    glm5 = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
    q, k, v, g, beta, state = _inputs(length=100, seed=3)
    out, final = chunk_kda(q, k, v, g, beta, initial_state=state, output_final_state=True,
                           use_qk_l2norm_in_kernel=True)
    ref_out, ref_final = glm5.chunk_kimi_delta_attention(q, k, v, g, beta, initial_state=state,
                                                          output_final_state=True, use_qk_l2norm_in_kernel=True)
    _rms_close(out, ref_out, 1e-5)
    _rms_close(final, ref_final, 1e-5)


def test_gradients_match_recurrence():
    inputs = [t.requires_grad_() for t in _inputs(batch=1, length=37, heads=2, key_dim=8, value_dim=4)]
    weights = torch.randn(1, 37, 2, 4)
    grads = []
    for op, kwargs in ((chunk_kda, {"chunk_size": 16}), (recurrent_kda, {})):
        q, k, v, g, beta, state = inputs
        out, final = op(q, k, v, g, beta, initial_state=state, output_final_state=True,
                        use_qk_l2norm_in_kernel=True, **kwargs)
        grads.append(torch.autograd.grad((out * weights).sum() + final.sum(), inputs))
    for chunked, stepwise in zip(*grads):
        _rms_close(chunked, stepwise, 1e-4)


def test_bad_shapes_raise_value_error():
    q, k, v, g, beta, state = _inputs(length=8)
    with pytest.raises(ValueError, match="beta"):
        chunk_kda(q, k, v, g, beta[..., :1])
    with pytest.raises(ValueError, match="g"):
        chunk_kda(q, k, v, g[..., :4], beta)
    with pytest.raises(ValueError, match="initial_state"):
        chunk_kda(q, k, v, g, beta, initial_state=state[:, :1])
    with pytest.raises(ValueError, match="v must"):
        chunk_kda(q, k, v[:, :3], g, beta)
