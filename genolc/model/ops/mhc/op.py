"""mHC's mixing logits as one custom op, ``genolc::mhc_mixing_logits``, with its backward written out.

Forward: on CUDA the fused kernel of ``triton.py`` (one pass over the streams, the RMS norm folded out of the
product); elsewhere the reference formula, so that the CPU tests check this op's backward against autograd of
the reference. To torch.compile the op is opaque (the kernel is not traced); its backward is plain torch and is
compiled with the rest of the graph.

Backward, with ``r = rsqrt(mean(x^2) + eps)`` per token, ``logits = r * (x @ W^T)`` and ``g = dL/dlogits``:

    dW = (r g)^T x
    dx = r (g W) - (r^2 / K) * sum_j(g_j logits_j) * x

in fp32 with autocast off (the products are ``[M, W] x [W, K]`` and ``[W, M] x [M, K]`` with ``W = 24``: memory
bound, so fp32 costs little). Saved for it: ``x`` (which the hyper-connection keeps alive anyway), the weight and
the ``[M, W]`` logits; the old path kept the normed copy of the streams as well.
"""

from __future__ import annotations

import torch

from genolc.model.ops.mhc import reference


@torch.library.custom_op("genolc::mhc_mixing_logits", mutates_args=())
def mixing_logits_op(x: torch.Tensor, weight: torch.Tensor, eps: float, tf32: bool) -> torch.Tensor:
    """``x [M, K]``, ``weight [W, K]`` -> ``[M, W]`` fp32; ``tf32``: the CUDA kernel's product may use TF32."""
    if x.is_cuda:
        from genolc.model.ops.mhc import triton as mhc_triton

        return mhc_triton.fused_mixing_logits(x, weight, eps, tf32=tf32)
    with torch.autocast(x.device.type, enabled=False):
        return reference.mixing_logits(x, weight, eps)


@mixing_logits_op.register_fake
def _mixing_logits_shape(x: torch.Tensor, weight: torch.Tensor, eps: float, tf32: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


def mixing_logits_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor,
                           eps: float, need_x: bool = True, need_weight: bool = True
                           ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dx, dweight)`` in the dtypes of ``x`` and ``weight`` (the formula in the module notes)."""
    with torch.autocast(x.device.type, enabled=False):
        x32 = x.float()
        rstd = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
        grad32 = grad.float()
        scaled = grad32 * rstd
        dweight = (scaled.t() @ x32).to(weight.dtype) if need_weight else None
        dx = None
        if need_x:
            along_x = rstd.square() / x.shape[-1] * (grad32 * logits).sum(-1, keepdim=True)
            dx = (scaled @ weight.float() - along_x * x32).to(x.dtype)
    return dx, dweight


def _save_for_backward(ctx, inputs, output) -> None:
    x, weight, eps, _ = inputs
    ctx.save_for_backward(x, weight, output)
    ctx.eps = eps


def _backward(ctx, grad: torch.Tensor):
    x, weight, logits = ctx.saved_tensors
    dx, dweight = mixing_logits_backward(grad, x, weight, logits, ctx.eps, need_x=ctx.needs_input_grad[0],
                                         need_weight=ctx.needs_input_grad[1])
    return dx, dweight, None, None


mixing_logits_op.register_autograd(_backward, setup_context=_save_for_backward)


def mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The op with ``tf32`` as autocast implies: under autocast the reference's product would run in bf16, so TF32
    is already more exact; without autocast the product stays IEEE fp32."""
    return mixing_logits_op(x, weight, eps, torch.is_autocast_enabled(x.device.type))
