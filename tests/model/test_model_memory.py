"""The reference path's largest tensor grows linearly in T (forward + backward), tracked op by op."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

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


@pytest.mark.parametrize("indexer_loss", [None, "sparse"])
def test_largest_tensor_is_linear_in_sequence_length(indexer_loss):
    # index_topk 16 keeps the selection sparse at these lengths; T=512 is large enough that activations, not
    # fixed-size per-chunk temporaries, are the largest tensors (so a [T, T] tensor would show as 4x).
    torch.manual_seed(0)
    model = build_model(preset("tiny").replace(index_topk=16))

    def step(length):
        ids = torch.randint(0, 16, (1, length), generator=torch.Generator().manual_seed(length))

        def run():
            out = model(ids, indexer_loss=indexer_loss)
            loss = out.logits.float().logsumexp(-1).mean() + sum(out.aux_losses.values())
            loss.backward()
        return run

    short, long = _largest(step(512)), _largest(step(1024))
    assert long.numel > short.numel, "the largest tensor should be an activation that grows with T"
    assert long.numel <= 2.05 * short.numel, f"T=512: {short.where}; T=1024: {long.where}"
