"""The routed experts' glue as custom ops with their backward written out: the gather of token rows into expert
order, the bounded SwiGLU between the grouped GEMMs, and the routing-weighted combine back to tokens.

On CUDA each runs the fused Triton kernels of ``triton.py`` (one pass each way); elsewhere the same formulas in
torch, so that the CPU tests check every backward against autograd of the reference (``reference.py``,
``swiglu.py``). Arithmetic in fp32 with one rounding to the output dtype, where eager bf16 rounded after every op.

Slots: token ``t``'s ``k``-th expert is flat slot ``s = t K + k``; ``order`` sorts the slots by expert (row ``i`` of
the expert-ordered rows is slot ``order[i]``) and ``position`` is its inverse (slot ``s`` sits at row
``position[s]``). With ``L`` the clamp limit, ``g``/``u`` the gate and up halves of ``hidden [S, 2I]`` and
``sigma`` the logistic function:

    swiglu:    gc = min(g, L), uc = clamp(u, -L, L), out = gc sigma(gc) uc
               d_u = d uc' where -L <= u <= L else 0, with uc' = gc sigma(gc)
               d_g = d uc sigma(gc) (1 + gc (1 - sigma(gc))) where g <= L else 0
    gather:    rows[i] = x[order[i] // K];            d_x[t] = sum_k d_rows[position[t K + k]]
    combine:   out[t] = sum_k w[t, k] rows[position[t K + k]]
               d_rows[position[s]] = w[s] d_out[s // K],   d_w[s] = rows[position[s]] . d_out[s // K]

To torch.compile the ops are opaque and each backward is an op of its own.
"""

from __future__ import annotations

import torch

from genolc.model.ops.moe.swiglu import clamped_swiglu


def slot_positions(order: torch.Tensor) -> torch.Tensor:
    """``position [S]``: the inverse permutation of ``order [S]`` (slot -> its row in expert order)."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    # The torch formulas' arithmetic: fp32, or fp64 for fp64 inputs (the CPU tests' exact comparisons).
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


@torch.library.custom_op("genolc::moe_swiglu", mutates_args=())
def swiglu_op(hidden: torch.Tensor, limit: float) -> torch.Tensor:
    """``hidden [S, 2I]`` (gate | up) -> ``[S, I]`` in hidden's dtype."""
    if hidden.is_cuda:
        from genolc.model.ops.moe import triton as moe_triton

        return moe_triton.swiglu(hidden, limit)
    return swiglu_formula(hidden, limit)


def swiglu_formula(hidden: torch.Tensor, limit: float) -> torch.Tensor:
    """The SwiGLU kernel's result in torch, on any device: the layer's clamped SwiGLU in fp32, rounded once."""
    gate, up = _wide(hidden).chunk(2, dim=-1)
    return clamped_swiglu(gate, up, limit).to(hidden.dtype)


@swiglu_op.register_fake
def _swiglu_shape(hidden: torch.Tensor, limit: float) -> torch.Tensor:
    return hidden.new_empty((hidden.shape[0], hidden.shape[1] // 2))


@torch.library.custom_op("genolc::moe_swiglu_backward", mutates_args=())
def swiglu_backward_op(grad: torch.Tensor, hidden: torch.Tensor, limit: float) -> torch.Tensor:
    """``d_hidden [S, 2I]`` in hidden's dtype."""
    if hidden.is_cuda:
        from genolc.model.ops.moe import triton as moe_triton

        return moe_triton.swiglu_backward(grad.contiguous(), hidden, limit)
    return swiglu_backward_formula(grad, hidden, limit)


def swiglu_backward_formula(grad: torch.Tensor, hidden: torch.Tensor, limit: float) -> torch.Tensor:
    """The SwiGLU backward kernel's result in torch, on any device."""
    grad = _wide(grad)
    gate, up = _wide(hidden).chunk(2, dim=-1)
    gate_c, up_c = gate.clamp(max=limit), up.clamp(-limit, limit)
    sig = torch.sigmoid(gate_c)
    d_up = torch.where((up >= -limit) & (up <= limit), grad * gate_c * sig, 0.0)
    d_gate = torch.where(gate <= limit, grad * up_c * sig * (1.0 + gate_c * (1.0 - sig)), 0.0)
    return torch.cat([d_gate, d_up], dim=-1).to(hidden.dtype)


@swiglu_backward_op.register_fake
def _swiglu_backward_shape(grad: torch.Tensor, hidden: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.empty_like(hidden, memory_format=torch.contiguous_format)


def _swiglu_save(ctx, inputs, output) -> None:
    hidden, limit = inputs
    ctx.save_for_backward(hidden)
    ctx.limit = limit


def _swiglu_backward(ctx, grad: torch.Tensor):
    (hidden,) = ctx.saved_tensors
    return swiglu_backward_op(grad, hidden, ctx.limit), None


swiglu_op.register_autograd(_swiglu_backward, setup_context=_swiglu_save)


def combine_formula(rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor | None, top_k: int
                    ) -> torch.Tensor:
    """The combine kernel's result in torch, on any device (``weights`` None: the gather's backward, unweighted)."""
    gathered = _wide(rows[position]).view(-1, top_k, rows.shape[-1])
    if weights is not None:
        gathered = gathered * _wide(weights).reshape(-1, top_k, 1)
    return gathered.sum(dim=1).to(rows.dtype)


@torch.library.custom_op("genolc::moe_gather_slots", mutates_args=())
def gather_slots_op(x: torch.Tensor, order: torch.Tensor, position: torch.Tensor, top_k: int) -> torch.Tensor:
    """``x [N, D]`` -> ``[N K, D]``: row ``i`` is the token of slot ``order[i]``."""
    return x.index_select(0, torch.div(order, top_k, rounding_mode="floor"))


@gather_slots_op.register_fake
def _gather_slots_shape(x: torch.Tensor, order: torch.Tensor, position: torch.Tensor, top_k: int) -> torch.Tensor:
    return x.new_empty((order.shape[0], x.shape[1]))


@torch.library.custom_op("genolc::moe_gather_slots_backward", mutates_args=())
def gather_slots_backward_op(grad: torch.Tensor, position: torch.Tensor, top_k: int) -> torch.Tensor:
    """``d_x [N, D]``: each token's sum of its slots' row gradients (no atomics: a gather through ``position``)."""
    if grad.is_cuda:
        from genolc.model.ops.moe import triton as moe_triton

        return moe_triton.combine(grad.contiguous(), position, None, top_k)
    return combine_formula(grad, position, None, top_k)


@gather_slots_backward_op.register_fake
def _gather_slots_backward_shape(grad: torch.Tensor, position: torch.Tensor, top_k: int) -> torch.Tensor:
    return grad.new_empty((position.shape[0] // top_k, grad.shape[1]))


def _gather_save(ctx, inputs, output) -> None:
    _, _, position, top_k = inputs
    ctx.save_for_backward(position)
    ctx.top_k = top_k


def _gather_backward(ctx, grad: torch.Tensor):
    (position,) = ctx.saved_tensors
    return gather_slots_backward_op(grad, position, ctx.top_k), None, None, None


gather_slots_op.register_autograd(_gather_backward, setup_context=_gather_save)


@torch.library.custom_op("genolc::moe_combine", mutates_args=())
def combine_op(rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``rows [S, D]`` in expert order, ``position [S]``, ``weights [N, K]`` -> ``[N, D]`` in rows' dtype."""
    top_k = weights.shape[1]
    if rows.is_cuda:
        from genolc.model.ops.moe import triton as moe_triton

        return moe_triton.combine(rows, position, weights.contiguous(), top_k)
    return combine_formula(rows, position, weights, top_k)


@combine_op.register_fake
def _combine_shape(rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return rows.new_empty((weights.shape[0], rows.shape[1]))


@torch.library.custom_op("genolc::moe_combine_backward", mutates_args=())
def combine_backward_op(grad: torch.Tensor, rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d_rows [S, D]`` in rows' dtype, ``d_weights [N, K]`` in weights' dtype)."""
    if rows.is_cuda:
        from genolc.model.ops.moe import triton as moe_triton

        return moe_triton.combine_backward(grad.contiguous(), rows, position, weights.contiguous())
    return combine_backward_formula(grad, rows, position, weights)


def combine_backward_formula(grad: torch.Tensor, rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The combine backward kernel's results in torch, on any device."""
    top_k = weights.shape[1]
    token_grad = _wide(grad).repeat_interleave(top_k, dim=0)
    d_rows = torch.empty_like(rows, memory_format=torch.contiguous_format)
    d_rows[position] = (_wide(weights).reshape(-1, 1) * token_grad).to(rows.dtype)
    d_weights = (_wide(rows[position]) * token_grad).sum(-1).view_as(weights).to(weights.dtype)
    return d_rows, d_weights


@combine_backward_op.register_fake
def _combine_backward_shape(grad: torch.Tensor, rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(rows, memory_format=torch.contiguous_format),
            torch.empty_like(weights, memory_format=torch.contiguous_format))


def _combine_save(ctx, inputs, output) -> None:
    rows, position, weights = inputs
    ctx.save_for_backward(rows, position, weights)


def _combine_backward(ctx, grad: torch.Tensor):
    rows, position, weights = ctx.saved_tensors
    d_rows, d_weights = combine_backward_op(grad, rows, position, weights)
    return d_rows, None, d_weights


combine_op.register_autograd(_combine_backward, setup_context=_combine_save)
