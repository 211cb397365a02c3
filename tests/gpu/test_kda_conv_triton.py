"""KDA's convolution backward kernel (genolc/model/ops/kda/conv_triton.py) and its custom op on CUDA against fp64
autograd of the definition (F.conv1d + SiLU), and the compiled layer against its eager self. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.layers.kda import KimiDeltaAttention  # noqa: E402
from genolc.model.ops.kda import conv, conv_triton  # noqa: E402
from genolc.model.presets import tiny  # noqa: E402

pytestmark = pytest.mark.gpu


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm())


def _inputs(batch, length, channels, taps, dtype):
    gen = torch.Generator(device="cuda").manual_seed(length * 3 + channels)
    padded = torch.randn(batch, length + taps - 1, channels, generator=gen, device="cuda").to(dtype)
    weight = torch.randn(channels, taps, generator=gen, device="cuda") / taps
    grad = torch.randn(batch, length, channels, generator=gen, device="cuda").to(dtype)
    return grad, padded, weight


def _exact(grad, padded, weight):
    leaves = padded.double().requires_grad_(), weight.double().requires_grad_()
    return torch.autograd.grad(conv.reference_causal_conv_silu(*leaves), leaves, grad.double())


@pytest.mark.parametrize("batch, length, channels, taps, dtype, parts, config", [
    (1, 1, 5, 4, torch.float32, 1, conv_triton.DEFAULT_CONFIG),
    (2, 77, 40, 4, torch.float32, 1, conv_triton.ConvKernelConfig(segment_rows=8, segments=4, block_channels=32)),
    (3, 1031, 130, 3, torch.bfloat16, 1, conv_triton.DEFAULT_CONFIG),
    (1, 4099, 4608, 4, torch.bfloat16, 3, conv_triton.DEFAULT_CONFIG),     # `base`'s q, k, v
    (1, 2053, 3072, 4, torch.bfloat16, 3, conv_triton.ConvKernelConfig(segment_rows=128, segments=16,
                                                                         block_channels=64, num_warps=8)),
    (2, 300, 32, 2, torch.float16, 2, conv_triton.ConvKernelConfig(segment_rows=12, segments=2,
                                                                     block_channels=16)),
])
def test_kernels_match_fp64_definition_and_torch_code(batch, length, channels, taps, dtype, parts, config,
                                                      monkeypatch):
    grad, padded, weight = _inputs(batch, length, channels, taps, dtype)
    grads = [g.contiguous() for g in grad.chunk(parts, -1)]
    exact = _exact(grad, padded, weight)
    exact_out = conv.reference_causal_conv_silu(padded.double(), weight.double())
    poisoned = torch.empty_like, torch.Tensor.new_empty
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: poisoned[0](t, **kw).fill_(float("nan")))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda t, *a, **kw: poisoned[1](t, *a, **kw).fill_(float("nan")))
    outs = conv_triton.conv_silu_forward(padded, weight, parts, config)
    d_padded, d_weight = conv_triton.conv_silu_backward(grads, padded, weight, config)
    monkeypatch.undo()
    torch_outs = conv.torch_conv_silu_parts(padded, weight, parts)
    torch_padded, torch_weight = conv.torch_conv_silu_backward(grads, padded, weight)
    tolerance = 1e-5 if dtype == torch.float32 else 4e-3
    assert len(outs) == parts and all(o.is_contiguous() and o.dtype == dtype for o in outs)
    assert _relative(torch.cat(outs, -1), exact_out) < tolerance
    assert _relative(torch.cat(outs, -1), torch.cat(torch_outs, -1)) < tolerance
    assert d_padded.dtype == dtype and d_weight.dtype == torch.float32
    assert _relative(d_padded, exact[0]) < tolerance
    assert _relative(d_weight, exact[1]) < tolerance
    # The same fp32 sums in the same order: the two differ by a fused multiply-add's rounding, then bf16's.
    assert _relative(d_padded, torch_padded) < tolerance
    assert _relative(d_weight, torch_weight) < 1e-5


def test_ops_route_cuda_to_the_kernels_and_the_rest_to_torch():
    grad, padded, weight = _inputs(1, 50, 384, 4, torch.bfloat16)
    grads = [g.contiguous() for g in grad.chunk(3, -1)]
    assert all(torch.equal(a, b) for a, b in zip(conv.conv_silu_op(padded, weight, 3),
                                                 conv_triton.conv_silu_forward(padded, weight, 3)))
    got = conv.conv_silu_backward_op(grads, padded, weight)
    want = conv_triton.conv_silu_backward(grads, padded, weight)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    doubles = [g.double() for g in grads], padded.double(), weight.double()
    torch.testing.assert_close(conv.conv_silu_backward_op(*doubles)[0], conv.torch_conv_silu_backward(*doubles)[0])
    # Parts that are not whole channel blocks (3 x 8 channels) go to torch too.
    small = _inputs(1, 20, 24, 4, torch.bfloat16)[1:]
    torch.testing.assert_close(conv.conv_silu_op(*small, 3), list(conv.torch_conv_silu_parts(*small, 3)))


def test_compiled_layer_backward_matches_eager(tmp_path, monkeypatch):
    """``convolved_heads`` compiled as finetune compiles it (the backward's custom op in inductor's graph) gives
    the eager layer's gradients, with a chunk's tail."""
    from genolc.train.apply import apply_compile

    torch.manual_seed(0)
    eager = KimiDeltaAttention(tiny(), layer_idx=0).cuda()
    compiled = KimiDeltaAttention(tiny(), layer_idx=0).cuda()
    compiled.load_state_dict(eager.state_dict())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    apply_compile(compiled)
    channels = eager.conv1d.weight.shape[0]
    qkv = torch.randn(1, 1000, channels, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    tail = torch.randn(1, 3, channels, device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(1, 1000, eager.num_heads, eager.head_dim, device="cuda") for _ in range(3)]
    results = []
    for layer in (eager, compiled):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            heads = layer.convolved_heads(qkv, tail)
        loss = sum((h.float() * w).sum() for h, w in zip(heads, weights))
        results.append(torch.autograd.grad(loss, (qkv, layer.conv1d.weight)))
    for mine, theirs in zip(*results):
        assert _relative(mine, theirs) < 4e-3
