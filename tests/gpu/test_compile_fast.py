"""The compiled per-token glue (genolc.train.apply.apply_compile) against the same modules run eagerly, on CUDA
under bf16 autocast, at odd lengths: outputs and every gradient (inputs and parameters). Needs CUDA.

The eager modules are the reference (their CPU parity with transformers is tested in tests/model). Compiled and
eager compute the same expressions; inductor fuses them and may reorder fp32 sums, so they agree to fp32 rounding
where the math is fp32, and to bf16 rounding (2^-8 relative per rounding) where autocast rounds (the norms'
outputs cast back to the input's dtype; the mixing logits come from the same custom op, TF32, in both). Then one
chunked training step of ``mini`` compiled and eager: the same loss to bf16 rounding (routing and index choices may
flip on near-ties, which moves single gradients but not the loss; see tests/gpu/test_model_fast_path.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model import build_model, preset  # noqa: E402
from genolc.train.apply import apply_compile  # noqa: E402
from genolc.train.chunked import chunked_forward_backward  # noqa: E402
from genolc.train.loss import LossTerms  # noqa: E402

pytestmark = pytest.mark.gpu

BF16_TOLERANCE = 2e-2       # relative max error (over the tensor's largest entry): a few bf16 ulps
LOSS_TOLERANCE = 2e-3


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


def _compare(eager_module, inputs, outputs_of, tolerance):
    eager_module.zero_grad(set_to_none=True)
    compiled_module = copy.deepcopy(eager_module)
    apply_compile(compiled_module)
    results, cotangents = [], None
    for module in (eager_module, compiled_module):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs = outputs_of(module, *leaves)
        if cotangents is None:
            cotangents = [torch.randn_like(o) for o in outs]
        torch.autograd.backward(outs, cotangents)
        results.append((outs, [leaf.grad for leaf in leaves], [p.grad for p in module.parameters()]))
    (e_outs, e_in, e_par), (c_outs, c_in, c_par) = results
    for e, c in zip(e_outs, c_outs):
        assert _relative(c, e) < tolerance
    for e, c in zip(e_in + e_par, c_in + c_par):
        assert (e is None) == (c is None)
        if e is not None:
            assert _relative(c, e) < tolerance


@pytest.mark.parametrize("length", [1000, 32771])
def test_hyper_connection_and_merge(length):
    torch.manual_seed(0)
    model = build_model(preset("small")).cuda()
    hc = model.layers[1].ffn_hc
    streams = torch.randn(1, length, 4, 1024, device="cuda")
    block_out = torch.randn(1, length, 1024, device="cuda", dtype=torch.bfloat16)

    def outputs_of(module, streams, block_out):
        post, comb, block_input, for_merge = module(streams)
        return [post, comb, block_input, module.merge(block_out, post, comb, for_merge)]

    _compare(hc, [streams, block_out], outputs_of, BF16_TOLERANCE)


@pytest.mark.parametrize("length", [1000, 32771])
def test_norms_and_short_conv(length):
    torch.manual_seed(0)
    model = build_model(preset("small")).cuda()
    norm = model.layers[0].input_layernorm
    _compare(norm, [torch.randn(1, length, 1024, device="cuda")], lambda m, x: [m(x)], BF16_TOLERANCE)
    kda = model.layers[0].self_attn
    gated = kda.o_norm
    _compare(gated, [torch.randn(1, length, 8, 128, device="cuda"), torch.randn(1, length, 8, 128, device="cuda")],
             lambda m, x, g: [m(x, g)], BF16_TOLERANCE)
    qkv = torch.randn(1, length, 3 * 1024, device="cuda", dtype=torch.bfloat16)
    tail = torch.randn(1, 3, 3 * 1024, device="cuda", dtype=torch.bfloat16)
    _compare(kda, [qkv, tail], lambda m, x, t: [m.short_conv(x, t)], BF16_TOLERANCE)
    _compare(kda, [qkv], lambda m, x: [m.short_conv(x)], BF16_TOLERANCE)
    _compare(kda, [qkv, tail], lambda m, x, t: list(m.convolved_heads(x, t)), BF16_TOLERANCE)


def test_chunked_step_loss_matches_eager():
    torch.manual_seed(0)
    eager = build_model(preset("mini")).cuda()
    compiled = copy.deepcopy(eager)
    apply_compile(compiled)
    length, chunk = 20011, 8192
    ids = torch.randint(0, 4, (1, length + 1), generator=torch.Generator().manual_seed(1)).cuda()
    weights = torch.ones(1, length, device="cuda")
    terms = LossTerms(total_weight=float(length), grad_accum=1, moe_balance_coef=0.0, indexer_kl_coef=1.0,
                      indexer_mode=None)
    losses = []
    for model in (eager, compiled):
        result = chunked_forward_backward(model, ids, weights, terms, chunk,
                                          lambda: torch.autocast("cuda", dtype=torch.bfloat16))
        losses.append(float(result.lm))
    assert abs(losses[1] - losses[0]) / losses[0] < LOSS_TOLERANCE, losses
