"""The Triton kernels of :mod:`genolc.model.ops.mhc.merge_triton` (what they compute and why is said there).

Imports Triton at import time: merge_triton imports this module when it first runs.
"""

import triton
import triton.language as tl


@triton.jit
def _program_rows(post_ptr, rows, N: tl.constexpr, ROWS: tl.constexpr):
    """This program's ``ROWS`` tokens: which exist, their int64 row numbers, the stream numbers and the tokens'
    ``post`` weights in fp32."""
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = row < rows
    row64 = row.to(tl.int64)
    streams = tl.arange(0, N)
    post = tl.load(post_ptr + row64[:, None] * N + streams[None, :], mask=live[:, None], other=0.0)
    return live, row64, streams, post.to(tl.float32)


@triton.jit
def merge_forward_kernel(block_ptr, post_ptr, comb_ptr, streams_ptr, out_ptr, rows, dim,
                         N: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    live, row64, streams, post = _program_rows(post_ptr, rows, N, ROWS)
    for start in range(0, dim, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        inside = live[:, None] & (cols < dim)[None, :]
        block = tl.load(block_ptr + row64[:, None] * dim + cols[None, :], mask=inside, other=0.0)
        merged = post[:, :, None] * block.to(tl.float32)[:, None, :]
        for n in tl.static_range(N):
            comb_n = tl.load(comb_ptr + row64[:, None] * (N * N) + n * N + streams[None, :], mask=live[:, None],
                             other=0.0).to(tl.float32)
            stream_n = tl.load(streams_ptr + row64[:, None] * (N * dim) + n * dim + cols[None, :], mask=inside,
                               other=0.0).to(tl.float32)
            merged = merged + comb_n[:, :, None] * stream_n[:, None, :]
        offsets = row64[:, None, None] * (N * dim) + streams[None, :, None] * dim + cols[None, None, :]
        tl.store(out_ptr + offsets, merged.to(out_ptr.dtype.element_ty), mask=inside[:, None, :])


@triton.jit
def merge_backward_kernel(grad_ptr, block_ptr, post_ptr, comb_ptr, streams_ptr, d_block_ptr, d_post_ptr,
                          d_comb_ptr, d_streams_ptr, rows, dim,
                          N: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    live, row64, streams, post = _program_rows(post_ptr, rows, N, ROWS)
    d_post = tl.zeros([ROWS, N], tl.float32)
    d_comb = tl.zeros([ROWS, N, N], tl.float32)
    for start in range(0, dim, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        inside = live[:, None] & (cols < dim)[None, :]
        offsets = row64[:, None, None] * (N * dim) + streams[None, :, None] * dim + cols[None, None, :]
        grad = tl.load(grad_ptr + offsets, mask=inside[:, None, :], other=0.0).to(tl.float32)
        block = tl.load(block_ptr + row64[:, None] * dim + cols[None, :], mask=inside, other=0.0)
        block = block.to(tl.float32)
        d_post += tl.sum(grad * block[:, None, :], axis=2)
        d_block = tl.sum(post[:, :, None] * grad, axis=1)
        tl.store(d_block_ptr + row64[:, None] * dim + cols[None, :],
                 d_block.to(d_block_ptr.dtype.element_ty), mask=inside)
        for n in tl.static_range(N):
            comb_n = tl.load(comb_ptr + row64[:, None] * (N * N) + n * N + streams[None, :], mask=live[:, None],
                             other=0.0).to(tl.float32)
            stream_offsets = row64[:, None] * (N * dim) + n * dim + cols[None, :]
            stream_n = tl.load(streams_ptr + stream_offsets, mask=inside, other=0.0).to(tl.float32)
            d_stream_n = tl.sum(comb_n[:, :, None] * grad, axis=1)
            tl.store(d_streams_ptr + stream_offsets, d_stream_n.to(d_streams_ptr.dtype.element_ty), mask=inside)
            products = tl.sum(stream_n[:, None, :] * grad, axis=2)
            d_comb += tl.where((streams == n)[None, :, None], products[:, None, :], 0.0)
    tl.store(d_post_ptr + row64[:, None] * N + streams[None, :], d_post.to(d_post_ptr.dtype.element_ty),
             mask=live[:, None])
    comb_offsets = row64[:, None, None] * (N * N) + streams[None, :, None] * N + streams[None, None, :]
    tl.store(d_comb_ptr + comb_offsets, d_comb.to(d_comb_ptr.dtype.element_ty), mask=live[:, None, None])
