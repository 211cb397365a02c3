"""KDA's short convolution as shifted multiply-adds: equals F.conv1d + SiLU, outputs and gradients, odd lengths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genolc.model.layers.kda import KimiDeltaAttention
from genolc.model.ops.kda.conv import causal_conv_silu, causal_conv_silu_parts, reference_causal_conv_silu
from genolc.model.presets import tiny


def _inputs(batch, length, channels, kernel, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    padded = torch.randn(batch, length + kernel - 1, channels, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(channels, kernel, generator=g) / kernel).requires_grad_()
    return padded, weight


def _grads(fn, padded, weight, upstream):
    out = fn(padded, weight)
    padded_grad, weight_grad = torch.autograd.grad(out, (padded, weight), upstream)
    return out, padded_grad, weight_grad


@pytest.mark.parametrize("batch,length,channels,kernel", [(1, 1, 5, 4), (2, 77, 24, 4), (3, 130, 7, 3), (1, 9, 4, 1)])
def test_fp32_outputs_and_gradients_equal_conv1d(batch, length, channels, kernel):
    padded, weight = _inputs(batch, length, channels, kernel, torch.float64)
    upstream = torch.randn(batch, length, channels, dtype=torch.float64)
    fast = _grads(causal_conv_silu, padded, weight.double(), upstream)
    reference = _grads(reference_causal_conv_silu, padded, weight.double(), upstream)
    for got, want, name in zip(fast, reference, ("output", "input gradient", "weight gradient")):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=name)


def test_gradcheck():
    padded, weight = _inputs(2, 11, 3, 4, torch.float64)
    assert torch.autograd.gradcheck(causal_conv_silu, (padded, weight.detach().double().requires_grad_()))


def test_bf16_activations_sum_in_fp32():
    padded, weight = _inputs(2, 301, 16, 4, torch.bfloat16)
    upstream = torch.randn(2, 301, 16).to(torch.bfloat16)
    fast = _grads(causal_conv_silu, padded, weight, upstream)
    exact = _grads(reference_causal_conv_silu, padded.detach().double().requires_grad_(),
                   weight.detach().double().requires_grad_(), upstream.double())
    assert fast[0].dtype == fast[1].dtype == torch.bfloat16 and fast[2].dtype == torch.float32
    for got, want in zip(fast, exact):
        # bf16 rounding of the results only: half a unit in bf16's last place, 2^-8 relative, at most.
        torch.testing.assert_close(got.double(), want, rtol=2 ** -8, atol=1e-6)


def test_poisoned_padding_beyond_the_window_is_not_read():
    padded, weight = _inputs(1, 20, 6, 4, torch.float32)
    out = causal_conv_silu(padded, weight)
    longer = torch.cat([padded.detach(), torch.full((1, 5, 6), float("nan"))], dim=1)
    assert torch.isfinite(causal_conv_silu(longer, weight)[:, :20]).all()
    torch.testing.assert_close(causal_conv_silu(longer, weight)[:, :20], out)


@pytest.mark.parametrize("parts, length", [(1, 19), (2, 19), (3, 19), (3, 1), (2, 1)])
def test_parts_are_the_output_split_gradients_included(parts, length):
    """Also for a chunk of one token or none (a scoring window's last chunk), whose column slices share memory."""
    padded, weight = _inputs(2, length, 12, 4, torch.float64)
    weight = weight.detach().double().requires_grad_()
    upstream = torch.randn(2, length, 12, dtype=torch.float64)
    pieces = causal_conv_silu_parts(padded, weight, parts)
    assert len(pieces) == parts and all(p.is_contiguous() and p.shape == (2, length, 12 // parts) for p in pieces)
    got = torch.autograd.grad(pieces, (padded, weight), list(upstream.chunk(parts, -1)))
    want = _grads(reference_causal_conv_silu, padded, weight, upstream)
    torch.testing.assert_close(torch.cat(pieces, -1), want[0], rtol=1e-10, atol=1e-10)
    for mine, theirs in zip(got, want[1:]):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10)


def test_parts_of_a_chunk_without_tokens_are_empty_and_their_gradients_zero():
    padded, weight = _inputs(2, 0, 12, 4, torch.float32)
    pieces = causal_conv_silu_parts(padded, weight, 3)
    assert [p.shape for p in pieces] == [(2, 0, 4)] * 3
    grads = torch.autograd.grad(pieces, (padded, weight), [torch.zeros(2, 0, 4)] * 3)
    assert all(not g.any() for g in grads)


def test_the_kernels_refuse_what_they_cannot_take_before_importing_triton():
    """conv_triton's wrappers check shapes, taps and parts in torch (the ops route such inputs to torch instead)."""
    from genolc.model.ops.kda import conv_triton

    cases = [((torch.zeros(1, 5, 8), torch.zeros(6, 4), 1), r"padded must be \[B, L \+ K - 1, C\]"),
             ((torch.zeros(1, 9, 8), torch.zeros(8, 5), 1), "1 <= K <= 4"),
             ((torch.zeros(1, 9, 96), torch.zeros(96, 4), 3), "parts of 32 channels are not whole blocks of 64"),
             ((torch.zeros(1, 9, 8).double(), torch.zeros(8, 4), 1), "padded is torch.float64")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            conv_triton.conv_silu_forward(*args)
    with pytest.raises(ValueError, match=r"gradients must be 2 x \[B, L, C / parts\]"):
        conv_triton.conv_silu_backward([torch.zeros(1, 5, 64)] * 2, torch.zeros(1, 9, 128), torch.zeros(128, 4))


def test_wrong_shapes_say_what_is_expected():
    with pytest.raises(ValueError, match="12 channels do not split into 5 equal parts"):
        causal_conv_silu_parts(torch.zeros(1, 8, 12), torch.zeros(12, 4), 5)
    with pytest.raises(ValueError, match=r"padded must be \[B, L \+ K - 1, C\] and weight \[C, K\]"):
        causal_conv_silu(torch.zeros(1, 8, 5), torch.zeros(4, 4))
    with pytest.raises(ValueError, match="fewer than the K - 1 = 3"):
        causal_conv_silu(torch.zeros(1, 2, 4), torch.zeros(4, 4))


def _layer(seed=0):
    torch.manual_seed(seed)
    return KimiDeltaAttention(tiny(), layer_idx=0)


def _conv1d_short_conv(layer, qkv, tail):
    """The layer's convolution as it was written before: channels-first F.conv1d on the nn.Conv1d weight."""
    kernel = layer.conv1d.weight.shape[-1]
    known = 0 if tail is None else tail.shape[1]
    inputs = qkv if not known else torch.cat([tail.to(qkv.dtype), qkv], dim=1)
    channels_first = F.pad(inputs.transpose(1, 2).to(layer.conv1d.weight.dtype), (kernel - 1 - known, 0))
    mixed = F.conv1d(channels_first, layer.conv1d.weight, groups=qkv.shape[-1])
    return F.silu(mixed).transpose(1, 2).to(qkv.dtype)


@pytest.mark.parametrize("known", [0, 1, 3])
def test_layer_short_conv_with_and_without_a_tail(known):
    layer = _layer()
    channels = layer.conv1d.weight.shape[0]
    qkv = torch.randn(2, 13, channels, requires_grad=True)
    tail = torch.randn(2, known, channels) if known else None
    got = layer.short_conv(qkv, tail)
    (got_grad,) = torch.autograd.grad(got.square().sum(), qkv)
    got_weight_grad = torch.autograd.grad(layer.short_conv(qkv, tail).sum(), layer.conv1d.weight)[0]
    want = _conv1d_short_conv(layer, qkv, tail)
    (want_grad,) = torch.autograd.grad(want.square().sum(), qkv)
    want_weight_grad = torch.autograd.grad(_conv1d_short_conv(layer, qkv, tail).sum(), layer.conv1d.weight)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_weight_grad, want_weight_grad, rtol=1e-5, atol=1e-6)


def test_compiled_matches_eager():
    padded, weight = _inputs(2, 33, 8, 4, torch.float32)
    upstream = torch.randn(2, 33, 8)
    eager = _grads(causal_conv_silu, padded, weight, upstream)
    compiled = _grads(torch.compile(causal_conv_silu, backend="aot_eager", fullgraph=True), padded, weight, upstream)
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want)


def test_a_second_derivative_is_refused():
    padded, weight = _inputs(1, 5, 3, 4, torch.float64)
    out = causal_conv_silu(padded, weight.detach().double())
    (grad,) = torch.autograd.grad(out.square().sum(), padded, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


@pytest.mark.parametrize("compiled", [False, True])
def test_convolved_heads_are_the_split_convolution_each_contiguous(compiled, tmp_path, monkeypatch):
    """What the layer hands its KDA op: q, k, v of the convolution's output as three contiguous tensors (fla would
    copy strided slices), equal to the split views, gradients included; compiled as finetune compiles it (inductor's
    C++ backend here)."""
    layer = _layer()
    if compiled:
        from genolc.train.apply import apply_compile

        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
        apply_compile(layer)
    channels = layer.conv1d.weight.shape[0]
    qkv = torch.randn(2, 13, channels, requires_grad=True)
    tail = torch.randn(2, 3, channels)
    heads = layer.convolved_heads(qkv, tail)
    views = KimiDeltaAttention.split_heads(layer, KimiDeltaAttention.short_conv(layer, qkv, tail))
    assert all(t.is_contiguous() for t in heads) and not any(t.is_contiguous() for t in views)
    weights = [torch.randn_like(t) for t in views]
    got = torch.autograd.grad(sum((t * w).sum() for t, w in zip(heads, weights)), [qkv, layer.conv1d.weight])
    want = torch.autograd.grad(sum((t * w).sum() for t, w in zip(views, weights)), [qkv, layer.conv1d.weight])
    for mine, theirs in zip((*heads, *got), (*views, *want)):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
