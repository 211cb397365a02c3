"""Routed experts as two grouped GEMMs over token slots sorted by expert, run in sequence chunks.

Same contract as ``genolc.model.ops.moe.reference.routed_experts``: ``x [N, D]``, ``expert_ids``/``weights [N, K]``,
stacked weights ``gate_up_proj [E, 2I, D]`` and ``down_proj [E, D, I]`` -> ``(out [N, D], tokens_per_expert [E])``.
Per chunk of ``chunk_tokens`` tokens the ``chunk * K`` slots are sorted by expert (stable), gathered, and pushed
through ``torch._grouped_mm`` (one launch for all experts, group boundaries from the cumulative counts, no host
sync), the bounded SwiGLU, and a second grouped GEMM; the weighted results are summed per token. The gather, the
SwiGLU and the weighted sum are the custom ops of ``op.py`` (on CUDA the gather is ``index_select`` forward and a
Triton kernel backward; the SwiGLU and the sum are Triton kernels both ways).
With gradients on, each chunk is checkpointed, so the ``[chunk * K, 2I]`` intermediates live one chunk at a time.

``tokens_per_expert`` (summed over chunks) is returned as the reference does: real DNA routes unevenly, and the
trainer logs it. ``torch._grouped_mm`` runs on CPU too (slowly); on sm90 it needs bf16 and 16-byte-aligned rows.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from genolc.model.ops.moe.op import combine_op, gather_slots_op, slot_positions, swiglu_op
from genolc.model.ops.moe.counts import count_per_expert
from genolc.model.ops.moe.reference import check_expert_shapes, routed_experts
from genolc.model.ops.weight_casts import compute_copy

DEFAULT_CHUNK_TOKENS = 65536


GROUPED_MM_ALIGN_BYTES = 16


def prepare_inputs(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The grouped GEMMs' operands for the layer's ``(x, gate_up_proj, down_proj)``. Pure torch (CPU-runnable).

    Under autocast (the trainer's bf16 compute) the weights are fp32 masters and x may be either dtype (the
    post-attention RMSNorm multiplies by an fp32 weight); the grouped GEMM takes one dtype, so all three are cast
    the way autocast casts a linear layer's operands. Without autocast they pass unchanged.
    """
    if torch.is_autocast_enabled(x.device.type):
        compute = torch.get_autocast_dtype(x.device.type)
        # Inside a training step's weight_casts_per_step, the step's one copy of each weight (ops/weight_casts.py).
        return x.to(compute), compute_copy(gate_up_proj, compute), compute_copy(down_proj, compute)
    return x, gate_up_proj, down_proj


def check_kernel_inputs(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> None:
    """ValueError unless CUDA's ``torch._grouped_mm`` takes these as :func:`_experts_chunk` passes them: all
    bf16, and every row (``D`` of x and gate_up_proj, ``I`` of down_proj) 16-byte aligned; both weights have a
    contiguous last dimension (their ``transpose(1, 2)`` is the column-major operand). Shared by
    :func:`grouped_experts` and the CPU tests, which also run these operands through the op's meta checks."""
    if x.dtype != torch.bfloat16 or gate_up_proj.dtype != torch.bfloat16 or down_proj.dtype != torch.bfloat16:
        raise ValueError(f"CUDA grouped GEMM needs bf16 x and expert weights, got {x.dtype}, {gate_up_proj.dtype}, "
                         f"{down_proj.dtype}")
    align = GROUPED_MM_ALIGN_BYTES // x.element_size()
    hidden, inter = x.shape[-1], down_proj.shape[-1]
    if hidden % align or inter % align:
        raise ValueError(f"CUDA grouped GEMM needs hidden ({hidden}) and expert intermediate ({inter}) sizes that are "
                         f"multiples of {align}")
    if gate_up_proj.stride(-1) != 1 or down_proj.stride(-1) != 1:
        raise ValueError(f"expert weights need a contiguous last dimension, got strides {gate_up_proj.stride()}, "
                         f"{down_proj.stride()}")


def _experts_chunk(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor, swiglu_limit: float) -> torch.Tensor:
    num_experts = gate_up_proj.shape[0]
    top_k = expert_ids.shape[1]
    flat_experts = expert_ids.reshape(-1)
    order = flat_experts.argsort(stable=True)
    position = slot_positions(order)
    group_ends = count_per_expert(flat_experts, num_experts).cumsum(0).to(torch.int32)
    grouped_in = gather_slots_op(x, order, position, top_k)
    # [E, 2I, D] viewed as [E, D, 2I]: the grouped GEMM takes the transposed weight without a copy.
    hidden = torch._grouped_mm(grouped_in, gate_up_proj.transpose(1, 2), offs=group_ends)
    grouped_out = torch._grouped_mm(swiglu_op(hidden, swiglu_limit), down_proj.transpose(1, 2), offs=group_ends)
    return combine_op(grouped_out, position, weights.contiguous())


def grouped_experts(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, gate_up_proj: torch.Tensor,
                    down_proj: torch.Tensor, swiglu_limit: float, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [N, D]``, ``expert_ids``/``weights [N, K]`` -> (``out [N, D]``, ``tokens_per_expert [E]`` long)."""
    check_expert_shapes(x, expert_ids, weights, gate_up_proj, down_proj)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    out_dtype = x.dtype
    x, gate_up_proj, down_proj = prepare_inputs(x, gate_up_proj, down_proj)
    if x.is_cuda and x.dtype != torch.bfloat16:
        # CUDA's grouped GEMM is bf16-only; fp32 or fp16 compute (no autocast) takes the per-expert loop instead.
        out, tokens_per_expert = routed_experts(x, expert_ids, weights, gate_up_proj, down_proj, swiglu_limit)
        return out.to(out_dtype), tokens_per_expert
    if x.is_cuda:
        check_kernel_inputs(x, gate_up_proj, down_proj)
    elif x.dtype != gate_up_proj.dtype or x.dtype != down_proj.dtype:
        raise ValueError(f"x ({x.dtype}) and the expert weights ({gate_up_proj.dtype}, {down_proj.dtype}) must share "
                         "a dtype for the grouped GEMM")
    tokens_per_expert = count_per_expert(expert_ids.reshape(-1), gate_up_proj.shape[0])
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or gate_up_proj.requires_grad
                                              or down_proj.requires_grad or weights.requires_grad)
    pieces = []
    for start in range(0, x.shape[0], chunk_tokens):
        stop = min(start + chunk_tokens, x.shape[0])
        args = (x[start:stop], expert_ids[start:stop], weights[start:stop], gate_up_proj, down_proj, swiglu_limit)
        if needs_grad and x.shape[0] > chunk_tokens:
            pieces.append(checkpoint(_experts_chunk, *args, use_reentrant=False))
        else:
            pieces.append(_experts_chunk(*args))
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    return out.to(out_dtype), tokens_per_expert
