"""KDA's short causal depthwise convolution with SiLU, as K shifted multiply-adds instead of a convolution kernel.

    padded  [B, L + K - 1, C]  the layer's q/k/v projections, preceded by the K - 1 inputs before them (zeros, or a
                               chunk's predecessors), in the activations' dtype
    weight  [C, K]             one filter per channel (the ``nn.Conv1d(C, C, K, groups=C)`` weight without its
                               middle axis), fp32
    returns [B, L, C] in padded's dtype:  y[t, c] = silu(sum_k weight[c, k] * padded[t + k, c])

Why not ``F.conv1d``: with K = 4, PyTorch's depthwise kernels on the H200 took 132 ms of a 2.66 s compiled `small`
step at 128k (forward 75, input gradient 33, weight gradient 24; benchmarks/results/training_speed_2026-12-01.md),
plus the transposes to channels-first and back around them. Written as shifted products the whole convolution is
element-wise over the channels-last layout: K multiply-adds. The sum runs in fp32 (the weight's dtype) whatever the
activations' dtype; autocast's ``conv1d`` ran it in bf16.

Both directions are custom ops, ``genolc::kda_conv_silu`` and ``genolc::kda_conv_silu_backward``: on CUDA
conv_triton.py's Triton kernels (it says why compiling the torch code was not enough), elsewhere
:func:`torch_conv_silu_parts` and :func:`torch_conv_silu_backward`, which the CPU tests hold to autograd of the
definition. The output can come as ``parts`` contiguous channel ranges (:func:`causal_conv_silu_parts`: the layer's
q, k and v), and the backward takes their gradients as they are. Memory: the autograd function keeps only ``padded``
(activations' dtype) and the weight, and the backward recomputes the pre-activation (an eager chain of products would
keep fp32 copies of each shifted input). It is differentiable once (a second derivative raises).
:func:`reference_causal_conv_silu` is the definition through ``F.conv1d``, which the tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


def check_conv_inputs(padded: torch.Tensor, weight: torch.Tensor) -> None:
    if padded.dim() != 3 or weight.dim() != 2 or weight.shape[0] != padded.shape[2]:
        raise ValueError(f"padded must be [B, L + K - 1, C] and weight [C, K]; got {tuple(padded.shape)} and "
                         f"{tuple(weight.shape)}")
    if padded.shape[1] < weight.shape[1] - 1:
        raise ValueError(f"padded has {padded.shape[1]} positions, fewer than the K - 1 = {weight.shape[1] - 1} "
                         f"that precede the first output")


def _pre_activation(padded: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``z [B, L, C]`` fp32 (or wider): ``sum_k weight[:, k] * padded[:, t + k]``. A product with the fp32 taps
    promotes the activations without a separate cast, so eager mode holds one fp32 product beside the sum."""
    kernel = weight.shape[1]
    length = padded.shape[1] - kernel + 1
    taps = weight.to(torch.promote_types(weight.dtype, torch.float32))
    mixed = padded[:, 0:length] * taps[:, 0]
    for k in range(1, kernel):
        mixed.add_(padded[:, k:k + length] * taps[:, k])
    return mixed


def torch_conv_silu_parts(padded: torch.Tensor, weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
    """The forward in torch (CPU, and CUDA inputs the kernels do not take): ``parts`` contiguous channel ranges."""
    out = F.silu(_pre_activation(padded, weight), inplace=True).to(padded.dtype)
    if parts == 1:
        return (out,)
    # Copies, not .contiguous(): with one row or none a column slice is contiguous already, and a custom op's
    # outputs must not share memory.
    return tuple(part.clone(memory_format=torch.contiguous_format) for part in out.chunk(parts, dim=-1))


def torch_conv_silu_backward(grads: Sequence[torch.Tensor], padded: torch.Tensor, weight: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d_padded in padded's dtype, d_weight in weight's dtype)`` from the parts' gradients: the backward in torch;
    conv_triton.py's kernel computes the same sums in the same order."""
    grad_out = grads[0] if len(grads) == 1 else torch.cat(list(grads), dim=-1)
    kernel = weight.shape[1]
    mixed = _pre_activation(padded, weight)
    length = mixed.shape[1]
    gate = torch.sigmoid(mixed)
    # silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))), formed in place over z: in eager mode the backward holds
    # at most three fp32 [B, L, C] tensors (at 32k tokens of `base`, 0.6 GB each).
    grad_mixed = mixed.mul_(1 - gate).add_(1).mul_(gate).mul_(grad_out)
    del gate
    taps = weight.to(grad_mixed.dtype)
    # padded[s] feeds outputs t = s - k: its gradient is sum_k weight[k] * grad_mixed[s - k].
    grad = torch.zeros(padded.shape, dtype=grad_mixed.dtype, device=grad_mixed.device)
    for k in range(kernel):
        grad[:, k:k + length].add_(grad_mixed * taps[:, k])
    grad_weight = torch.stack([(grad_mixed * padded[:, k:k + length]).sum(dim=(0, 1)) for k in range(kernel)], dim=1)
    return grad.to(padded.dtype), grad_weight.to(weight.dtype)


def _kernels_take(padded: torch.Tensor, weight: torch.Tensor, parts: int, grads: Sequence[torch.Tensor] = ()) -> bool:
    if not padded.is_cuda:
        return False
    from genolc.model.ops.kda import conv_triton

    return conv_triton.unsupported_reason(padded, weight, parts, grads=grads) is None


@torch.library.custom_op("genolc::kda_conv_silu", mutates_args=())
def conv_silu_op(padded: torch.Tensor, weight: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """The convolution's output as ``parts`` contiguous channel ranges: conv_triton.py's kernel on CUDA,
    :func:`torch_conv_silu_parts` elsewhere. Ops of their own (this and the backward) so that torch.compile calls
    the kernels as they are rather than tracing the torch code into its own kernels."""
    if _kernels_take(padded, weight, parts):
        from genolc.model.ops.kda import conv_triton

        return list(conv_triton.conv_silu_forward(padded, weight, parts))
    return list(torch_conv_silu_parts(padded, weight, parts))


@conv_silu_op.register_fake
def _conv_silu_shapes(padded: torch.Tensor, weight: torch.Tensor, parts: int) -> list[torch.Tensor]:
    batch, padded_length, channels = padded.shape
    shape = (batch, padded_length - weight.shape[1] + 1, channels // parts)
    return [padded.new_empty(shape) for _ in range(parts)]


@torch.library.custom_op("genolc::kda_conv_silu_backward", mutates_args=())
def conv_silu_backward_op(grads: list[torch.Tensor], padded: torch.Tensor, weight: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution's backward from its parts' gradients: conv_triton.py's kernel on CUDA,
    :func:`torch_conv_silu_backward` elsewhere."""
    if _kernels_take(padded, weight, len(grads), grads):
        from genolc.model.ops.kda import conv_triton

        return conv_triton.conv_silu_backward(grads, padded, weight)
    return torch_conv_silu_backward(grads, padded, weight)


@conv_silu_backward_op.register_fake
def _conv_silu_backward_shapes(grads: list[torch.Tensor], padded: torch.Tensor, weight: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(padded, memory_format=torch.contiguous_format),
            torch.empty_like(weight, memory_format=torch.contiguous_format))


class CausalConvSiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded: torch.Tensor, weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        ctx.save_for_backward(padded, weight)
        return tuple(conv_silu_op(padded, weight, parts))

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        padded, weight = ctx.saved_tensors
        grad_padded, grad_weight = conv_silu_backward_op(list(grads), padded, weight)
        return (grad_padded if ctx.needs_input_grad[0] else None,
                grad_weight if ctx.needs_input_grad[1] else None, None)


def causal_conv_silu(padded: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu(causal depthwise conv)``: ``padded [B, L + K - 1, C]``, ``weight [C, K]`` -> ``[B, L, C]`` in padded's
    dtype (see the module docstring)."""
    check_conv_inputs(padded, weight)
    return CausalConvSiLU.apply(padded, weight, 1)[0]


def causal_conv_silu_parts(padded: torch.Tensor, weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
    """:func:`causal_conv_silu`'s output as ``parts`` contiguous ``[B, L, C / parts]`` tensors (channel ranges in
    order): the layer's q, k and v, written by the kernel where they go."""
    check_conv_inputs(padded, weight)
    if parts < 1 or padded.shape[2] % parts:
        raise ValueError(f"{padded.shape[2]} channels do not split into {parts} equal parts")
    return CausalConvSiLU.apply(padded, weight, parts)


def reference_causal_conv_silu(padded: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same through ``F.conv1d`` in fp32 (the definition the tests hold :func:`causal_conv_silu` to)."""
    check_conv_inputs(padded, weight)
    dtype = torch.promote_types(weight.dtype, torch.float32)
    mixed = F.conv1d(padded.transpose(1, 2).to(dtype), weight.to(dtype).unsqueeze(1), groups=padded.shape[2])
    return F.silu(mixed).transpose(1, 2).to(padded.dtype)
