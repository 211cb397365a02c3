"""The sparse indexer KL per query row, fused: one Triton program per (query, batch row) each way.

Same contract as :func:`genolc.model.ops.indexer_kl.reference.sparse_kl_rows`. The reference gathers every row's
selected pool keys into a ``[B, C, K, Di]`` fp32 tensor, scores them per head, and autograd keeps the per-head dots
and the softmax's intermediates. On the H200 (benchmarks/results/mhc_alias_indexer_kl_2026-12-05/: 64k queries over
512k keys at `small`'s shapes) that side took about 84 ms forward and backward; these kernels took 29 ms with IEEE
products (11.5 + 17.7) and about 8.6 with TF32 ones (see below).

Forward (:func:`sparse_kl_rows`): the program walks its row's ``K = topk / kpool`` pool slots in blocks, reads
each slot's pool from its index row (the entry ``j * kpool``, divided by kpool; nothing copied out of the rows),
gathers the pools' keys (fp32, from ``pooled``; an empty slot is not read), takes the dots with its ``Hi`` query heads
(padded to 16 for the product) and the scores ``sum_h w[h] relu(scale dot[h])``, writes them to a scratch row and
keeps an online log-sum-exp over the slots that hold a pool, their count and the target's sum. A second pass over
the scratch row (in L2) gives the KL and ``sum_p u_p`` with ``u = target * rho / (rho + eps)``, which the backward
needs. Saved per row: the log-sum-exp's max and log-sum apart (their sum would round a large score's low bits
away), the target's sum, ``sum_p u_p`` and the pool count (20 bytes); besides them the function keeps its inputs,
views or tensors the step keeps anyway except ``pool_mass`` (``K`` floats a query, as the checkpoint it replaces
kept). A NaN score makes the row's KL NaN, as in the reference.

Backward: the program forms the scores again in the forward's blocks (the same bits), ``d score_p = g * (rho_p
sum_q u_q - u_p)`` (the exact derivative of ``-sum_p pi_p log(rho_p + eps)``), then the head weights' and the
queries' gradients in registers and the pool keys' with fp32 atomics into a ``[B, P, Di]`` buffer (one ``Di`` row
per slot; ``pooled`` of a 512k window is 32 MiB at Di = 64, within the L2), cast to ``pooled``'s dtype at the end.
The atomics make that gradient's low bits vary from run to run (genolc/determinism.py lists it with the DSA
backward's).

Products in TF32 on the tensor cores for bf16/fp16 queries (training under autocast; :func:`dot_precision`): the
fp32 keys rounded to 10 mantissa bits (the 16-bit queries pass exactly), about 5e-4 relative per product. On the
H200 (benchmarks/results/indexer_kl_lse_2026-12-05/, 64k queries over 512k keys, the target included) the loss took
22.6 ms forward and backward at `small` against 43.4 with IEEE products (the reference's ``.float()``), 45.1 against
65.7 at `base`: the IEEE products ran on the FMA units and bound the kernels, not the gather. The loss moved by 7e-4
relative and the gradients' norms by 1e-3. The indexer's own selection scores its pools with bf16 products under
autocast (genolc/model/ops/indexer/triton.py), coarser still. fp32 queries (training without autocast) take IEEE
products unless torch's fp32 matmuls may use TF32 (``torch.backends.cuda.matmul.allow_tf32``); IEEE products agree
with the reference to fp32 summation order. Up to ``MAX_HEADS`` heads of ``MAX_DIM`` dimensions (the presets' 8 x
64; GLM-5.3-Flash's own 32 x 128 spilled thousands of bytes a thread on sm_90 and takes the reference). Runs on
CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests/gpu/triton_interpreter_check.py). Imports Triton at call
time.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from genolc.model.ops.indexer_kl.reference import check_sparse_inputs

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEADS = 16
MAX_DIM = 128
# Slots a step, the same both ways (the backward's scores must be the forward's bits). On the H200 (2026-12-05,
# benchmarks/results/mhc_alias_indexer_kl_2026-12-05/, `small`, 64k queries over 512k keys) forward + backward took
# 29.2 ms at 64 slots, 46.5 at 32 and 46.2 at 16, though sm_90 holds the backward at 250 registers at 64
# (tests/gpu/triton_lowering_check.py builds this step; 168 at 32 and 80 at 16 when it built those), none spilled.
# With TF32 products (indexer_kl_lse_2026-12-05/, the target included) 64 slots took 22.6 ms and 128 took 22.2: kept.
BLOCK_P = 64
NUM_WARPS = 4
# None: the products' precision follows the queries (see :func:`dot_precision`); "ieee" or "tf32" forces one
# (benchmarks/bench_indexer_kl.py --precision times the two).
DOT_PRECISION: str | None = None
STATS = 5


@functools.cache
def _kernels():
    from genolc.model.ops.indexer_kl import kernels

    return kernels.sparse_kl_forward_kernel, kernels.sparse_kl_backward_kernel


def unsupported_reason(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor) -> str | None:
    """Why the kernels cannot take these operands (a dtype outside ``KERNEL_DTYPES``, more than ``MAX_HEADS`` heads
    or ``MAX_DIM`` dimensions, operands on several devices), or None. Pure torch: no Triton import."""
    for name, tensor in (("index_q", index_q), ("head_weights", head_weights), ("pooled", pooled)):
        if tensor.dtype not in KERNEL_DTYPES:
            return f"{name} of dtype {tensor.dtype} (the kernels take {KERNEL_DTYPES})"
        if tensor.device != index_q.device:
            return f"{name} on {tensor.device} and index_q on {index_q.device}"
    if index_q.dim() == 4 and (index_q.shape[2] > MAX_HEADS or index_q.shape[3] > MAX_DIM):
        return f"{index_q.shape[2]} heads of {index_q.shape[3]} dimensions (at most {MAX_HEADS} of {MAX_DIM})"
    return None


def dot_precision(query_dtype: torch.dtype) -> str:
    """The kernels' products for queries of ``query_dtype``: ``DOT_PRECISION`` when set; else TF32 for 16-bit
    queries (training under autocast, whose own products are bf16) and, for fp32 ones, what torch's fp32 matmuls
    do (``torch.backends.cuda.matmul.allow_tf32``; IEEE by default)."""
    if DOT_PRECISION is not None:
        return DOT_PRECISION
    return "tf32" if query_dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _tiles(heads: int, dim: int, kpool: int, precision: str) -> dict:
    import triton

    return {"HEADS": heads, "DIM": dim, "KPOOL": kpool, "BLOCK_H": max(16, triton.next_power_of_2(heads)),
            "BLOCK_D": max(16, triton.next_power_of_2(dim)), "BLOCK_P": BLOCK_P, "PRECISION": precision}


def _prepared(pool_mass, index_q, head_weights, pooled, indices, kpool, topk):
    check_sparse_inputs(pool_mass, index_q, head_weights, pooled, indices, kpool=kpool, topk=topk)
    reason = unsupported_reason(index_q, head_weights, pooled)
    if reason is not None:
        raise ValueError(f"the fused indexer KL does not take {reason}; use genolc.model.ops.indexer_kl.reference")
    # The kernels index the last dimension of each operand contiguously (and q's last two together).
    index_q = index_q if index_q.stride(-1) == 1 else index_q.contiguous()
    head_weights = head_weights if head_weights.stride(-1) == 1 else head_weights.contiguous()
    pooled = pooled if pooled.stride(-1) == 1 else pooled.contiguous()
    indices = indices if indices.stride(-1) == 1 else indices.contiguous()
    pool_mass = pool_mass.float()
    pool_mass = pool_mass if pool_mass.stride(-1) == 1 else pool_mass.contiguous()
    return pool_mass, index_q, head_weights, pooled, indices


def _strides(index_q, head_weights, pooled, indices, pool_mass) -> tuple[int, ...]:
    return (index_q.stride(0), index_q.stride(1), index_q.stride(2), head_weights.stride(0), head_weights.stride(1),
            pooled.stride(0), pooled.stride(1), indices.stride(0), indices.stride(1), pool_mass.stride(0),
            pool_mass.stride(1))


def forward(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
            indices: torch.Tensor, softmax_scale: float, *, kpool: int, topk: int,
            precision: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(``kl [B, C]``, ``stats [B, C, STATS]``: per row the log-sum-exp's max and log-sum, the target's sum,
    ``sum_p u_p`` and the count of slots holding a pool), fp32. ``precision``: the products' (default
    :func:`dot_precision` of the queries); the backward must be given the same."""
    pool_mass, index_q, head_weights, pooled, indices = _prepared(pool_mass, index_q, head_weights, pooled, indices,
                                                                  kpool, topk)
    batch, rows, heads, dim = index_q.shape
    slots = topk // kpool
    kl = torch.empty((batch, rows), dtype=torch.float32, device=index_q.device)
    stats = torch.empty((batch, rows, STATS), dtype=torch.float32, device=index_q.device)
    if batch * rows == 0:
        return kl, stats
    scratch = torch.empty((batch, rows, slots), dtype=torch.float32, device=index_q.device)
    _kernels()[0][(rows, batch)](index_q, head_weights, pooled, indices, pool_mass, scratch, kl, stats,
                                 softmax_scale, rows, slots,
                                 *_strides(index_q, head_weights, pooled, indices, pool_mass),
                                 **_tiles(heads, dim, kpool, precision or dot_precision(index_q.dtype)),
                                 num_warps=NUM_WARPS)
    return kl, stats


def backward(grad: torch.Tensor, pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor,
             pooled: torch.Tensor, indices: torch.Tensor, stats: torch.Tensor, softmax_scale: float, *, kpool: int,
             topk: int, pooled_grad: bool = True,
             precision: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The gradients of ``sum(grad * kl)`` with respect to ``index_q``, ``head_weights`` and ``pooled`` (None
    without ``pooled_grad``: no atomics then), each in its input's dtype; ``precision`` as the forward's."""
    pool_mass, index_q, head_weights, pooled, indices = _prepared(pool_mass, index_q, head_weights, pooled, indices,
                                                                  kpool, topk)
    batch, rows, heads, dim = index_q.shape
    if grad.shape != (batch, rows) or stats.shape != (batch, rows, STATS):
        raise ValueError(f"grad must be [{batch}, {rows}] and stats [{batch}, {rows}, {STATS}], got "
                         f"{tuple(grad.shape)} and {tuple(stats.shape)}")
    d_query = torch.empty((batch, rows, heads, dim), dtype=index_q.dtype, device=index_q.device)
    d_weights = torch.empty((batch, rows, heads), dtype=head_weights.dtype, device=index_q.device)
    d_pooled = torch.zeros(pooled.shape if pooled_grad else (1, 1), dtype=torch.float32, device=index_q.device)
    if batch * rows:
        _kernels()[1][(rows, batch)](grad, index_q, head_weights, pooled, indices, pool_mass, stats.contiguous(),
                                     d_query, d_weights, d_pooled, softmax_scale, rows, topk // kpool,
                                     *_strides(index_q, head_weights, pooled, indices, pool_mass),
                                     grad.stride(0), grad.stride(1), d_pooled.stride(0), d_pooled.stride(1),
                                     **_tiles(heads, dim, kpool, precision or dot_precision(index_q.dtype)),
                                     POOLED_GRAD=pooled_grad, num_warps=NUM_WARPS)
    return d_query, d_weights, d_pooled.to(pooled.dtype) if pooled_grad else None


class SparseIndexerKL(torch.autograd.Function):
    """(``kl [B, C]``, ``has_pool [B, C]``) with the kernels' backward; ``pool_mass`` and ``indices`` take no
    gradient. Saves its inputs and ``STATS`` floats a row."""

    @staticmethod
    def forward(ctx, pool_mass, index_q, head_weights, pooled, indices, softmax_scale, kpool, topk):
        # Chosen once: the backward forms the forward's scores again and must take the same products.
        precision = dot_precision(index_q.dtype)
        kl, stats = forward(pool_mass, index_q, head_weights, pooled, indices, softmax_scale, kpool=kpool, topk=topk,
                            precision=precision)
        ctx.save_for_backward(pool_mass, index_q, head_weights, pooled, indices, stats)
        ctx.softmax_scale, ctx.kpool, ctx.topk, ctx.precision = softmax_scale, kpool, topk, precision
        has_pool = stats[..., 4] > 0
        ctx.mark_non_differentiable(has_pool)
        return kl, has_pool

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_kl, grad_has):
        pool_mass, index_q, head_weights, pooled, indices, stats = ctx.saved_tensors
        d_query, d_weights, d_pooled = backward(grad_kl, pool_mass, index_q, head_weights, pooled, indices, stats,
                                                ctx.softmax_scale, kpool=ctx.kpool, topk=ctx.topk,
                                                pooled_grad=ctx.needs_input_grad[3], precision=ctx.precision)
        return None, d_query, d_weights, d_pooled, None, None, None, None


def sparse_kl_rows(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
                   indices: torch.Tensor, softmax_scale: float, *, kpool: int,
                   topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.sparse_kl_rows`` with the fused kernels both ways (ValueError for operands
    :func:`unsupported_reason` names)."""
    return SparseIndexerKL.apply(pool_mass, index_q, head_weights, pooled, indices, softmax_scale, kpool, topk)
