"""The sparse indexer KL per query row, fused: one Triton program per (query, batch row) each way.

Same contract as :func:`genolc.model.ops.indexer_kl.reference.sparse_kl_rows`. The reference gathers every row's
selected pool keys into a ``[B, C, K, Di]`` fp32 tensor, scores them per head, and autograd keeps the per-head dots
and the softmax's intermediates; in `small`'s 512k step with ``--indexer sparse`` that side took about 50 of the
loss's 65 ms per 32k queries and layer, its gather and fp32 copies the largest part (H200,
benchmarks/results/indexer_kl_2026-12-04/).

Forward (:func:`sparse_kl_rows`): the program walks its row's ``K`` pool slots in blocks, gathers the pools' keys
(fp32, from ``pooled``; an empty slot is not read), takes the dots with its ``Hi`` query heads (padded to 16 for the
product) and the scores ``sum_h w[h] relu(scale dot[h])``, writes them to a scratch row and keeps an online
log-sum-exp over the slots that hold a pool and the target's sum. A second pass over the scratch row (in L2) gives
the KL and ``sum_p u_p`` with ``u = target * rho / (rho + eps)``, which the backward needs. Saved per row: the
log-sum-exp (+inf for a row without a pool), the target's sum and ``sum_p u_p`` (12 bytes).

Backward: the program gathers the keys and forms the scores again, ``d score_p = g * (rho_p sum_q u_q - u_p)``
(the exact derivative of ``-sum_p pi_p log(rho_p + eps)``), then the head weights' and the queries' gradients in
registers and the pool keys' with fp32 atomics into a ``[B, P, Di]`` buffer (one ``Di`` row per slot; ``pooled``
of a 512k window is 32 MiB at Di = 64, within the L2), cast to ``pooled``'s dtype at the end.

Products in IEEE fp32 (the reference's ``.float()``; a few MFLOP a row, the kernels are bound by the gather), so
the two agree to fp32 summation order. Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``
(tests/gpu/triton_interpreter_check.py). Imports Triton at call time.
"""

from __future__ import annotations

import functools

import torch

from genolc.model.ops.indexer_kl.reference import check_sparse_inputs

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEADS = 64
MAX_DIM = 256
# Slots a step. Not timed yet (no device): sm_90 builds hold the backward at 250 registers with 64 slots a step, 168
# with 32 and 80 with 16, the forward at 80 with 64 (tests/gpu/triton_lowering_check.py).
FORWARD_BLOCK_P = 64
BACKWARD_BLOCK_P = 32
NUM_WARPS = 4


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


def _tiles(heads: int, dim: int, block_p: int) -> dict:
    import triton

    return {"HEADS": heads, "DIM": dim, "BLOCK_H": max(16, triton.next_power_of_2(heads)),
            "BLOCK_D": max(16, triton.next_power_of_2(dim)), "BLOCK_P": block_p}


def _prepared(pool_mass, index_q, head_weights, pooled, pools):
    check_sparse_inputs(pool_mass, index_q, head_weights, pooled, pools)
    reason = unsupported_reason(index_q, head_weights, pooled)
    if reason is not None:
        raise ValueError(f"the fused indexer KL does not take {reason}; use genolc.model.ops.indexer_kl.reference")
    if pool_mass.dtype != torch.float32:
        raise ValueError(f"pool_mass must be float32, got {pool_mass.dtype}")
    # The kernels index the last dimension of each operand contiguously (and q's last two together).
    index_q = index_q if index_q.stride(-1) == 1 else index_q.contiguous()
    head_weights = head_weights if head_weights.stride(-1) == 1 else head_weights.contiguous()
    pooled = pooled if pooled.stride(-1) == 1 else pooled.contiguous()
    pools = pools if pools.stride(-1) == 1 else pools.contiguous()
    pool_mass = pool_mass if pool_mass.stride(-1) == 1 else pool_mass.contiguous()
    return pool_mass, index_q, head_weights, pooled, pools


def _strides(index_q, head_weights, pooled, pools, pool_mass) -> tuple[int, ...]:
    return (index_q.stride(0), index_q.stride(1), index_q.stride(2), head_weights.stride(0), head_weights.stride(1),
            pooled.stride(0), pooled.stride(1), pools.stride(0), pools.stride(1), pool_mass.stride(0),
            pool_mass.stride(1))


def forward(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
            pools: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(``kl [B, C]``, ``stats [B, C, 3]``: each row's log-sum-exp, target sum and ``sum_p u_p``), fp32."""
    pool_mass, index_q, head_weights, pooled, pools = _prepared(pool_mass, index_q, head_weights, pooled, pools)
    batch, rows, heads, dim = index_q.shape
    slots = pools.shape[-1]
    kl = torch.empty((batch, rows), dtype=torch.float32, device=index_q.device)
    stats = torch.empty((batch, rows, 3), dtype=torch.float32, device=index_q.device)
    if batch * rows == 0:
        return kl, stats
    scratch = torch.empty((batch, rows, slots), dtype=torch.float32, device=index_q.device)
    _kernels()[0][(rows, batch)](index_q, head_weights, pooled, pools, pool_mass, scratch, kl, stats,
                                 softmax_scale, rows, slots,
                                 *_strides(index_q, head_weights, pooled, pools, pool_mass),
                                 **_tiles(heads, dim, FORWARD_BLOCK_P), num_warps=NUM_WARPS)
    return kl, stats


def backward(grad: torch.Tensor, pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor,
             pooled: torch.Tensor, pools: torch.Tensor, stats: torch.Tensor, softmax_scale: float
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``sum(grad * kl)`` with respect to ``index_q``, ``head_weights`` and ``pooled``, each in its
    input's dtype."""
    pool_mass, index_q, head_weights, pooled, pools = _prepared(pool_mass, index_q, head_weights, pooled, pools)
    batch, rows, heads, dim = index_q.shape
    if grad.shape != (batch, rows) or stats.shape != (batch, rows, 3):
        raise ValueError(f"grad must be [{batch}, {rows}] and stats [{batch}, {rows}, 3], got {tuple(grad.shape)} "
                         f"and {tuple(stats.shape)}")
    d_query = torch.empty((batch, rows, heads, dim), dtype=index_q.dtype, device=index_q.device)
    d_weights = torch.empty((batch, rows, heads), dtype=head_weights.dtype, device=index_q.device)
    d_pooled = torch.zeros(pooled.shape, dtype=torch.float32, device=index_q.device)
    if batch * rows:
        stats = stats.contiguous()
        _kernels()[1][(rows, batch)](grad, index_q, head_weights, pooled, pools, pool_mass, stats,
                                     d_query, d_weights, d_pooled, softmax_scale, rows, pools.shape[-1],
                                     *_strides(index_q, head_weights, pooled, pools, pool_mass),
                                     grad.stride(0), grad.stride(1), d_pooled.stride(0), d_pooled.stride(1),
                                     **_tiles(heads, dim, BACKWARD_BLOCK_P), num_warps=NUM_WARPS)
    return d_query, d_weights, d_pooled.to(pooled.dtype)


class SparseIndexerKL(torch.autograd.Function):
    """(``kl [B, C]``, ``has_pool [B, C]``) with the kernels' backward; ``pool_mass`` and ``pools`` take no
    gradient. Saves its inputs (``pooled`` is the window's, alive anyway) and 12 bytes a row."""

    @staticmethod
    def forward(ctx, pool_mass, index_q, head_weights, pooled, pools, softmax_scale):
        kl, stats = forward(pool_mass, index_q, head_weights, pooled, pools, softmax_scale)
        ctx.save_for_backward(pool_mass, index_q, head_weights, pooled, pools, stats)
        ctx.softmax_scale = softmax_scale
        has_pool = stats[..., 0] != float("inf")
        ctx.mark_non_differentiable(has_pool)
        return kl, has_pool

    @staticmethod
    def backward(ctx, grad_kl, grad_has):
        pool_mass, index_q, head_weights, pooled, pools, stats = ctx.saved_tensors
        d_query, d_weights, d_pooled = backward(grad_kl, pool_mass, index_q, head_weights, pooled, pools, stats,
                                                ctx.softmax_scale)
        return None, d_query, d_weights, d_pooled, None, None


def sparse_kl_rows(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor,
                   pools: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.sparse_kl_rows`` with the fused kernels both ways (ValueError for operands
    :func:`unsupported_reason` names)."""
    return SparseIndexerKL.apply(pool_mass, index_q, head_weights, pooled, pools, softmax_scale)
