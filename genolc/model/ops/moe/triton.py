"""The routed experts' element-wise glue in four Triton kernels (formulas in ``genolc.model.ops.moe.op``).

Between and after the two grouped GEMMs, eager torch ran the bounded SwiGLU as four kernels forward (two clamps,
SiLU, product) and about eight backward (each clamp's backward a compare and a where, the halves' gradients joined
by a cat), and the combine as a routing-weight product, an ``index_copy`` back to slot order and a sum over each
token's slots, plus their backward: about 1.9 s of `base`'s 512k step in small memory-bound kernels
(benchmarks/results/moe_glue_2026-12-02/). Here:

- ``swiglu_kernel``: ``hidden [S, 2I]`` (gate | up) -> ``[S, I]``, one read and one write;
- ``swiglu_backward_kernel``: ``(d_out [S, I], hidden)`` -> ``d_hidden [S, 2I]``, written whole (no cat);
- ``combine_kernel``: each token's routing-weighted sum of its K expert rows, gathered through the slots' positions
  in expert order (no ``index_copy``, no weighted copy of the rows);
- ``combine_backward_kernel``: per slot, its row's gradient (its weight times the token's gradient, written at the
  row's place in expert order) and its weight's gradient (the row's dot product with the token's gradient).

Arithmetic in fp32, one rounding to the output dtype. Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``
(tests/gpu/triton_interpreter_check.py). Imports Triton at import time: ``op.py`` imports this module only for CUDA
tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 16          # rows (slots or tokens) a program
COLUMNS = 256      # columns a step


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _clamp_above(x, limit):
    # NaN stays NaN, as in torch's clamp: tl.minimum's default would return the bound and hide a diverged weight.
    return tl.minimum(x, limit, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _clamp(x, limit):
    return tl.minimum(tl.maximum(x, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                      propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def swiglu_kernel(hidden_ptr, out_ptr, n_rows, inter, limit, stride_h, stride_o,
                  ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    mask = (rows < n_rows)[:, None] & (cols < inter)[None, :]
    at = rows.to(tl.int64)[:, None] * stride_h + cols[None, :]
    gate = _clamp_above(tl.load(hidden_ptr + at, mask=mask, other=0.0).to(tl.float32), limit)
    up = _clamp(tl.load(hidden_ptr + at + inter, mask=mask, other=0.0).to(tl.float32), limit)
    out = gate * _sigmoid(gate) * up
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def swiglu_backward_kernel(grad_ptr, hidden_ptr, d_hidden_ptr, n_rows, inter, limit, stride_g, stride_h, stride_d,
                           ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    mask = (rows < n_rows)[:, None] & (cols < inter)[None, :]
    at = rows.to(tl.int64)[:, None] * stride_h + cols[None, :]
    grad = tl.load(grad_ptr + rows.to(tl.int64)[:, None] * stride_g + cols[None, :], mask=mask,
                   other=0.0).to(tl.float32)
    gate = tl.load(hidden_ptr + at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(hidden_ptr + at + inter, mask=mask, other=0.0).to(tl.float32)
    # As torch's clamp backward: the gradient passes where the input lies within the bounds, ends included.
    gate_c = _clamp_above(gate, limit)
    up_c = _clamp(up, limit)
    sig = _sigmoid(gate_c)
    d_up = tl.where((up >= -limit) & (up <= limit), grad * gate_c * sig, 0.0)
    d_gate = tl.where(gate <= limit, grad * up_c * sig * (1.0 + gate_c * (1.0 - sig)), 0.0)
    d_at = rows.to(tl.int64)[:, None] * stride_d + cols[None, :]
    tl.store(d_hidden_ptr + d_at, d_gate.to(d_hidden_ptr.dtype.element_ty), mask=mask)
    tl.store(d_hidden_ptr + d_at + inter, d_up.to(d_hidden_ptr.dtype.element_ty), mask=mask)


@triton.jit
def combine_kernel(rows_ptr, position_ptr, weights_ptr, out_ptr, n_tokens, hidden, stride_r, stride_o,
                   TOP_K: tl.constexpr, WEIGHTED: tl.constexpr, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    tokens = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    live = tokens < n_tokens
    mask = live[:, None] & (cols < hidden)[None, :]
    acc = tl.zeros([ROWS, COLUMNS], tl.float32)
    for k in tl.static_range(TOP_K):
        slot = tokens.to(tl.int64) * TOP_K + k
        row = tl.load(position_ptr + slot, mask=live, other=0)
        value = tl.load(rows_ptr + row[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if WEIGHTED:
            value *= tl.load(weights_ptr + slot, mask=live, other=0.0).to(tl.float32)[:, None]
        acc += value
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * stride_o + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def combine_backward_kernel(grad_ptr, rows_ptr, position_ptr, weights_ptr, d_rows_ptr, d_weights_ptr, n_slots,
                            hidden, stride_g, stride_r, stride_d,
                            TOP_K: tl.constexpr, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    slots = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = slots < n_slots
    slot64 = slots.to(tl.int64)
    row = tl.load(position_ptr + slot64, mask=live, other=0)
    token = slot64 // TOP_K
    weight = tl.load(weights_ptr + slot64, mask=live, other=0.0).to(tl.float32)
    dot = tl.zeros([ROWS], tl.float32)
    for start in range(0, hidden, COLUMNS):
        cols = start + tl.arange(0, COLUMNS)
        mask = live[:, None] & (cols < hidden)[None, :]
        grad = tl.load(grad_ptr + token[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        value = tl.load(rows_ptr + row[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dot += tl.sum(grad * value, axis=1)
        tl.store(d_rows_ptr + row[:, None] * stride_d + cols[None, :],
                 (weight[:, None] * grad).to(d_rows_ptr.dtype.element_ty), mask=mask)
    tl.store(d_weights_ptr + slot64, dot.to(d_weights_ptr.dtype.element_ty), mask=live)


def _rows_contiguous(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.dim() != 2 or tensor.stride(-1) != 1:
            raise ValueError(f"expected 2-d tensors with a contiguous last dimension, got {tuple(tensor.shape)} "
                             f"strides {tensor.stride()}")


def _flat(*tensors: torch.Tensor | None) -> None:
    # The kernels index weights and positions as flat [N * K] arrays.
    for tensor in tensors:
        if tensor is not None and not tensor.is_contiguous():
            raise ValueError(f"expected a contiguous tensor, got {tuple(tensor.shape)} strides {tensor.stride()}")


def swiglu(hidden: torch.Tensor, limit: float) -> torch.Tensor:
    """``hidden [S, 2I]`` -> ``[S, I]`` in hidden's dtype."""
    _rows_contiguous(hidden)
    n_rows, inter = hidden.shape[0], hidden.shape[1] // 2
    out = torch.empty((n_rows, inter), dtype=hidden.dtype, device=hidden.device)
    if n_rows:
        grid = (triton.cdiv(n_rows, ROWS), triton.cdiv(inter, COLUMNS))
        swiglu_kernel[grid](hidden, out, n_rows, inter, float(limit), hidden.stride(0), out.stride(0),
                            ROWS=ROWS, COLUMNS=COLUMNS)
    return out


def swiglu_backward(grad: torch.Tensor, hidden: torch.Tensor, limit: float) -> torch.Tensor:
    """``d_hidden [S, 2I]`` in hidden's dtype from ``grad [S, I]``."""
    _rows_contiguous(grad, hidden)
    n_rows, inter = hidden.shape[0], hidden.shape[1] // 2
    d_hidden = torch.empty((n_rows, 2 * inter), dtype=hidden.dtype, device=hidden.device)
    if n_rows:
        grid = (triton.cdiv(n_rows, ROWS), triton.cdiv(inter, COLUMNS))
        swiglu_backward_kernel[grid](grad, hidden, d_hidden, n_rows, inter, float(limit), grad.stride(0),
                                     hidden.stride(0), d_hidden.stride(0), ROWS=ROWS, COLUMNS=COLUMNS)
    return d_hidden


def combine(rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor | None, top_k: int) -> torch.Tensor:
    """``rows [S, D]`` in expert order, ``position [N * K]`` (slot -> its row), ``weights [N, K]`` (None: all 1)
    -> ``[N, D]`` in rows' dtype."""
    _rows_contiguous(rows)
    _flat(position, weights)
    n_tokens, hidden = position.shape[0] // top_k, rows.shape[1]
    out = torch.empty((n_tokens, hidden), dtype=rows.dtype, device=rows.device)
    if n_tokens:
        grid = (triton.cdiv(n_tokens, ROWS), triton.cdiv(hidden, COLUMNS))
        combine_kernel[grid](rows, position, rows if weights is None else weights, out, n_tokens, hidden,
                             rows.stride(0), out.stride(0), TOP_K=top_k, WEIGHTED=weights is not None, ROWS=ROWS,
                             COLUMNS=COLUMNS)
    return out


def combine_backward(grad: torch.Tensor, rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d_rows [S, D]`` in rows' dtype, ``d_weights [N, K]`` in weights' dtype) from ``grad [N, D]``."""
    _rows_contiguous(grad, rows, weights)
    _flat(position, weights)
    n_tokens, top_k = weights.shape
    hidden = rows.shape[1]
    d_rows = torch.empty_like(rows, memory_format=torch.contiguous_format)
    d_weights = torch.empty_like(weights, memory_format=torch.contiguous_format)
    n_slots = n_tokens * top_k
    if n_slots:
        combine_backward_kernel[(triton.cdiv(n_slots, ROWS),)](
            grad, rows, position, weights, d_rows, d_weights, n_slots, hidden, grad.stride(0), rows.stride(0),
            d_rows.stride(0), TOP_K=top_k, ROWS=ROWS, COLUMNS=COLUMNS)
    return d_rows, d_weights
