"""mHC's ops with their backward written out: three custom-op pairs, and the block input's autograd function.

The mixing logits, ``genolc::mhc_mixing_logits`` and ``genolc::mhc_mixing_logits_backward``: on CUDA the fused
kernels of ``triton.py`` (one pass over the streams each way, the RMS norm folded out of the product); elsewhere the
same formulas in torch, so that the CPU tests check the backward against autograd of the reference. With
``r = rsqrt(mean(x^2) + eps)`` per token, ``logits = r * (x @ W^T)`` and ``g = dL/dlogits``:

    dW = (r g)^T x
    dx = r (g W) - (r^2 / K) * sum_j(g_j logits_j) * x

The forward also returns ``r`` (``[M]`` fp32), so that the backward reads the streams once. Saved for the backward:
``x`` (which the hyper-connection keeps alive anyway), the weight, the ``[M, W]`` logits and ``r``; the path before
these ops kept a normed bf16 copy of the streams as well.

The hyper-connection's reading of its streams, :class:`BlockInputPassingStreams` (:func:`block_input`): the mixing
logits as above, then the block's input ``sum_n pre_n * stream_n`` with ``pre = sigmoid(logits[:, :N] * scale[0] +
base[:N]) + eps`` (``reference.block_input``). What the model calls (ops.dispatch.mhc_block_input). As two ops (the
mixing logits, then the weighted sum compiled by inductor) the streams' gradient came in two shares that a compiled
pass added, a read and a write of the streams more; here the
backward reduces the block input's gradient against the streams for ``pre`` (one kernel), and the mixing-logits
backward kernel adds ``pre[m, n] * g_block[m]`` to stream n's columns before it writes x's gradient. Saved for the
backward: ``x``, the weight, ``scale``, ``base``, the logits and ``r``; ``pre`` is formed again from the logits.
The function also hands the merge its alias of x, so that the merge's share of x's gradient is added in the same
kernel. It runs eagerly, also inside compiled code (not a custom op: it returns its input, which ops may not).

The mixing matrix from its logits (softmax and Sinkhorn), ``genolc::mhc_comb_weights`` and
``genolc::mhc_comb_weights_backward``: on CUDA the kernels of ``comb_triton.py``; elsewhere the reference and its
written-out backward (``reference.comb_weights_backward``, which the CPU tests check against autograd). Saved for the
backward: the logits only.

The merge, ``genolc::mhc_merge`` and ``genolc::mhc_merge_backward`` (``new[m] = post[m] * block_out + sum_n
comb[n, m] * streams[n]`` in fp32, rounded to the streams' dtype once): on CUDA the kernels of ``merge_triton.py``;
elsewhere ``reference.merge`` and ``reference.merge_backward``. Saved for the backward: the four inputs, which the
compiled merge it replaces kept as well.

To torch.compile the custom ops are opaque (their kernels are not traced) and each backward is an op of its own, so
that the compiled backward graph can call it.
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


def block_input_forward(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                        norm_eps: float, hc_eps: float, n_streams: int, tf32: bool, *, kernels: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(``[M, W]`` fp32 logits, ``[M]`` rstd, the block's input ``[M, D]`` in x's dtype) from ``x [M, N * D]``: with
    ``kernels`` the Triton kernels (triton.py; tests/gpu/triton_interpreter_check.py runs them on CPU tensors), else
    the reference's formulas in fp32."""
    with torch.autocast(x.device.type, enabled=False):
        if kernels:
            from genolc.model.ops.mhc import triton as mhc_triton

            logits, rstd = mhc_triton.fused_mixing_logits(x, weight, norm_eps, tf32=tf32)
            return logits, rstd, mhc_triton.block_input(x, logits, scale, base, hc_eps, n_streams)
        logits, rstd = reference.mixing_logits_and_rstd(x, weight, norm_eps)
        pre = reference.pre_weights(logits, scale, base, n_streams, hc_eps)
        return logits, rstd, reference.weighted_streams(x, pre)


def block_input_gradients(grad_logits: torch.Tensor, grad_block: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          scale: torch.Tensor, base: torch.Tensor, logits: torch.Tensor, rstd: torch.Tensor,
                          hc_eps: float, tf32: bool, grad_x: torch.Tensor | None = None, *, kernels: bool,
                          backward_config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(``dx, dweight, dscale, dbase``) of :func:`block_input_forward`, each in its input's dtype; with ``kernels`` the
    Triton kernels' path (see :func:`block_input_forward`), the mixing backward's tiles from ``backward_config``
    (triton.BackwardConfig; None: its default).

    With ``z = logits[:, :N] * scale[0] + base[:N]`` and ``pre = sigmoid(z) + eps``: ``dpre[m, n] = <g_block[m],
    x[m, n]>``, ``dz = dpre * sigmoid(z) (1 - sigmoid(z))``; ``dz * scale[0]`` joins the logits' gradient, whose
    backward (:func:`mixing_logits_backward_op`'s formulas) then gives ``dx`` with ``pre[m, n] * g_block[m]`` added to
    stream n's columns: with the kernels inside the same kernel, so x's gradient is written once. ``grad_x`` (x's
    gradient from its other reader, the merge: :class:`BlockInputPassingStreams`) is added there too, in fp32 before
    dx is rounded."""
    n_streams = x.shape[1] // grad_block.shape[1]
    with torch.autocast(x.device.type, enabled=False):
        if kernels:
            from genolc.model.ops.mhc import triton as mhc_triton

            # One kernel forms pre, dz, the logits' gradient with dz's share and the mixing backward's operands.
            scaled, coef, pre, sums = mhc_triton.block_input_backward(x, grad_block, grad_logits, logits, rstd,
                                                                      scale, base, hc_eps)
            d_scale = torch.nn.functional.pad(sums[n_streams:], (0, scale.numel() - 1))
            d_base = torch.nn.functional.pad(sums[:n_streams], (0, base.numel() - n_streams))
            tiles = {} if backward_config is None else {"config": backward_config}
            dx, d_weight = mhc_triton.fused_mixing_logits_backward(scaled, coef, x, weight, tf32=tf32, pre=pre,
                                                                   grad_block=grad_block, grad_x=grad_x, **tiles)
        else:
            sig = torch.sigmoid(logits[:, :n_streams] * scale[0] + base[:n_streams])
            pre = sig + hc_eps
            d_pre = (grad_block.float().unsqueeze(1) * x.float().view(x.shape[0], n_streams, -1)).sum(-1)
            dz = d_pre * sig * (1 - sig)
            grad32 = grad_logits.float().clone()
            grad32[:, :n_streams] += dz * scale[0]
            d_scale = torch.zeros_like(scale, dtype=torch.float32)
            d_scale[0] = (dz * logits[:, :n_streams]).sum()
            d_base = torch.zeros_like(base, dtype=torch.float32)
            d_base[:n_streams] = dz.sum(0)
            scaled = grad32 * rstd[:, None]
            coef = rstd.square() / x.shape[-1] * (grad32 * logits).sum(-1)
            x32 = x.float()
            spread = (pre.unsqueeze(-1) * grad_block.float().unsqueeze(1)).reshape(x.shape)
            dx = scaled @ weight.float() - coef[:, None] * x32 + spread
            dx = (dx if grad_x is None else dx + grad_x.float()).to(x.dtype)
            d_weight = (scaled.t() @ x32).to(weight.dtype)
    return dx, d_weight, d_scale.to(scale.dtype), d_base.to(base.dtype)


def _block_input_grads(ctx, grad_logits: torch.Tensor | None, grad_block: torch.Tensor | None,
                       grad_x: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, weight, scale, base, logits, rstd = ctx.saved_tensors
    if grad_logits is None:
        grad_logits = torch.zeros_like(logits)
    if grad_block is None:
        grad_block = x.new_zeros((x.shape[0], x.shape[1] // ctx.n_streams))
    return block_input_gradients(grad_logits, grad_block, x, weight, scale, base, logits, rstd, ctx.hc_eps, ctx.tf32,
                                 grad_x=grad_x, kernels=x.is_cuda)


class BlockInputPassingStreams(torch.autograd.Function):
    """The block input (:func:`block_input_forward`, :func:`block_input_gradients`: the kernels on CUDA, their
    formulas in torch elsewhere) that also returns ``x`` itself, for the merge to read: (logits, block input, x).

    x has two readers, this op and the merge (``new = post * block_out + comb^T @ streams``). Were both to read it
    directly, autograd would add their shares of x's gradient in a pass of its own: two reads and a write of the
    ``[M, N * D]`` streams per hyper-connection. Through this function the merge reads x's alias, its share arrives
    here as the third output's gradient, and the backward's kernel adds it where it writes dx (one read more).

    Called eagerly, also inside a compiled method (:func:`block_input` is dynamo-disabled): traced, AOTAutograd
    would hand the alias out as a view of the compiled graph's input, and the merge's share would go around this
    function again, with a zero tensor passed in its place."""

    @staticmethod
    def forward(ctx, x, weight, scale, base, norm_eps, hc_eps, n_streams, tf32):
        logits, rstd, block = block_input_forward(x, weight, scale, base, norm_eps, hc_eps, n_streams, tf32,
                                                  kernels=x.is_cuda)
        ctx.save_for_backward(x, weight, scale, base, logits, rstd)
        ctx.hc_eps, ctx.n_streams, ctx.tf32 = hc_eps, n_streams, tf32
        # An output no one differentiated reaches the backward as None, not as a zero tensor to read.
        ctx.set_materialize_grads(False)
        return logits, block, x

    @staticmethod
    def backward(ctx, grad_logits, grad_block, grad_x):
        return (*_block_input_grads(ctx, grad_logits, grad_block, grad_x), None, None, None, None)


@torch._dynamo.disable
def block_input(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, norm_eps: float,
                hc_eps: float, n_streams: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(``[M, W]`` logits, ``[M, D]`` block input, x for the merge) of :class:`BlockInputPassingStreams`, with
    ``tf32`` as :func:`mixing_logits` sets it."""
    return BlockInputPassingStreams.apply(x, weight, scale, base, norm_eps, hc_eps, n_streams,
                                          torch.is_autocast_enabled(x.device.type))


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
