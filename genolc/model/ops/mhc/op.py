"""mHC's three custom-op pairs with their backward written out.

The mixing logits, ``genolc::mhc_mixing_logits`` and ``genolc::mhc_mixing_logits_backward``: on CUDA the fused
kernels of ``triton.py`` (one pass over the streams each way, the RMS norm folded out of the product); elsewhere the
same formulas in torch, so that the CPU tests check the backward against autograd of the reference. With
``r = rsqrt(mean(x^2) + eps)`` per token, ``logits = r * (x @ W^T)`` and ``g = dL/dlogits``:

    dW = (r g)^T x
    dx = r (g W) - (r^2 / K) * sum_j(g_j logits_j) * x

The forward also returns ``r`` (``[M]`` fp32), so that the backward reads the streams once. Saved for the backward:
``x`` (which the hyper-connection keeps alive anyway), the weight, the ``[M, W]`` logits and ``r``; the path before
these ops kept a normed bf16 copy of the streams as well.

The mixing matrix from its logits (softmax and Sinkhorn), ``genolc::mhc_comb_weights`` and
``genolc::mhc_comb_weights_backward``: on CUDA the kernels of ``comb_triton.py``; elsewhere the reference and its
written-out backward (``reference.comb_weights_backward``, which the CPU tests check against autograd). Saved for the
backward: the logits only.

The merge, ``genolc::mhc_merge`` and ``genolc::mhc_merge_backward`` (``new[m] = post[m] * block_out + sum_n
comb[n, m] * streams[n]`` in fp32, rounded to the streams' dtype once): on CUDA the kernels of ``merge_triton.py``;
elsewhere ``reference.merge`` and ``reference.merge_backward``. Saved for the backward: the four inputs, which the
compiled merge it replaces kept as well.

To torch.compile the ops are opaque (their kernels are not traced) and each backward is an op of its own, so that
the compiled backward graph can call it.
"""

from __future__ import annotations

import torch

from genolc.model.ops.mhc import reference


@torch.library.custom_op("genolc::mhc_mixing_logits", mutates_args=())
def mixing_logits_op(x: torch.Tensor, weight: torch.Tensor, eps: float, tf32: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]``, ``weight [W, K]`` -> (``[M, W]`` logits, ``[M]`` rstd), fp32; ``tf32``: the CUDA kernels'
    products may use TF32."""
    if x.is_cuda:
        from genolc.model.ops.mhc import triton as mhc_triton

        return mhc_triton.fused_mixing_logits(x, weight, eps, tf32=tf32)
    with torch.autocast(x.device.type, enabled=False):
        return reference.mixing_logits_and_rstd(x, weight, eps)


@mixing_logits_op.register_fake
def _mixing_logits_shapes(x: torch.Tensor, weight: torch.Tensor, eps: float, tf32: bool
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    return (x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32),
            x.new_empty((x.shape[0],), dtype=torch.float32))


@torch.library.custom_op("genolc::mhc_mixing_logits_backward", mutates_args=())
def mixing_logits_backward_op(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor,
                              rstd: torch.Tensor, tf32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)`` in the dtypes of ``x`` and ``weight`` (the formulas in the module notes)."""
    with torch.autocast(x.device.type, enabled=False):
        grad32 = grad.float()
        scaled = grad32 * rstd[:, None]
        coef = rstd.square() / x.shape[-1] * (grad32 * logits).sum(-1)
        if x.is_cuda:
            from genolc.model.ops.mhc import triton as mhc_triton

            return mhc_triton.fused_mixing_logits_backward(scaled, coef, x, weight, tf32=tf32)
        x32 = x.float()
        dx = scaled @ weight.float() - coef[:, None] * x32
        return dx.to(x.dtype), (scaled.t() @ x32).to(weight.dtype)


@mixing_logits_backward_op.register_fake
def _mixing_logits_backward_shapes(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor,
                                   rstd: torch.Tensor, tf32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(weight, memory_format=torch.contiguous_format))


def _save_for_backward(ctx, inputs, output) -> None:
    x, weight, _, tf32 = inputs
    logits, rstd = output
    ctx.save_for_backward(x, weight, logits, rstd)
    ctx.mark_non_differentiable(rstd)
    ctx.tf32 = tf32


def _backward(ctx, grad_logits: torch.Tensor, grad_rstd: torch.Tensor | None):
    x, weight, logits, rstd = ctx.saved_tensors
    dx, dweight = mixing_logits_backward_op(grad_logits, x, weight, logits, rstd, ctx.tf32)
    return dx, dweight, None, None


mixing_logits_op.register_autograd(_backward, setup_context=_save_for_backward)


def mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``[M, W]`` logits of the op, with ``tf32`` as autocast implies: under autocast the reference's product runs
    in bf16, so TF32 is already more exact; without autocast the products stay IEEE fp32."""
    return mixing_logits_op(x, weight, eps, torch.is_autocast_enabled(x.device.type))[0]


@torch.library.custom_op("genolc::mhc_comb_weights", mutates_args=())
def comb_weights_op(logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """``sinkhorn(softmax(logits) + eps)`` of fp32 ``logits [..., N, N]`` (reference.comb_weights)."""
    if logits.is_cuda:
        from genolc.model.ops.mhc import comb_triton

        return comb_triton.comb_weights(logits, iterations, eps)
    with torch.autocast(logits.device.type, enabled=False):
        return reference.comb_weights(logits, iterations, eps).contiguous()


@comb_weights_op.register_fake
def _comb_weights_shape(logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@torch.library.custom_op("genolc::mhc_comb_weights_backward", mutates_args=())
def comb_weights_backward_op(grad: torch.Tensor, logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """The gradient of :func:`comb_weights_op` with respect to its logits."""
    if logits.is_cuda:
        from genolc.model.ops.mhc import comb_triton

        return comb_triton.comb_weights_backward(grad, logits, iterations, eps)
    with torch.autocast(logits.device.type, enabled=False):
        return reference.comb_weights_backward(grad.to(logits.dtype), logits, iterations, eps).contiguous()


@comb_weights_backward_op.register_fake
def _comb_weights_backward_shape(grad: torch.Tensor, logits: torch.Tensor, iterations: int, eps: float
                                 ) -> torch.Tensor:
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _save_comb_logits(ctx, inputs, output) -> None:
    logits, iterations, eps = inputs
    ctx.save_for_backward(logits)
    ctx.iterations, ctx.eps = iterations, eps


def _comb_backward(ctx, grad: torch.Tensor):
    (logits,) = ctx.saved_tensors
    return comb_weights_backward_op(grad, logits, ctx.iterations, ctx.eps), None, None


comb_weights_op.register_autograd(_comb_backward, setup_context=_save_comb_logits)


@torch.library.custom_op("genolc::mhc_merge", mutates_args=())
def merge_op(block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """``reference.merge(block_out, post, comb, streams, compute_dtype=torch.float32)``."""
    if streams.is_cuda:
        from genolc.model.ops.mhc import merge_triton

        return merge_triton.merge(block_out, post, comb, streams)
    with torch.autocast(streams.device.type, enabled=False):
        return reference.merge(block_out, post, comb, streams, compute_dtype=torch.float32).contiguous()


@merge_op.register_fake
def _merge_shape(block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, streams: torch.Tensor
                 ) -> torch.Tensor:
    return torch.empty_like(streams, memory_format=torch.contiguous_format)


@torch.library.custom_op("genolc::mhc_merge_backward", mutates_args=())
def merge_backward_op(grad: torch.Tensor, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                      streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(``d block_out, d post, d comb, d streams``) of :func:`merge_op`, each in its input's dtype."""
    if streams.is_cuda:
        from genolc.model.ops.mhc import merge_triton

        return merge_triton.merge_backward(grad, block_out, post, comb, streams)
    with torch.autocast(streams.device.type, enabled=False):
        return tuple(t.contiguous() for t in reference.merge_backward(grad, block_out, post, comb, streams))


@merge_backward_op.register_fake
def _merge_backward_shapes(grad: torch.Tensor, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                           streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (block_out, post, comb, streams))


def _save_merge_inputs(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _merge_backward(ctx, grad: torch.Tensor):
    return merge_backward_op(grad, *ctx.saved_tensors)


merge_op.register_autograd(_merge_backward, setup_context=_save_merge_inputs)
