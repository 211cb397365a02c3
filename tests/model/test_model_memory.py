"""The reference path's largest tensor grows linearly in T (forward + backward), tracked op by op."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import genolc.model.indexer_loss as indexer_loss_module
from genolc.model import build_model, preset

import glm5_reference  # noqa: F401  (single-threaded torch for timing stability)


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op produces while active."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0
        self.where = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.numel() > self.numel:
                self.numel, self.where = tensor.numel(), f"{func} -> {tuple(tensor.shape)}"
        return out


def _largest(fn) -> LargestTensor:
    with LargestTensor() as record:
        fn()
    return record


def test_tracker_sees_quadratic_growth():
    def attention_scores(length):
        x = torch.randn(1, 2, length, 16)
        return lambda: (x @ x.transpose(-1, -2)).softmax(-1)

    assert _largest(attention_scores(1024)).numel == 4 * _largest(attention_scores(512)).numel


@pytest.mark.parametrize("indexer_loss", [None, "sparse", "dense"])
def test_largest_tensor_is_linear_in_sequence_length(indexer_loss, monkeypatch):
    """Forward + backward of the whole model (KDA, MoE, mHC and a DSA layer with its indexer and KL loss).

    index_topk 16 keeps the selection sparse at these lengths; under "dense" the DSA layer attends densely and the
    KL compares against dense attention. From T=1024 on, activations outgrow the fixed-size per-chunk temporaries
    (KDA's [B, H, 64, 64, Dk]); small KL budgets keep its [chunk, T] temporaries below them too, so only a
    tensor with a [T, T] factor could grow 4x. v_head_dim != qk_nope_head_dim so
    the dense attention cannot take SDPA's fused path without padding.
    """
    monkeypatch.setattr(indexer_loss_module, "CHUNK_BUDGET_ELEMENTS", 1 << 14)
    monkeypatch.setattr(indexer_loss_module, "TARGET_BUDGET_ELEMENTS", 1 << 14)
    torch.manual_seed(0)
    model = build_model(preset("tiny").replace(index_topk=16, v_head_dim=24))

    def step(length):
        ids = torch.randint(0, 16, (1, length), generator=torch.Generator().manual_seed(length))

        def run():
            out = model(ids, indexer_loss=indexer_loss)
            if indexer_loss is not None:
                assert "indexer_kl" in out.aux_losses
            loss = out.logits.float().logsumexp(-1).mean() + sum(out.aux_losses.values())
            loss.backward()
        return run

    short, long = _largest(step(1024)), _largest(step(2048))
    assert long.numel > short.numel, f"the largest tensor should be an activation that grows with T: {short.where}; {long.where}"
    assert long.numel <= 2.05 * short.numel, f"T=1024: {short.where}; T=2048: {long.where}"
