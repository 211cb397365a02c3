"""``delta = rowsum(O * dO)`` of the DSA sparse attention's backward, computed once for the slab-ordered kernel
(genolc/model/ops/dsa/tilelang/backward_slabs.py), whose blocks each take one (query, slab) pair and would otherwise
compute it once per slab.

    out, d_out  [B, T, H, R]  the forward's o_lat and its gradient (one dtype, contiguous)
    returns     [B, T, H]     fp32: sum over R of out * d_out, the products and the sum in fp32

:func:`row_dot_reference` does it in torch, a few thousand queries at a time (no full fp32 copies of O and dO): five
kernels a piece (two fp32 copies, the product, the sum, the store), some 28 bytes of traffic per element. At a
`base` 32k chunk (12 heads, R = 384: 151M elements) that is about 4.2 GB a call, 52 calls a 512k step; at `small`'s
64k chunk (8 x 256) 3.8 GB, 21 calls. :func:`row_dot_triton` reads each element once (4 bytes of bf16 per element
pair) and writes the fp32 sums: one Triton program per ``ROWS`` (query, head) rows. Not timed on a GPU yet; checked
against the reference under Triton's interpreter (tests/gpu/triton_interpreter_check.py row_dot). :func:`row_dot`
runs the kernel for CUDA tensors it takes, the reference otherwise.
"""

from __future__ import annotations

import functools

import torch

from genolc.model.ops.dsa.triton import next_power_of_2

ROWS = 16                  # (query, head) rows a program
NUM_WARPS = 4
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_RANK = 1024            # one register tile of a row


def row_dot_reference(out: torch.Tensor, d_out: torch.Tensor, rows_per_step: int = 4096) -> torch.Tensor:
    """The module's contract in torch, ``rows_per_step`` queries at a time."""
    delta = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device)
    for t0 in range(0, out.shape[1], rows_per_step):
        t1 = min(out.shape[1], t0 + rows_per_step)
        delta[:, t0:t1] = (out[:, t0:t1].float() * d_out[:, t0:t1].float()).sum(-1)
    return delta


def kernel_unsupported(out: torch.Tensor, d_out: torch.Tensor) -> str | None:
    """Why :func:`row_dot_triton` cannot take these operands (None when it can)."""
    if out.shape != d_out.shape or out.dim() != 4:
        return f"out and d_out of one [B, T, H, R] shape, got {tuple(out.shape)} and {tuple(d_out.shape)}"
    if out.dtype not in KERNEL_DTYPES or out.dtype != d_out.dtype:
        return f"out and d_out of one dtype of {KERNEL_DTYPES}, got {out.dtype} and {d_out.dtype}"
    if not out.is_contiguous() or not d_out.is_contiguous():
        return "non-contiguous out or d_out"
    if out.shape[-1] > MAX_RANK:
        return f"rank {out.shape[-1]} above the kernel's {MAX_RANK}"
    return None


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def row_dot_kernel(out_ptr, d_out_ptr, delta_ptr, n_rows, RANK: tl.constexpr, ROWS: tl.constexpr,
                       BLOCK_R: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        ranks = tl.arange(0, BLOCK_R)
        inside = (rows < n_rows)[:, None] & (ranks < RANK)[None, :]
        tile = rows[:, None] * RANK + ranks[None, :]
        o = tl.load(out_ptr + tile, mask=inside, other=0.0).to(tl.float32)
        do = tl.load(d_out_ptr + tile, mask=inside, other=0.0).to(tl.float32)
        tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=rows < n_rows)

    return row_dot_kernel


def row_dot_triton(out: torch.Tensor, d_out: torch.Tensor) -> torch.Tensor:
    """The module's contract in one Triton kernel (CUDA, or CPU under ``TRITON_INTERPRET=1``); ValueError for operands
    it does not take (:func:`kernel_unsupported`)."""
    unsupported = kernel_unsupported(out, d_out)
    if unsupported:
        raise ValueError(f"the Triton row dot does not take {unsupported}; use row_dot_reference")
    delta = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device)
    n_rows = delta.numel()
    if n_rows:
        rank = out.shape[-1]
        _kernel()[(-(-n_rows // ROWS),)](out, d_out, delta, n_rows, RANK=rank, ROWS=ROWS,
                                         BLOCK_R=max(16, next_power_of_2(rank)), num_warps=NUM_WARPS)
    return delta


def row_dot(out: torch.Tensor, d_out: torch.Tensor) -> torch.Tensor:
    """The module's contract: the Triton kernel for CUDA operands it takes, the torch form otherwise."""
    if out.is_cuda and kernel_unsupported(out, d_out) is None:
        return row_dot_triton(out, d_out)
    return row_dot_reference(out, d_out)
