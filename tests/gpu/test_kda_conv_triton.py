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


@pytest.mark.parametrize("batch, length, channels, taps, dtype, config", [
    (1, 1, 5, 4, torch.float32, conv_triton.DEFAULT_BACKWARD_CONFIG),
    (2, 77, 40, 4, torch.float32, conv_triton.ConvBackwardConfig(segment_rows=8, segments=4, block_channels=32)),
    (3, 1031, 130, 3, torch.bfloat16, conv_triton.DEFAULT_BACKWARD_CONFIG),
    (1, 4099, 4608, 4, torch.bfloat16, conv_triton.DEFAULT_BACKWARD_CONFIG),     # `base`'s q, k, v channels
    (1, 2053, 3072, 4, torch.bfloat16, conv_triton.ConvBackwardConfig(segment_rows=128, segments=16,
                                                                      block_channels=64, num_warps=8)),
    (2, 300, 24, 2, torch.float16, conv_triton.ConvBackwardConfig(segment_rows=12, segments=2,
                                                                  block_channels=16)),
])
def test_kernel_matches_fp64_definition_and_torch_backward(batch, length, channels, taps, dtype, config,
                                                            monkeypatch):
    grad, padded, weight = _inputs(batch, length, channels, taps, dtype)
    exact = _exact(grad, padded, weight)
    poisoned = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: poisoned(t, **kw).fill_(float("nan")))
    d_padded, d_weight = conv_triton.conv_silu_backward(grad, padded, weight, config)
    monkeypatch.undo()
    torch_padded, torch_weight = conv.torch_conv_silu_backward(grad, padded, weight)
    assert d_padded.dtype == dtype and d_weight.dtype == torch.float32
    tolerance = 1e-5 if dtype == torch.float32 else 4e-3
    assert _relative(d_padded, exact[0]) < tolerance
    assert _relative(d_weight, exact[1]) < tolerance
    # The same fp32 sums in the same order: the two differ by a fused multiply-add's rounding, then bf16's.
    assert _relative(d_padded, torch_padded) < tolerance
    assert _relative(d_weight, torch_weight) < 1e-5


def test_op_routes_cuda_to_the_kernel_and_fp64_to_torch():
    grad, padded, weight = _inputs(1, 50, 24, 4, torch.bfloat16)
    got = conv.conv_silu_backward_op(grad, padded, weight)
    want = conv_triton.conv_silu_backward(grad, padded, weight)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    doubles = grad.double(), padded.double(), weight.double()
    torch.testing.assert_close(conv.conv_silu_backward_op(*doubles)[0], conv.torch_conv_silu_backward(*doubles)[0])


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
