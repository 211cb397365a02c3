"""One rank's micro-batch under context parallelism, and the mesh-wide gradient reduction.

Every rank of a CP group reads the same whole window (the sampler draws per data-parallel rank only) and takes
its pieces of the inputs, targets and target weights (genolc/parallel/layout.py). The loss is the window's:
``sum(w * CE)`` over this rank's targets divided by the step's total weight over all ranks, so the ranks' losses
add up to the single-process loss, and so do their gradients. The auxiliary losses are already shares
(genolc/parallel/context.py). After the step's micro-batches, :func:`all_reduce_gradients` sums every parameter's
gradient over the whole mesh (DP and CP ranks alike: a DDP-style all-reduce, in buckets); every replica then
takes the same optimizer step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from genolc.parallel.context import ContextParallel
from genolc.train.chunked import MicroBatchResult
from genolc.train.loss import LossTerms
from genolc.train.strategy import whole_forward_backward

# Gradient all-reduce bucket: large enough to keep the collective efficient, small enough that the flat copy stays
# a small fraction of a GPU (the base preset's fp32 gradients are 7.7 GB).
BUCKET_BYTES = 256 * 1024 * 1024


def context_parallel_forward_backward(model: torch.nn.Module, context: ContextParallel, ids: torch.Tensor,
                                      weights: torch.Tensor, terms: LossTerms,
                                      autocast: Callable[[], AbstractContextManager],
                                      on_loss: Callable[[torch.Tensor], torch.Tensor]) -> MicroBatchResult:
    """Forward and backward of this rank's share of ``ids [B, T + 1]`` (the whole window, weights ``[B, T]``);
    ``.grad`` accumulates this rank's share of the window's gradient (sum them with :func:`all_reduce_gradients`)."""
    context.set_window(ids.shape[1] - 1)
    return whole_forward_backward(model, context.local(ids[:, :-1]), context.local(ids[:, 1:]),
                                  context.local(weights), terms, autocast, on_loss)


@torch.no_grad()
def all_reduce_gradients(model: torch.nn.Module, group=None) -> None:
    """Sum every trainable parameter's ``.grad`` over ``group`` (default: all ranks), in place.

    A parameter without a gradient on this rank (no token reached it) takes part with zeros, so every rank runs the
    same collectives and ends with the same gradients."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params:
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= BUCKET_BYTES:
            _reduce_bucket(bucket, group)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, group)


def _reduce_bucket(grads: list[torch.Tensor], group) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors(same)
        dist.all_reduce(flat, group=group)
        for grad, reduced in zip(same, _unflatten_dense_tensors(flat, same)):
            grad.copy_(reduced)
