"""Collectives whose gradients are exact, for tensors that enter the loss on other ranks.

:func:`all_gather` stacks every rank's tensor; its backward is the reduce-scatter of the gradient (each rank gets the
sum over ranks of the gradient that reached its own tensor). gloo has no reduce-scatter, so there it is an all-reduce
followed by taking this rank's slice: the same sum. :func:`all_to_all` sends row ``r`` of a ``[size, ...]`` tensor to
rank ``r``; its backward is the same exchange of the gradient the other way (gloo and NCCL both have it).

Every rank must run the same collectives in the same order, in backward too. A rank whose loss does not use what it
gathered (CP rank 0 reads no earlier rank's rows) would skip the gather's backward and leave the others waiting;
:func:`anchor` ties gathered tensors into a result the loss uses, with a zero gradient, so that every rank's
backward reaches every gather, in the order the graph fixes (a layer's gathers run after the next layer's).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor, group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group = ctx.group
        rank = dist.get_rank(group)
        grad = grad.contiguous()
        if dist.get_backend(group) == "nccl":
            own = torch.empty_like(grad[0])
            dist.reduce_scatter_tensor(own.view(-1), grad.view(-1), group=group)
            return own, None
        dist.all_reduce(grad, group=group)
        return grad[rank].clone(), None


def all_gather(tensor: torch.Tensor, group) -> torch.Tensor:
    """``[size, *tensor.shape]``: every rank's ``tensor`` of the group, in group-rank order (same shape on all)."""
    return _AllGather.apply(tensor, group)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        dist.all_to_all_single(received, tensor, group=group)
        return received

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Row r of the result came from rank r's row ``rank``: its gradient goes back there by the same exchange.
        grad = grad.contiguous()
        returned = torch.empty_like(grad)
        dist.all_to_all_single(returned, grad, group=ctx.group)
        return returned, None


def all_to_all(tensor: torch.Tensor, group) -> torch.Tensor:
    """``tensor [size, ...]`` (the same shape on every rank of the group) -> ``[size, ...]`` whose row ``r`` is row
    ``rank`` of rank ``r``'s ``tensor``."""
    if tensor.shape[0] != dist.get_world_size(group):
        raise ValueError(f"all_to_all needs one row per rank ({dist.get_world_size(group)}), got {tuple(tensor.shape)}")
    return _AllToAll.apply(tensor, group)


class _Anchor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, result: torch.Tensor, *tied: torch.Tensor) -> torch.Tensor:
        ctx.tied = [(t.shape, t.dtype, t.device) for t in tied]
        return result.view_as(result)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        zeros = [torch.zeros((), dtype=dtype, device=device).expand(shape) for shape, dtype, device in ctx.tied]
        return (grad, *zeros)


def anchor(result: torch.Tensor, *tied: torch.Tensor) -> torch.Tensor:
    """``result`` unchanged, with ``tied`` (tensors that may require grad) in its graph with a zero gradient."""
    tied = tuple(t for t in tied if t is not None and t.requires_grad)
    if not tied or not torch.is_grad_enabled():
        return result
    return _Anchor.apply(result, *tied)


def all_reduce_sum(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """In-place sum over ``group`` (no autograd): counts, metrics, gradients."""
    dist.all_reduce(tensor, group=group)
    return tensor


def all_reduce_counts(counts: dict[int, torch.Tensor], group=None) -> dict[int, torch.Tensor]:
    """Tokens per expert (layer -> ``[E]``) summed over ``group``; every rank must hold the same layers."""
    reduced = {}
    for layer in sorted(counts):
        total = counts[layer].to(torch.int64).clone()
        dist.all_reduce(total, group=group)
        reduced[layer] = total
    return reduced


def broadcast_module(module: torch.nn.Module, src: int = 0, group=None) -> None:
    """Every parameter and buffer of ``module`` set, in place, to rank ``src``'s: replicas initialised on their own
    GPUs draw from CUDA generators whose streams depend on the GPU model, and nothing else makes them equal."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=src, group=group)
