"""mHC's merge ``new[m] = post[m] * block_out + sum_n comb[n, m] * streams[n]`` in two Triton kernels, one pass over
the streams each way, summed in fp32 and rounded to the streams' dtype once (``reference.merge`` with an fp32
``compute_dtype``; the terms are added in its order).

Why a kernel: compiled by inductor, the merge's backward took three kernels, a reduction for the ``N x N + N``
inner products per token and two element-wise passes for the gradients of the streams and of the block's output,
each reading the output's gradient again. In `base`'s bare 512k step on the H200 (benchmarks/results/
mfu_ceiling_2026-12-04/, call 1) those three took 389 ms in 512 calls, 0.76 ms for a 32k chunk whose streams'
tensors are 384 MiB each. Here each program takes ``ROWS`` tokens and walks their ``D`` columns in blocks:

    forward    reads block_out and the N streams, writes the N new streams
    backward   reads the new streams' gradient, the streams and block_out once; writes the gradients of the streams
               and of block_out, and keeps the token's ``N x N`` and ``N`` inner products in registers until the
               last column block

N must be a power of two (``tl.arange``; GLM-5.3-Flash has 4). Runs on CUDA, or on CPU tensors under
``TRITON_INTERPRET=1`` (tests/gpu/triton_interpreter_check.py). The kernels are in merge_kernels.py, imported
(with Triton) at the first call.
"""

from __future__ import annotations

import functools

import torch

ROWS = 4
BLOCK_D = 256
NUM_WARPS = 4
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _kernels():
    from genolc.model.ops.mhc import merge_kernels

    return merge_kernels.merge_forward_kernel, merge_kernels.merge_backward_kernel


def unsupported_reason(block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                       streams: torch.Tensor) -> str | None:
    """Why the kernels cannot take these inputs, or None: ``streams [..., N, D]`` with N a power of two,
    ``block_out [..., D]``, ``post [..., N]``, ``comb [..., N, N]`` over the same leading dimensions, one device, fp32,
    bf16 or fp16."""
    if streams.dim() < 2:
        return f"streams must be [..., N, D], got {tuple(streams.shape)}"
    n, dim = streams.shape[-2:]
    lead = tuple(streams.shape[:-2])
    if n < 1 or n & (n - 1):
        return f"N = {n} streams, the kernels take a power of two"
    expected = {"block_out": lead + (dim,), "post": lead + (n,), "comb": lead + (n, n)}
    for name, tensor in (("block_out", block_out), ("post", post), ("comb", comb)):
        if tuple(tensor.shape) != expected[name]:
            return f"{name} is {tuple(tensor.shape)}, expected {expected[name]} for streams {tuple(streams.shape)}"
        if tensor.device != streams.device:
            return f"{name} is on {tensor.device}, the streams on {streams.device}"
    for name, tensor in (("block_out", block_out), ("post", post), ("comb", comb), ("streams", streams)):
        if tensor.dtype not in KERNEL_DTYPES:
            return f"{name} is {tensor.dtype}, the kernels take {', '.join(str(d) for d in KERNEL_DTYPES)}"
    return None


def _new_like(tensor: torch.Tensor) -> torch.Tensor:
    # Row-major whatever the input's strides (a size-1 dimension may keep an odd stride through .contiguous(), and
    # empty_like would copy it): the custom ops promise contiguous outputs to torch.compile.
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)


def _check(block_out, post, comb, streams, rows_per_program: int, block_d: int) -> None:
    reason = unsupported_reason(block_out, post, comb, streams)
    if reason is not None:
        raise ValueError(reason)
    for name, value in (("rows_per_program", rows_per_program), ("block_d", block_d)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two (a tl.arange length), got {value}")


def merge(block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, streams: torch.Tensor, *,
          rows_per_program: int = ROWS, block_d: int = BLOCK_D, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """``reference.merge(block_out, post, comb, streams, compute_dtype=torch.float32)``: a new contiguous tensor of
    the streams' shape and dtype. The keywords: powers of two, for benchmarks/bench_mhc_merge.py."""
    _check(block_out, post, comb, streams, rows_per_program, block_d)
    n, dim = streams.shape[-2:]
    block_out, post, comb, streams = (t.contiguous() for t in (block_out, post, comb, streams))
    out = _new_like(streams)
    rows = streams.numel() // (n * dim) if dim else 0
    if rows:
        forward, _ = _kernels()
        forward[(-(-rows // rows_per_program),)](block_out, post, comb, streams, out, rows, dim, N=n,
                                                 ROWS=rows_per_program, BLOCK_D=block_d, num_warps=num_warps)
    return out


def merge_backward(grad: torch.Tensor, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                   streams: torch.Tensor, *, rows_per_program: int = ROWS, block_d: int = BLOCK_D,
                   num_warps: int = NUM_WARPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``reference.merge_backward``: (``d block_out, d post, d comb, d streams``), each in its input's dtype."""
    _check(block_out, post, comb, streams, rows_per_program, block_d)
    if grad.shape != streams.shape:
        raise ValueError(f"grad {tuple(grad.shape)} and streams {tuple(streams.shape)} must have one shape")
    n, dim = streams.shape[-2:]
    grad, block_out, post, comb, streams = (t.contiguous() for t in (grad, block_out, post, comb, streams))
    d_block, d_post, d_comb, d_streams = (_new_like(t) for t in (block_out, post, comb, streams))
    rows = streams.numel() // (n * dim) if dim else 0
    if rows:
        _, backward = _kernels()
        backward[(-(-rows // rows_per_program),)](grad, block_out, post, comb, streams, d_block, d_post, d_comb,
                                                  d_streams, rows, dim, N=n, ROWS=rows_per_program,
                                                  BLOCK_D=block_d, num_warps=num_warps)
    else:
        d_post.zero_()
        d_comb.zero_()
    return d_block, d_post, d_comb, d_streams
