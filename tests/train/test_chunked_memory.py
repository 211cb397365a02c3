"""Peak tensor memory of the chunked step with per-layer recompute, measured on CPU against the plan.

The backward's replay of a checkpointed layer used to write the chunk cache: the entries it wrote held the replay's
graph, so every layer's recomputed activations stayed alive until the chunk's backward ended (tiny, 2k window, 512
chunks: 2.1x the plan; `base` at 1M on the H200: 92 GiB against 69.6 planned then). Memory is counted by
tests/tensor_memory.py's PeakTensorBytes.
"""

from __future__ import annotations

import torch

from genolc.model import build_model, preset
from genolc.train.apply import apply_recompute
from genolc.train.chunked import chunked_forward_backward
from genolc.train.loss import LossTerms
from genolc.train.plan import estimate_chunked_memory
from tensor_memory import PeakTensorBytes


def test_recompute_inside_chunks_keeps_one_layer_of_activations():
    torch.manual_seed(0)
    config = preset("tiny")
    model = build_model(config)
    apply_recompute(model)
    window, chunk = 1024, 512
    ids = torch.randint(0, 4, (1, window + 1), generator=torch.Generator().manual_seed(0))
    weights = torch.ones(1, window)
    terms = LossTerms(total_weight=float(window), grad_accum=1, moe_balance_coef=0.01, indexer_kl_coef=1.0,
                      indexer_mode="sparse")
    tracker = PeakTensorBytes()
    with tracker:
        chunked_forward_backward(model, ids, weights, terms, chunk, lambda: torch.autocast("cpu", enabled=False))
    gradients = sum(p.numel() for p in model.parameters()) * 4
    plan = estimate_chunked_memory(config, seq_len=window, chunk=chunk, recompute=True, bf16=False)
    planned = plan.activations + plan.logits
    assert tracker.peak - gradients <= 1.2 * planned, (tracker.peak - gradients, planned)
