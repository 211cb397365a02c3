"""KDA on fla's ``chunk_kda`` kernels, run segment-wise over the sequence so memory is bounded by the segment.

Same signature and semantics as :func:`genolc.model.ops.kda.reference.chunk_kda` (``[B, T, H, Dk]`` layout, which is
fla's). How genolc's arguments map onto fla's:

- ``g`` is the *finished* per-channel log decay (the layer's ``ForgetGate`` computes it, lower bound included), so
  fla runs with ``use_gate_in_kernel=False`` and no ``A_log``/``dt_bias``/``lower_bound``: the gate stays in
  torch, where its gradient flows through ordinary autograd. fla's ``safe_gate`` (an M=16 tensor-core path that
  assumes ``g >= lower_bound``) stays off: it would change results whenever a caller passes an unbounded gate.
- ``beta`` is post-sigmoid (``use_beta_sigmoid_in_kernel=False``).
- ``use_qk_l2norm_in_kernel`` maps one to one: fla's l2norm is ``x / sqrt(sum x^2 + 1e-6)`` like the reference's.
- ``scale`` defaults to ``Dk ** -0.5`` in both; fla wants the initial state in fp32 (the reference returns fp32).

Segment-wise (:class:`SegmentedKDA`): fla keeps per-chunk states and WY factors for backward, ~80 GiB at 1M tokens
with H=8. Here the forward runs segments of ``segment_len`` tokens under no_grad, passing the final state of one
segment as the initial state of the next, and keeps only the ``ceil(T / segment_len) + 1`` boundary states
(``[B, H, Dk, Dv]`` fp32 each). Backward walks the segments last to first: it re-runs one segment's forward with
autograd, back-propagates the output gradient plus the gradient arriving at that segment's final state, and hands
the gradient of its initial state (fla's ``dh0``) to the previous segment as that one's ``dht``. Gradients equal the
unsegmented op's up to summation order; peak memory is the inputs, their gradients and one segment's workspace.

Imports fla at call time only: this module is imported on CUDA code paths (see ``genolc.model.ops.dispatch``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from genolc.model.ops.kda.reference import _check_shapes

# 64k tokens: one segment's fla workspace stays a few GiB at H=12, D=128, and a segment is long enough that the
# serial walk over segments costs nothing measurable against the kernels themselves.
DEFAULT_SEGMENT_LEN = 65536


KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FLA_MAX_KEY_DIM = 256


def prepare_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   initial_state: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                              torch.Tensor | None]:
    """What fla is handed for the layer's arguments. Pure torch (CPU-runnable; the CPU tests check it).

    q, k, v meet in fla's tensor-core dots, so they get one dtype, chosen as autocast chooses a matmul's (the
    autocast dtype when it is on, else the widest); g (fla accumulates it in fp32 itself) and beta keep theirs;
    the initial state goes to fp32, which fla asserts. Strides are left alone: fla's ``input_guard`` makes every
    input contiguous.
    """
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        common = torch.get_autocast_dtype(device_type)
    else:
        common = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if initial_state is not None and initial_state.dtype != torch.float32:
        initial_state = initial_state.float()
    return q.to(common), k.to(common), v.to(common), g, beta, initial_state


def check_kernel_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        initial_state: torch.Tensor | None) -> None:
    """ValueError unless fla's ``chunk_kda`` (gate outside the kernel, no varlen) accepts these: shapes as the
    reference, q, k, v one dtype of ``KERNEL_DTYPES``, g and beta floating, ``Dk <= 256``, initial state fp32.
    Shared by :func:`chunk_kda` and the CPU tests of what the model hands this op."""
    _check_shapes(q, k, v, g, beta, initial_state)
    if q.dtype not in KERNEL_DTYPES or q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"q, k, v must share one dtype of {KERNEL_DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if g.dtype not in KERNEL_DTYPES or beta.dtype not in KERNEL_DTYPES:
        raise ValueError(f"g and beta must be floating ({KERNEL_DTYPES}), got {g.dtype}, {beta.dtype}")
    if q.shape[-1] > FLA_MAX_KEY_DIM:
        raise ValueError(f"fla's KDA kernels take key head dims up to {FLA_MAX_KEY_DIM}, got {q.shape[-1]}")
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise ValueError(f"fla needs a float32 initial_state, got {initial_state.dtype}")


def _fla_chunk_kda():
    from fla.ops.kda import chunk_kda as fla_chunk_kda

    return fla_chunk_kda


def fla_kda(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    """One unsegmented call of fla's ``chunk_kda`` with genolc's argument mapping (autograd through fla)."""
    if initial_state is not None and initial_state.dtype != torch.float32:
        initial_state = initial_state.float()
    return _fla_chunk_kda()(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


# One unsegmented KDA call: (q, k, v, g, beta, scale, initial_state fp32 or None, output_final_state,
# use_qk_l2norm_in_kernel) -> (o, final_state fp32). fla on CUDA; tests pass the pure-torch reference on CPU.
SegmentKernel = Callable[..., tuple[torch.Tensor, Optional[torch.Tensor]]]


def segment_bounds(length: int, segment_len: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0 .. length``; every segment but the last is ``segment_len`` long."""
    if segment_len < 1:
        raise ValueError(f"segment_len must be positive, got {segment_len}")
    return [(start, min(start + segment_len, length)) for start in range(0, length, segment_len)]


class SegmentedKDA(torch.autograd.Function):
    """A KDA kernel (fla ``chunk_kda`` by default) over segments; forward saves boundary states only, backward
    recomputes per segment. ``kernel`` has :func:`fla_kda`'s signature (see ``SegmentKernel``)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, use_qk_l2norm_in_kernel, segment_len,
                kernel: SegmentKernel = fla_kda):
        bounds = segment_bounds(q.shape[1], segment_len)
        out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
        state = None if initial_state is None else initial_state.detach().float()
        boundary_states = [state]
        with torch.no_grad():
            for start, stop in bounds:
                piece, state = kernel(q[:, start:stop], k[:, start:stop], v[:, start:stop], g[:, start:stop],
                                      beta[:, start:stop], scale, state, True, use_qk_l2norm_in_kernel)
                out[:, start:stop] = piece
                boundary_states.append(state)
        ctx.bounds = bounds
        ctx.kernel = kernel
        ctx.scale = scale
        ctx.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel
        ctx.has_initial_state = initial_state is not None
        ctx.save_for_backward(q, k, v, g, beta, *boundary_states[1:-1])
        ctx.first_state = boundary_states[0]
        # Unused outputs then reach backward as None, not as zero tensors: no zero dht pass through fla.
        ctx.set_materialize_grads(False)
        return out, boundary_states[-1]

    @staticmethod
    def backward(ctx, d_out, d_final_state):
        q, k, v, g, beta, *inner_states = ctx.saved_tensors
        starts = [ctx.first_state] + inner_states
        grads = [torch.empty_like(t) for t in (q, k, v, g, beta)]
        if d_out is None:
            d_out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
        carried = d_final_state
        for index in range(len(ctx.bounds) - 1, -1, -1):
            start, stop = ctx.bounds[index]
            pieces = [t[:, start:stop].detach().requires_grad_(True) for t in (q, k, v, g, beta)]
            state = starts[index]
            state_needs_grad = state is not None
            if state_needs_grad:
                state = state.detach().requires_grad_(True)
            with torch.enable_grad():
                piece_out, piece_final = ctx.kernel(*pieces, ctx.scale, state, True, ctx.use_qk_l2norm_in_kernel)
                roots, root_grads = [piece_out], [d_out[:, start:stop]]
                if carried is not None:
                    roots.append(piece_final)
                    root_grads.append(carried)
                torch.autograd.backward(roots, root_grads)
            for full, piece in zip(grads, pieces):
                full[:, start:stop] = piece.grad
            carried = state.grad if state_needs_grad else None
        d_initial = carried if ctx.has_initial_state else None
        return (*grads, d_initial, None, None, None, None)


def segmented_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  scale: float, initial_state: torch.Tensor | None, output_final_state: bool,
                  use_qk_l2norm_in_kernel: bool, segment_len: int, kernel: SegmentKernel = fla_kda
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``kernel`` run segment-wise over T through :class:`SegmentedKDA` (any device; shapes as :func:`chunk_kda`,
    ``scale`` already resolved). Returns ``(o [B, T, H, Dv], final_state [B, H, Dk, Dv] fp32 or None)``."""
    _check_shapes(q, k, v, g, beta, initial_state)
    if segment_len < 1:
        raise ValueError(f"segment_len must be positive, got {segment_len}")
    out, final_state = SegmentedKDA.apply(q, k, v, g, beta, initial_state, scale, use_qk_l2norm_in_kernel,
                                          segment_len, kernel)
    return out, (final_state if output_final_state else None)


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              scale: float | None = None, initial_state: torch.Tensor | None = None,
              output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, chunk_size: int = 64,
              segment_len: int | None = DEFAULT_SEGMENT_LEN) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drop-in for ``reference.chunk_kda`` on CUDA tensors (fla kernels, segment-wise over T).

    Args and returns as the reference (``q, k [B, T, H, Dk]``, ``v [B, T, H, Dv]``, ``g [B, T, H, Dk]`` log decay,
    ``beta [B, T, H]``, ``initial_state [B, H, Dk, Dv]``; returns ``(o [B, T, H, Dv], final_state fp32 or None)``).
    ``chunk_size`` must be 64 (fla's chunk; accepted for signature compatibility). ``segment_len``: tokens per
    segment; None runs fla unsegmented (its own autograd, memory O(T) in fla's saved workspace).
    """
    if chunk_size != 64:
        raise ValueError(f"the fla KDA kernels use chunk_size 64; got {chunk_size}")
    if not q.is_cuda:
        raise ValueError("genolc.model.ops.kda.fast needs CUDA tensors; use reference.chunk_kda on CPU")
    q, k, v, g, beta, initial_state = prepare_inputs(q, k, v, g, beta, initial_state)
    check_kernel_inputs(q, k, v, g, beta, initial_state)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if segment_len is None or q.shape[1] <= segment_len:
        out, final_state = fla_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
                                   use_qk_l2norm_in_kernel)
        return out, (final_state if output_final_state else None)
    return segmented_kda(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                         segment_len)
