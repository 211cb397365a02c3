"""The chunk-recurrent step against the whole-window step on the GPU: `small` at 64k tokens, bf16, fast kernels.

Same weights, same window (random A/C/G/T tokens; the CPU tests use real DNA), indexer KL ("sparse") and the MoE
balance loss on. The whole window runs with per-layer recompute (it would not fit otherwise); the chunked
step runs 16k chunks. Both are bf16 with fp32 master weights, so they agree to bf16 rounding, not bitwise: the loss
to 1e-3 relative, every parameter's gradient to a few percent (relative L2), all of them together to 1 %.
"""

from __future__ import annotations

import time

import pytest
import torch

from genolc.model import build_model, preset
from genolc.train.apply import apply_recompute
from genolc.train.chunked import chunked_forward_backward
from genolc.train.loss import LossTerms, micro_batch_loss

pytestmark = pytest.mark.gpu

LENGTH = 65536
CHUNK = 16384


def _window(length: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 4, (1, length + 1), generator=generator)


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().float().clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_chunked_step_matches_whole_window_small_64k():
    torch.manual_seed(0)
    model = build_model(preset("small")).cuda()
    ids = _window(LENGTH).cuda()
    weights = torch.ones(1, LENGTH, device="cuda")
    weights[0, 1000:1500] = 0.0
    terms = LossTerms(total_weight=float(weights.sum()), grad_accum=1, moe_balance_coef=0.01, indexer_kl_coef=1.0,
                      indexer_mode="sparse")

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16)

    started = time.monotonic()
    result = chunked_forward_backward(model, ids, weights, terms, CHUNK, autocast)
    chunked = _grads(model)
    print(f"chunked step: {time.monotonic() - started:.1f} s", flush=True)
    chunked_peak = torch.cuda.max_memory_allocated() / 2 ** 30
    model.zero_grad(set_to_none=True)

    apply_recompute(model)
    torch.cuda.reset_peak_memory_stats()
    with autocast():
        out = model(ids[:, :-1], indexer_loss="sparse")
    parts = micro_batch_loss(out, ids[:, 1:], weights, terms)
    parts.loss.backward()
    whole = _grads(model)
    print(f"whole-window step: {time.monotonic() - started:.1f} s since the start", flush=True)
    whole_peak = torch.cuda.max_memory_allocated() / 2 ** 30

    print(f"lm: chunked {float(result.lm):.6f} whole {float(parts.lm):.6f}; aux chunked "
          f"{ {k: float(v) for k, v in result.aux.items()} } whole { {k: float(v) for k, v in parts.aux.items()} }; "
          f"peak GiB chunked {chunked_peak:.1f} whole (recompute) {whole_peak:.1f}")
    assert float(result.lm) == pytest.approx(float(parts.lm), rel=1e-3)
    for name in ("moe_balance", "indexer_kl"):
        assert float(result.aux[name]) == pytest.approx(float(parts.aux[name]), rel=2e-2)
    assert set(chunked) == set(whole)
    errors = {name: float((chunked[name] - whole[name]).norm() / whole[name].norm().clamp_min(1e-30))
              for name in whole}
    worst = sorted(errors.items(), key=lambda item: -item[1])[:8]
    print("worst relative L2 gradient errors:", worst)
    total = float(torch.sqrt(sum(((chunked[n] - whole[n]) ** 2).sum() for n in whole))
                  / torch.sqrt(sum((whole[n] ** 2).sum() for n in whole)))
    print(f"all gradients: relative L2 error {total:.2e}")
    assert total < 1e-2
    assert worst[0][1] < 5e-2, worst
