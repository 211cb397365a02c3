"""Grouped-GEMM experts (genolc.model.ops.moe.grouped_mm) against the per-expert reference op. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.layers.moe import Experts  # noqa: E402
from genolc.model.ops.moe.grouped_mm import grouped_experts  # noqa: E402
from genolc.model.ops.moe.reference import routed_experts  # noqa: E402
from genolc.model.presets import small  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n_tokens, chunk_tokens", [(5003, 65536), (20011, 4096), (131071, 65536)])
def test_matches_reference_experts(n_tokens, chunk_tokens, poison, rel_err):
    config = small()
    torch.manual_seed(n_tokens)
    experts = Experts(config).cuda().bfloat16()
    x = torch.randn(n_tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # Skewed routing: real DNA sends most tokens to a few experts; expert 5 gets none.
    skew = torch.linspace(3.0, 0.1, config.n_routed_experts, device="cuda")
    skew[5] = 0.0
    expert_ids = torch.multinomial(skew.expand(n_tokens, -1), config.num_experts_per_tok)
    weights = torch.rand(n_tokens, config.num_experts_per_tok, device="cuda")
    d_out = torch.randn(n_tokens, config.hidden_size, device="cuda")
    params = (x, experts.gate_up_proj, experts.down_proj)

    ref_out, ref_counts = routed_experts(x, expert_ids, weights, experts.gate_up_proj, experts.down_proj,
                                         experts.swiglu_limit)
    ref_grads = torch.autograd.grad((ref_out.float() * d_out).sum(), params)
    poison()
    out, counts = grouped_experts(x, expert_ids, weights, experts.gate_up_proj, experts.down_proj,
                                  experts.swiglu_limit, chunk_tokens=chunk_tokens)
    grads = torch.autograd.grad((out.float() * d_out).sum(), params)
    assert torch.equal(counts, ref_counts) and int(counts[5]) == 0
    assert rel_err(out, ref_out) < 1e-2
    for name, mine, theirs in zip(("x", "gate_up_proj", "down_proj"), grads, ref_grads):
        assert rel_err(mine, theirs) < 1e-2, name
