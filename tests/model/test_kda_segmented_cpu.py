"""Segment-wise KDA autograd (genolc.model.ops.kda.fla.SegmentedKDA) on CPU, around the pure-torch chunk_kda.

The segmented Function is fla-independent: it takes the per-segment kernel as a parameter. Here that kernel is the
reference, so outputs and gradients must equal one unsegmented reference call up to fp32 summation order.
"""

from __future__ import annotations

import functools

import pytest
import torch

from genolc.model.ops.kda import reference
from genolc.model.ops.kda.fla import (Gate, check_gate, reference_segment_kernel, resolve_gate, segment_bounds,
                                      segmented_kda)

# Odd length, and a reference chunk that segment boundaries cut through.
LENGTH = 37
CHUNK = 16


reference_kernel = functools.partial(reference_segment_kernel, chunk_size=CHUNK)


def _inputs(seed: int, with_state: bool, dtype=torch.float32, batch=2, heads=2, key_dim=8, value_dim=6):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, LENGTH, heads, key_dim, generator=gen)
    k = torch.randn(batch, LENGTH, heads, key_dim, generator=gen)
    v = torch.randn(batch, LENGTH, heads, value_dim, generator=gen)
    g = -3.0 * torch.sigmoid(torch.randn(batch, LENGTH, heads, key_dim, generator=gen))
    beta = torch.rand(batch, LENGTH, heads, generator=gen)
    tensors = [q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype)]
    if with_state:
        tensors.append(0.5 * torch.randn(batch, heads, key_dim, value_dim, generator=gen))
    return [t.requires_grad_(True) for t in tensors]


def _run(op, inputs, d_out, d_final, output_final_state):
    q, k, v, g, beta, *state = inputs
    out, final = op(q, k, v, g, beta, state[0] if state else None, output_final_state)
    loss = (out.float() * d_out).sum()
    if output_final_state:
        loss = loss + (final * d_final).sum()
    grads = torch.autograd.grad(loss, inputs)
    return out, final, grads


def _whole(q, k, v, g, beta, state, output_final_state):
    return reference_kernel(q, k, v, g, beta, 0.4, state, output_final_state, True)


def _segmented(segment_len):
    def op(q, k, v, g, beta, state, output_final_state):
        return segmented_kda(q, k, v, g, beta, 0.4, state, output_final_state, True, segment_len,
                             kernel=reference_kernel)
    return op


def _rel(actual, expected) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def test_the_replay_in_backward_keeps_the_kernels_intermediates():
    """The segments' forward runs without grad and keeps nothing; each segment's replay in backward, whose backward
    follows at once, asks the kernel to keep its intermediates (fla's ``disable_recompute``)."""
    calls = []

    def kernel(*args, keep_intermediates=False):
        calls.append((torch.is_grad_enabled(), keep_intermediates))
        return reference_kernel(*args, keep_intermediates=keep_intermediates)

    q, k, v, g, beta, state = _inputs(5, True)
    out, final = segmented_kda(q, k, v, g, beta, 0.4, state, True, True, 16, kernel=kernel)
    assert calls == [(False, False)] * 3
    (out.sum() + final.sum()).backward()
    assert calls[3:] == [(True, True)] * 3


def test_fla_is_asked_to_keep_its_intermediates_only_under_grad(monkeypatch):
    """fla_kda hands fla ``disable_recompute=True`` for ``keep_intermediates`` when grad is on, else False."""
    from genolc.model.ops.kda import fla as kda_fla

    asked = []

    def fake_fla(q, k, v, g, beta, **kwargs):
        asked.append(kwargs["disable_recompute"])
        return v.clone(), None

    monkeypatch.setattr(kda_fla, "_fla_chunk_kda", lambda: fake_fla)
    q, k, v, g, beta = _inputs(2, False)
    kda_fla.fla_kda(q, k, v, g, beta, 0.4, None, False, True, keep_intermediates=True)
    with torch.no_grad():
        kda_fla.fla_kda(q, k, v, g, beta, 0.4, None, False, True, keep_intermediates=True)
    kda_fla.fla_kda(q, k, v, g, beta, 0.4, None, False, True)
    assert asked == [True, False, False]


@pytest.mark.parametrize("segment_len", [1, 10, 16, 36, LENGTH, 64])
@pytest.mark.parametrize("with_state, output_final_state", [(True, True), (False, True), (True, False),
                                                            (False, False)])
def test_segmented_equals_unsegmented(segment_len, with_state, output_final_state):
    inputs = _inputs(seed=segment_len, with_state=with_state)
    gen = torch.Generator().manual_seed(100 + segment_len)
    d_out = torch.randn(inputs[2].shape, generator=gen)
    d_final = torch.randn(inputs[0].shape[0], inputs[0].shape[2], inputs[0].shape[3], inputs[2].shape[3],
                          generator=gen)
    whole = _run(_whole, inputs, d_out, d_final, output_final_state)
    pieces = _run(_segmented(segment_len), inputs, d_out, d_final, output_final_state)
    assert _rel(pieces[0], whole[0]) < 1e-5
    if output_final_state:
        assert _rel(pieces[1], whole[1]) < 1e-5
    else:
        assert pieces[1] is None
    for name, mine, theirs in zip("q k v g beta h0".split(), pieces[2], whole[2]):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert _rel(mine, theirs) < 1e-5, name


def test_only_the_final_state_carries_gradient():
    # d_out never reaches backward (materialize_grads off): the zero output gradient path. The final state does
    # not depend on q, so q's gradient is zero (None from the reference).
    inputs = _inputs(seed=5, with_state=True)
    q, k, v, g, beta, state = inputs
    d_final = torch.randn(2, 2, 8, 6, generator=torch.Generator().manual_seed(6))
    grads = []
    for op in (_whole, _segmented(10)):
        _, final = op(q, k, v, g, beta, state, True)
        grads.append(torch.autograd.grad((final * d_final).sum(), inputs, allow_unused=True))
    assert grads[0][0] is None and not grads[1][0].any()
    for name, mine, theirs in zip("k v g beta h0".split(), grads[1][1:], grads[0][1:]):
        assert _rel(mine, theirs) < 1e-5, name


def test_bf16_inputs_and_partial_requires_grad():
    q, k, v, g, beta, state = _inputs(seed=9, with_state=True, dtype=torch.bfloat16)
    state = state.detach().bfloat16().requires_grad_(True)
    beta = beta.detach()                                # not trained: no gradient expected for it
    d_out = torch.randn(v.shape, generator=torch.Generator().manual_seed(10))
    results = []
    for op in (_whole, _segmented(10)):
        out, final = op(q, k, v, g, beta, state, True)
        assert out.dtype == torch.bfloat16 and final.dtype == torch.float32
        grads = torch.autograd.grad((out.float() * d_out).sum() + final.sum(), (q, k, v, g, state))
        results.append((out, grads))
    assert _rel(results[1][0], results[0][0]) < 1e-2
    for name, mine, theirs in zip("q k v g h0".split(), results[1][1], results[0][1]):
        assert mine.dtype == theirs.dtype, name
        assert _rel(mine, theirs) < 2e-2, name


@pytest.mark.parametrize("lower_bound, with_bias", [(-5.0, True), (None, True), (-2.0, False)])
def test_gate_in_kernel_segmented_equals_unsegmented(lower_bound, with_bias):
    # g is the raw pre-activation here; A_log and dt_bias are shared by every segment, so their gradients are sums
    # over segments that must equal the unsegmented op's.
    q, k, v, raw, beta, state = _inputs(seed=21, with_state=True)
    gen = torch.Generator().manual_seed(22)
    raw = (2.0 * torch.randn(raw.shape, generator=gen)).requires_grad_(True)
    A_log = (0.3 * torch.randn(2, generator=gen)).requires_grad_(True)
    dt_bias = (0.5 * torch.randn(16, generator=gen)).requires_grad_(True) if with_bias else None
    gate = Gate(A_log, dt_bias, lower_bound)
    d_out = torch.randn(v.shape, generator=gen)
    d_final = torch.randn(2, 2, 8, 6, generator=gen)
    leaves = [t for t in (q, k, v, raw, beta, state, A_log, dt_bias) if t is not None]
    results = []
    for segment_len in (None, 10):
        if segment_len is None:
            out, final = reference_kernel(q, k, v, raw, beta, 0.4, state, True, True, gate)
        else:
            out, final = segmented_kda(q, k, v, raw, beta, 0.4, state, True, True, segment_len,
                                       kernel=reference_kernel, gate=gate)
        loss = (out * d_out).sum() + (final * d_final).sum()
        results.append((out, final, torch.autograd.grad(loss, leaves)))
    assert _rel(results[1][0], results[0][0]) < 1e-5
    assert _rel(results[1][1], results[0][1]) < 1e-5
    names = "q k v raw beta h0 A_log dt_bias".split()
    for name, mine, theirs in zip(names, results[1][2], results[0][2]):
        assert theirs.abs().max() > 0, name
        assert _rel(mine, theirs) < 1e-5, name


def test_gate_in_kernel_equals_finished_gate():
    q, k, v, raw, beta = _inputs(seed=23, with_state=False)
    A_log, dt_bias = torch.randn(2), torch.randn(16)
    out, _ = reference.chunk_kda(q, k, v, raw, beta, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                 lower_bound=-5.0)
    g = -5.0 * torch.sigmoid(A_log.exp().view(2, 1) * (raw + dt_bias.view(2, 8)))
    expected, _ = reference.chunk_kda(q, k, v, g, beta)
    torch.testing.assert_close(out, expected)
    ref_out, _ = reference.recurrent_kda(q, k, v, raw, beta, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                         lower_bound=-5.0)
    # Step by step against chunked, both fp32: with decays down to exp(-5) per step the two orders of summation
    # differ by up to ~5e-4 here, depending on the BLAS thread count (seen at 1.3e-4 and 5.5e-4 on 2026-11-30).
    torch.testing.assert_close(ref_out, expected, rtol=1e-2, atol=2e-3)


def test_gate_arguments_are_checked():
    q, k, v, raw, beta = _inputs(seed=24, with_state=False)
    with pytest.raises(ValueError, match="use_gate_in_kernel=True"):
        reference.chunk_kda(q, k, v, raw, beta, A_log=torch.zeros(2))
    with pytest.raises(ValueError, match="needs A_log"):
        reference.chunk_kda(q, k, v, raw, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"A_log must be \[H\]"):
        reference.chunk_kda(q, k, v, raw, beta, use_gate_in_kernel=True, A_log=torch.zeros(3))
    with pytest.raises(ValueError, match=r"dt_bias must be \[H \* Dk\]"):
        reference.chunk_kda(q, k, v, raw, beta, use_gate_in_kernel=True, A_log=torch.zeros(2),
                            dt_bias=torch.zeros(8))
    with pytest.raises(ValueError, match="negative"):
        reference.chunk_kda(q, k, v, raw, beta, use_gate_in_kernel=True, lower_bound=1.0)


def test_fast_gate_resolution_and_checks():
    q = torch.zeros(1, 4, 2, 8)
    A_log, dt_bias = torch.zeros(2), torch.zeros(16)
    assert resolve_gate(q, True, A_log, dt_bias, -5.0, None) == Gate(A_log, dt_bias, -5.0, True)
    assert resolve_gate(q, True, A_log, dt_bias, -6.0, None).safe_gate is False     # outside fla's safe range
    assert resolve_gate(q, True, A_log, dt_bias, None, None).safe_gate is False     # softplus gate: unbounded
    assert resolve_gate(q, True, A_log, dt_bias, -5.0, False).safe_gate is False
    assert resolve_gate(q, False, None, None, None, None) is None
    with pytest.raises(ValueError, match="safe_gate needs use_gate_in_kernel=True"):
        resolve_gate(q, False, None, None, None, True)
    with pytest.raises(ValueError, match="lower_bound in"):
        check_gate(q, Gate(A_log, dt_bias, -6.0, True))
    with pytest.raises(ValueError, match="reads A_log as float32"):
        check_gate(q, Gate(A_log.bfloat16(), dt_bias, -5.0))


def test_segment_bounds_and_bad_segment_len():
    assert segment_bounds(37, 10) == [(0, 10), (10, 20), (20, 30), (30, 37)]
    assert segment_bounds(37, 37) == [(0, 37)]
    inputs = _inputs(seed=1, with_state=False)
    with pytest.raises(ValueError, match="segment_len"):
        segmented_kda(*inputs, 0.4, None, False, True, 0, kernel=reference_kernel)
