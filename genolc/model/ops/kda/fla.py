"""KDA on fla's ``chunk_kda`` kernels, run segment-wise over the sequence so memory is bounded by the segment.

Same signature and semantics as :func:`genolc.model.ops.kda.reference.chunk_kda` (``[B, T, H, Dk]`` layout, which is
fla's). How genolc's arguments map onto fla's:

- The gate: the layer hands the raw gate pre-activation ``g`` (bf16 under autocast) with ``use_gate_in_kernel=True``,
  ``A_log``, ``dt_bias`` and ``lower_bound``, and fla forms ``g = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``
  in fp32 inside its cumsum kernel and returns dA_log/ddt_bias. So no fp32 ``[B, T, H, Dk]`` decay exists outside
  the kernel, and the gradient the op returns for ``g`` is bf16: at 1M tokens with H=12, D=128 that is 3 GiB of
  gradient instead of 6, plus the fp32 activations torch's gate saved for backward. A finished decay
  (``use_gate_in_kernel=False``, any float dtype) is still accepted. fla's ``safe_gate`` (an M=16 tensor-core path
  that relies on ``lower_bound <= g < 0``) is allowed only with the gate in the kernel and a lower bound in fla's safe
  range, where the bound holds by construction, and is on there by default (``safe_gate=None``): on the H200 it
  matched the reference as closely as the plain path (tests/gpu/test_kda_fla.py) and took the base shape's 1M-token
  fwd+bwd from 364 to 314 ms.
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

What fla's backward recomputes (``keep_intermediates``): by default fla's backward computes the decay's cumulative
sum, the WY factors ``w, u``, the gated ``q`` and ``k``, the corrected values and the per-chunk states ``h`` again
from the saved inputs (its ``disable_recompute=False``). A segment's replay in backward keeps them from the replay's
forward instead (fla's ``disable_recompute=True``): its backward follows at once, so the same tensors live over
about the same span, and one pass of fla's state kernel is saved per segment. ``chunk_kda(..., keep_intermediates=
True)`` asks for the same of a whole call under grad: one unsegmented fla call that keeps them until its backward,
``(5 a + 4) W + a H Dk Dv / 64`` bytes a token more (W = H Dk, ``a`` bytes per value of q's dtype: w, u, the gated
q and k, the corrected values, the fp32 decay sum, the states every 64 tokens), and where the call is longer than
a segment also what fla saves beyond a segment's inputs (its intra-chunk matrices and q's and k's norms), for a
caller that has planned that memory (the chunked training step: genolc/train/plan.py's
``kda_intermediates_device_bytes``, genolc/train/strategy.py). Without grad nothing is kept and the call is
segmented as by default.

Before fla is first imported, fla is pointed at the kernel configs genolc ships for this GPU
(genolc/model/ops/kda/fla_tuning.py), so a new machine's first step compiles one config per kernel instead of
autotuning all of them.

Imports fla at call time only: this module is imported on CUDA code paths (see ``genolc.model.ops.dispatch``).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import torch

from genolc.model.ops.kda.fla_import import import_fla_module
from genolc.model.ops.kda.fla_tuning import point_fla_at_tuned_configs
from genolc.model.ops.kda.reference import _check_gate, _check_shapes

# 32k tokens: one segment's fla workspace is 2.85 GiB at H=12, D=128 (4.5 GiB at 64k), and the walk over segments
# costs ~1% against 64k segments at 1M tokens (H200, benchmarks/results/kda_2026-11-29_base_gate.json).
DEFAULT_SEGMENT_LEN = 32768


KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FLA_MAX_KEY_DIM = 256
SAFE_GATE_BOUNDS = (-5.0, 0.0)


class Gate(NamedTuple):
    """The gate formed inside the kernel (fla's ``use_gate_in_kernel``): ``A_log [H]``, ``dt_bias [H * Dk]``
    (either may be None, see ``gate.kda_gate``), the lower bound, and whether fla's ``safe_gate`` path runs."""

    A_log: torch.Tensor | None
    dt_bias: torch.Tensor | None
    lower_bound: float | None
    safe_gate: bool = False


def resolve_gate(q: torch.Tensor, use_gate_in_kernel: bool, A_log: torch.Tensor | None,
                 dt_bias: torch.Tensor | None, lower_bound: float | None, safe_gate: bool | None) -> Gate | None:
    """The :class:`Gate` for :func:`chunk_kda`'s gate arguments (None: g is a finished decay); ``safe_gate=None``
    turns fla's safe path on exactly where it is valid. Pure torch (the CPU tests check it)."""
    low, high = SAFE_GATE_BOUNDS
    if safe_gate is None:
        safe_gate = use_gate_in_kernel and lower_bound is not None and low <= lower_bound < high
    if not use_gate_in_kernel:
        _check_gate(q, False, A_log, dt_bias, lower_bound)
        if safe_gate:
            raise ValueError("safe_gate needs use_gate_in_kernel=True with a lower_bound: genolc cannot check that a "
                             "finished decay stays within the bound")
        return None
    return Gate(A_log, dt_bias, lower_bound, safe_gate)


def check_gate(q: torch.Tensor, gate: Gate | None) -> None:
    """ValueError unless ``gate`` (or None: g is a finished decay) is one fla's gate kernel takes."""
    if gate is None:
        return
    _check_gate(q, True, gate.A_log, gate.dt_bias, gate.lower_bound)
    for name, param in (("A_log", gate.A_log), ("dt_bias", gate.dt_bias)):
        if param is not None and param.dtype != torch.float32:
            raise ValueError(f"fla's gate kernel reads {name} as float32, got {param.dtype}")
    low, high = SAFE_GATE_BOUNDS
    if gate.safe_gate and (gate.lower_bound is None or not low <= gate.lower_bound < high):
        raise ValueError(f"safe_gate needs the gate in the kernel with a lower_bound in [{low}, {high}); "
                         f"got lower_bound={gate.lower_bound}")


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
                        initial_state: torch.Tensor | None, gate: Gate | None = None) -> None:
    """ValueError unless fla's ``chunk_kda`` (no varlen) accepts these: shapes as the reference, q, k, v one dtype
    of ``KERNEL_DTYPES``, g and beta floating, ``Dk <= 256``, initial state fp32, gate parameters as
    :func:`check_gate` wants. Shared by :func:`chunk_kda` and the CPU tests of what the model hands this op."""
    _check_shapes(q, k, v, g, beta, initial_state)
    check_gate(q, gate)
    if q.dtype not in KERNEL_DTYPES or q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"q, k, v must share one dtype of {KERNEL_DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if g.dtype not in KERNEL_DTYPES or beta.dtype not in KERNEL_DTYPES:
        raise ValueError(f"g and beta must be floating ({KERNEL_DTYPES}), got {g.dtype}, {beta.dtype}")
    if q.shape[-1] > FLA_MAX_KEY_DIM:
        raise ValueError(f"fla's KDA kernels take key head dims up to {FLA_MAX_KEY_DIM}, got {q.shape[-1]}")
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise ValueError(f"fla needs a float32 initial_state, got {initial_state.dtype}")


@functools.cache
def _fla_chunk_kda():
    point_fla_at_tuned_configs()
    return import_fla_module("fla.ops.kda").chunk_kda


def fla_kda(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
            gate: Gate | None = None, keep_intermediates: bool = False):
    """One unsegmented call of fla's ``chunk_kda`` with genolc's argument mapping (autograd through fla).
    ``keep_intermediates``: fla keeps what its backward would recompute (module notes), when grad is on."""
    if initial_state is not None and initial_state.dtype != torch.float32:
        initial_state = initial_state.float()
    gate_args = {} if gate is None else dict(use_gate_in_kernel=True, A_log=gate.A_log, dt_bias=gate.dt_bias,
                                             lower_bound=gate.lower_bound, safe_gate=gate.safe_gate)
    return _fla_chunk_kda()(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            disable_recompute=keep_intermediates and torch.is_grad_enabled(), **gate_args)


def reference_segment_kernel(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             gate: Gate | None = None, keep_intermediates: bool = False, *, chunk_size: int = 64):
    """:func:`fla_kda`'s contract on the pure-torch reference (any device): the segment kernel the CPU tests and
    memory measurements put inside :class:`SegmentedKDA`. ``keep_intermediates`` changes nothing here: autograd
    keeps what the reference's backward needs and recomputes nothing."""
    from genolc.model.ops.kda import reference

    gate_args = {} if gate is None else dict(use_gate_in_kernel=True, A_log=gate.A_log, dt_bias=gate.dt_bias,
                                             lower_bound=gate.lower_bound)
    return reference.chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                               chunk_size=chunk_size, **gate_args)


# One unsegmented KDA call: (q, k, v, g, beta, scale, initial_state fp32 or None, output_final_state,
# use_qk_l2norm_in_kernel, gate: Gate or None, keep_intermediates=False) -> (o, final_state fp32). fla on CUDA; tests
# pass the pure-torch reference on CPU.
SegmentKernel = Callable[..., tuple[torch.Tensor, Optional[torch.Tensor]]]


def segment_bounds(length: int, segment_len: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0 .. length``; every segment but the last is ``segment_len`` long."""
    if segment_len < 1:
        raise ValueError(f"segment_len must be positive, got {segment_len}")
    return [(start, min(start + segment_len, length)) for start in range(0, length, segment_len)]


class SegmentedKDA(torch.autograd.Function):
    """A KDA kernel (fla ``chunk_kda`` by default) over segments; forward saves boundary states only, backward
    recomputes per segment. ``kernel`` has :func:`fla_kda`'s signature (see ``SegmentKernel``). With the gate in the
    kernel, ``A_log`` and ``dt_bias`` are inputs too; their gradients are summed over the segments."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, initial_state, scale, use_qk_l2norm_in_kernel, segment_len,
                kernel: SegmentKernel = fla_kda, lower_bound=None, safe_gate=False, gate_in_kernel=False):
        bounds = segment_bounds(q.shape[1], segment_len)
        gate = Gate(A_log, dt_bias, lower_bound, safe_gate) if gate_in_kernel else None
        out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
        state = None if initial_state is None else initial_state.detach().float()
        boundary_states = [state]
        with torch.no_grad():
            for start, stop in bounds:
                piece, state = kernel(q[:, start:stop], k[:, start:stop], v[:, start:stop], g[:, start:stop],
                                      beta[:, start:stop], scale, state, True, use_qk_l2norm_in_kernel, gate)
                out[:, start:stop] = piece
                boundary_states.append(state)
        ctx.bounds = bounds
        ctx.kernel = kernel
        ctx.scale = scale
        ctx.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel
        ctx.has_initial_state = initial_state is not None
        ctx.gate_in_kernel = gate_in_kernel
        ctx.lower_bound, ctx.safe_gate = lower_bound, safe_gate
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, *boundary_states[1:-1])
        ctx.first_state = boundary_states[0]
        # Unused outputs then reach backward as None, not as zero tensors: no zero dht pass through fla.
        ctx.set_materialize_grads(False)
        return out, boundary_states[-1]

    @staticmethod
    def backward(ctx, d_out, d_final_state):
        q, k, v, g, beta, A_log, dt_bias, *inner_states = ctx.saved_tensors
        gate_params = (A_log, dt_bias)
        starts = [ctx.first_state] + inner_states
        grads = [torch.empty_like(t) for t in (q, k, v, g, beta)]
        param_grads = [None if p is None else torch.zeros_like(p, dtype=torch.float32) for p in gate_params]
        if d_out is None:
            d_out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
        carried = d_final_state
        for index in range(len(ctx.bounds) - 1, -1, -1):
            start, stop = ctx.bounds[index]
            pieces = [t[:, start:stop].detach().requires_grad_(True) for t in (q, k, v, g, beta)]
            params = [None if p is None else p.detach().requires_grad_(True) for p in gate_params]
            gate = Gate(*params, ctx.lower_bound, ctx.safe_gate) if ctx.gate_in_kernel else None
            state = starts[index]
            state_needs_grad = state is not None
            if state_needs_grad:
                state = state.detach().requires_grad_(True)
            with torch.enable_grad():
                # The replay's backward runs at once: fla keeps its intermediates rather than computing them again.
                piece_out, piece_final = ctx.kernel(*pieces, ctx.scale, state, True, ctx.use_qk_l2norm_in_kernel,
                                                    gate, keep_intermediates=True)
                roots, root_grads = [piece_out], [d_out[:, start:stop]]
                if carried is not None:
                    roots.append(piece_final)
                    root_grads.append(carried)
                torch.autograd.backward(roots, root_grads)
            for full, piece in zip(grads, pieces):
                full[:, start:stop] = piece.grad
            for total, param in zip(param_grads, params):
                if param is not None and param.grad is not None:
                    total += param.grad
            carried = state.grad if state_needs_grad else None
        d_initial = carried if ctx.has_initial_state else None
        param_grads = [None if total is None else total.to(p.dtype) for total, p in zip(param_grads, gate_params)]
        return (*grads, *param_grads, d_initial, None, None, None, None, None, None, None)


def segmented_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  scale: float, initial_state: torch.Tensor | None, output_final_state: bool,
                  use_qk_l2norm_in_kernel: bool, segment_len: int, kernel: SegmentKernel = fla_kda,
                  gate: Gate | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``kernel`` run segment-wise over T through :class:`SegmentedKDA` (any device; shapes as :func:`chunk_kda`,
    ``scale`` already resolved; ``gate`` None means g is a finished decay). Returns
    ``(o [B, T, H, Dv], final_state [B, H, Dk, Dv] fp32 or None)``."""
    _check_shapes(q, k, v, g, beta, initial_state)
    if gate is not None:
        _check_gate(q, True, gate.A_log, gate.dt_bias, gate.lower_bound)
    if segment_len < 1:
        raise ValueError(f"segment_len must be positive, got {segment_len}")
    A_log, dt_bias, lower_bound, safe_gate = gate if gate is not None else (None, None, None, False)
    out, final_state = SegmentedKDA.apply(q, k, v, g, beta, A_log, dt_bias, initial_state, scale,
                                          use_qk_l2norm_in_kernel, segment_len, kernel, lower_bound, safe_gate,
                                          gate is not None)
    return out, (final_state if output_final_state else None)


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              scale: float | None = None, initial_state: torch.Tensor | None = None,
              output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, chunk_size: int = 64,
              use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
              dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
              safe_gate: bool | None = None, segment_len: int | None = DEFAULT_SEGMENT_LEN,
              keep_intermediates: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drop-in for ``reference.chunk_kda`` on CUDA tensors (fla kernels, segment-wise over T).

    Args and returns as the reference (``q, k [B, T, H, Dk]``, ``v [B, T, H, Dv]``, ``g [B, T, H, Dk]`` log decay,
    ``beta [B, T, H]``, ``initial_state [B, H, Dk, Dv]``; returns ``(o [B, T, H, Dv], final_state fp32 or None)``;
    the gate arguments as the reference's). ``safe_gate``: fla's bounded-gate path; None turns it on exactly when
    it is allowed (gate in the kernel, lower bound in ``SAFE_GATE_BOUNDS``; see the module notes).
    ``chunk_size`` must be 64 (fla's chunk; accepted for signature compatibility). ``segment_len``: tokens per
    segment; None runs fla unsegmented (its own autograd, memory O(T) in fla's saved workspace).
    ``keep_intermediates``: under grad, one unsegmented call whatever ``segment_len``, keeping what fla's backward
    would recompute until the backward (module notes: the bytes it adds); without grad it changes nothing.
    """
    if chunk_size != 64:
        raise ValueError(f"the fla KDA kernels use chunk_size 64; got {chunk_size}")
    if not q.is_cuda:
        raise ValueError("genolc.model.ops.kda.fla needs CUDA tensors; use reference.chunk_kda on CPU")
    q, k, v, g, beta, initial_state = prepare_inputs(q, k, v, g, beta, initial_state)
    gate = resolve_gate(q, use_gate_in_kernel, A_log, dt_bias, lower_bound, safe_gate)
    check_kernel_inputs(q, k, v, g, beta, initial_state, gate)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    keep_intermediates = keep_intermediates and torch.is_grad_enabled()
    if keep_intermediates or segment_len is None or q.shape[1] <= segment_len:
        out, final_state = fla_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
                                   use_qk_l2norm_in_kernel, gate, keep_intermediates)
        return out, (final_state if output_final_state else None)
    return segmented_kda(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                         segment_len, gate=gate)
