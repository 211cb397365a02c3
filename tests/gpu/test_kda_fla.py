"""fla-backed, segment-wise KDA (genolc.model.ops.kda.fla) against the pure-torch reference. Needs CUDA + fla."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops.kda import fla as kda_fla, reference  # noqa: E402

pytestmark = pytest.mark.gpu


def _inputs(batch, length, heads, dim, seed, with_state=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    q = rand(batch, length, heads, dim).bfloat16()
    k = rand(batch, length, heads, dim).bfloat16()
    v = rand(batch, length, heads, dim).bfloat16()
    g = -5.0 * torch.sigmoid(rand(batch, length, heads, dim) - 2.0)        # GLM's lower-bounded gate, fp32
    beta = torch.sigmoid(rand(batch, length, heads)).bfloat16()
    state = 0.1 * rand(batch, heads, dim, dim) if with_state else None
    tensors = [q, k, v, g, beta] + ([state] if with_state else [])
    return [t.requires_grad_(True) for t in tensors]


def _run(op, inputs, d_out, d_final, **kwargs):
    q, k, v, g, beta, *state = inputs
    out, final = op(q, k, v, g, beta, initial_state=state[0] if state else None, output_final_state=True,
                    use_qk_l2norm_in_kernel=True, **kwargs)
    loss = (out.float() * d_out).sum() + (final * d_final).sum()
    grads = torch.autograd.grad(loss, inputs)
    return out, final, grads


def _cotangents(batch, length):
    """Gradients arriving at the output [B, T, 12, 128] and at the final state [B, 12, 128, 128]."""
    return torch.randn(batch, length, 12, 128, device="cuda"), torch.randn(batch, 12, 128, 128, device="cuda")


def _assert_matches(got, expected, rel_err, out_tol, grad_tol):
    assert rel_err(got[0], expected[0]) < out_tol
    assert rel_err(got[1], expected[1]) < out_tol
    for name, mine, theirs in zip("q k v g beta h0".split(), got[2], expected[2]):
        assert rel_err(mine, theirs) < grad_tol, name


# H=12, D=128 throughout: the `base` preset's KDA shape (fla autotunes once per head count, minutes on a fresh
# machine). The 64k + 1 case runs three segments against the fp32 reference (~81 GiB; 128k would not fit).
@pytest.mark.parametrize("batch, length, with_state, segment_len",
                         [(2, 1000, False, None), (2, 2053, True, None), (1, 65537, True, 30000)])
def test_fast_matches_reference(batch, length, with_state, segment_len, poison, rel_err):
    inputs = _inputs(batch, length, 12, 128, seed=length, with_state=with_state)
    d_out, d_final = _cotangents(batch, length)
    ref = _run(reference.chunk_kda, [t.detach().float().requires_grad_(True) for t in inputs], d_out, d_final)
    poison()
    got = _run(kda_fla.chunk_kda, inputs, d_out, d_final, segment_len=segment_len)
    _assert_matches(got, ref, rel_err, out_tol=1e-2, grad_tol=2e-2)


@pytest.mark.parametrize("length, segment_len, with_state", [(5001, 1024, True), (131071, 40000, False)])
def test_segmented_equals_unsegmented(length, segment_len, with_state, poison, rel_err):
    inputs = _inputs(1, length, 12, 128, seed=7 + length, with_state=with_state)
    d_out, d_final = _cotangents(1, length)
    whole = _run(kda_fla.chunk_kda, inputs, d_out, d_final, segment_len=None)
    poison()
    pieces = _run(kda_fla.chunk_kda, inputs, d_out, d_final, segment_len=segment_len)
    _assert_matches(pieces, whole, rel_err, out_tol=5e-3, grad_tol=1e-2)


def test_segmented_without_final_state_gradient(rel_err):
    q, k, v, g, beta = _inputs(1, 3000, 12, 128, seed=3)
    d_out = torch.randn(1, 3000, 12, 128, device="cuda")
    outs = []
    for segment_len in (None, 700):
        out, _ = kda_fla.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, segment_len=segment_len)
        outs.append((out, torch.autograd.grad((out.float() * d_out).sum(), (q, k, g))))
    assert rel_err(outs[1][0], outs[0][0]) < 5e-3
    for mine, theirs in zip(outs[1][1], outs[0][1]):
        assert rel_err(mine, theirs) < 1e-2


def _gate_inputs(length, seed, with_bias=True):
    """The layer's form: raw gate pre-activation in bf16, A_log [12] and dt_bias [12 * 128] fp32 parameters."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    raw = (2.0 * torch.randn(1, length, 12, 128, generator=gen, device="cuda")).bfloat16().requires_grad_(True)
    A_log = (0.5 * torch.randn(12, generator=gen, device="cuda")).requires_grad_(True)
    dt_bias = (0.5 * torch.randn(12 * 128, generator=gen, device="cuda")).requires_grad_(True) if with_bias else None
    return raw, A_log, dt_bias


# fla forms the gate in its cumsum kernel (and dA_log, ddt_bias in its gate backward); the reference forms it in
# fp32 torch. safe_gate is fla's M=16 path for gates bounded by construction; a segmented run sums the parameter
# gradients over segments.
@pytest.mark.parametrize("length, segment_len, safe_gate, lower_bound",
                         [(2053, None, False, -5.0), (2053, None, True, -5.0), (2053, None, False, None),
                          (20001, 7000, False, -5.0), (20001, 7000, True, -5.0)])
def test_gate_in_kernel_matches_reference(length, segment_len, safe_gate, lower_bound, poison, rel_err):
    q, k, v, _, beta, state = _inputs(1, length, 12, 128, seed=40 + length, with_state=True)
    raw, A_log, dt_bias = _gate_inputs(length, seed=41 + length, with_bias=lower_bound is not None)
    leaves = [q, k, v, raw, beta, state, A_log] + ([dt_bias] if dt_bias is not None else [])
    d_out, d_final = _cotangents(1, length)

    def run(op, tensors, **kwargs):
        q, k, v, raw, beta, state, A_log, *bias = tensors
        out, final = op(q, k, v, raw, beta, initial_state=state, output_final_state=True,
                        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
                        dt_bias=bias[0] if bias else None, lower_bound=lower_bound, **kwargs)
        loss = (out.float() * d_out).sum() + (final * d_final).sum()
        return out, final, torch.autograd.grad(loss, tensors)

    ref = run(reference.chunk_kda, [t.detach().float().requires_grad_(True) for t in leaves])
    poison()
    got = run(kda_fla.chunk_kda, leaves, segment_len=segment_len, safe_gate=safe_gate)
    assert got[2][3].dtype == torch.bfloat16                 # the raw gate's gradient: no fp32 [B, T, H, Dk]
    assert rel_err(got[0], ref[0]) < 1e-2
    assert rel_err(got[1], ref[1]) < 1e-2
    for name, mine, theirs in zip("q k v raw beta h0 A_log dt_bias".split(), got[2], ref[2]):
        assert rel_err(mine, theirs) < 2e-2, name


# keep_intermediates: fla keeps w, u, the gated q and k, the corrected values, the decay sum and the chunk states from
# the forward (its disable_recompute) instead of computing them again in backward; the layer's gate in the kernel,
# through dispatch as the layer calls it. One unsegmented call, also past the default 32k segment; a segmented run's
# replays keep them too.
@pytest.mark.parametrize("length", [2053, 40001])
def test_kept_intermediates_give_the_recomputed_results(length, poison, rel_err, monkeypatch):
    from genolc.model.ops import dispatch

    q, k, v, _, beta, state = _inputs(1, length, 12, 128, seed=60 + length, with_state=True)
    raw, A_log, dt_bias = _gate_inputs(length, seed=61 + length)
    leaves = [q, k, v, raw, beta, state, A_log, dt_bias]
    d_out, d_final = _cotangents(1, length)
    fla_op, asked = kda_fla._fla_chunk_kda(), []

    def spy(*args, **kwargs):
        asked.append(kwargs["disable_recompute"])
        return fla_op(*args, **kwargs)

    monkeypatch.setattr(kda_fla, "_fla_chunk_kda", lambda: spy)

    def run(op, **kwargs):
        q, k, v, raw, beta, state, A_log, dt_bias = leaves
        out, final = op(q, k, v, raw, beta, initial_state=state, output_final_state=True,
                        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                        lower_bound=-5.0, **kwargs)
        loss = (out.float() * d_out).sum() + (final * d_final).sum()
        return out, final, torch.autograd.grad(loss, leaves)

    recomputed = run(kda_fla.chunk_kda, segment_len=None)
    poison()
    kept = run(dispatch.chunk_kda, keep_intermediates=True)
    assert asked == [False, True]
    segmented = run(kda_fla.chunk_kda, segment_len=max(1000, length // 3))
    assert asked[2:] == [False] * 3 + [True] * 3       # three segments without grad, their replays keeping
    assert rel_err(kept[0], recomputed[0]) < 1e-6 and rel_err(kept[1], recomputed[1]) < 1e-6
    for name, mine, theirs in zip("q k v raw beta h0 A_log dt_bias".split(), kept[2], recomputed[2]):
        assert rel_err(mine, theirs) < 1e-6, name
    assert rel_err(segmented[0], recomputed[0]) < 5e-3
    for name, mine, theirs in zip("q k v raw beta h0 A_log dt_bias".split(), segmented[2], recomputed[2]):
        assert rel_err(mine, theirs) < 1e-2, name


def test_rejects_other_chunk_sizes():
    q, k, v, g, beta = _inputs(1, 64, 1, 16, seed=1)
    with pytest.raises(ValueError, match="chunk_size"):
        kda_fla.chunk_kda(q, k, v, g, beta, chunk_size=32)
