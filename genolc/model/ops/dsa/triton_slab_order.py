"""The slab order of the DSA backward's index rows in Triton: :func:`slab_order`, one program a row.

Same contract and outputs, bit for bit, as the pure-torch reference
:func:`genolc.model.ops.dsa.tilelang.backward_slabs.slab_order`: each index row ``[B, T, W]`` (int32/int64, -1 for
an empty slot) sorted ascending with its empty slots last (as -1), and ``offsets [B, T, n + 1]`` int32,
``n = max(1, ceil(kv_len / slab_rows))``, where ``offsets[..., s]`` counts the row's keys below ``s * slab_rows``
(clamped below int32's largest) and ``offsets[..., n]`` its valid slots. The slab count, its ValueErrors and the
bounds come from :mod:`genolc.model.ops.dsa.tilelang.backward_config`, as the reference's do.

Why: the reference sorts with ``torch.sort``, which also returns the permutation and so runs a key-value radix sort
(``radixSortKVInPlace``), then ``where``, ``searchsorted`` and ``masked_fill`` over the rows. In the profiled 512k
steps on the H200 (benchmarks/results/indexer_scoring_2026-12-03/call3_5233a82/) the sort kernel alone took
139.2 ms over 52 calls of `base`'s 14.75 s step (2.7 ms a call, 32k rows of 2,051 slots) and 112.1 ms over 21 calls
of `small`'s 6.52 s step (64k rows a call).

Here one program loads its row padded to ``BLOCK``, the power of two at or above ``W``, with int32's largest value
(the empty key) for -1 slots and for the padding, sorts the keys in registers (``tl.sort``, a bitonic network),
stores the first ``W`` with the empty key as -1, and counts the keys below each bound with one block reduction a
bound, when there are at most :data:`KERNEL_BOUNDS`; for more the kernel stores the keys unmapped and
``torch.searchsorted`` cuts the sorted rows, then the empty keys become -1, as in the reference. Rows wider than
:data:`MAX_WIDTH` slots are refused (the backward sorts those with the reference). Any other negative slot value
counts as empty, and int64 values go through the same int32 cast, as in the reference.

Untimed: no GPU has run this kernel yet (benchmarks/bench_slab_order.py times it against the reference); the
interpreter (tests/gpu/triton_interpreter_check.py) and the GPU test (tests/gpu/test_slab_order_triton.py) hold it
to the reference exactly. Triton is imported when the kernel is first built, so CPU installs import this module
without it.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from genolc.model.ops.dsa.tilelang.backward_config import EMPTY_KEY, slab_bounds, slab_count

# Bounds (n + 1) counted in the kernel. Each is one pass of compares and a block reduction over the padded row, so
# 64 passes are about as many as the sort's own compare-and-swap steps (78 at 4,096 keys): the count at most about
# doubles the kernel's work, where a binary search (torch.searchsorted) needs ~12 probes a bound but a second launch
# that reads every row again and a [B, T, n + 1] bounds tensor. It covers the trainer's slabs: 17 bounds at 512k keys
# and 33 at 1M in 32k-row slabs. Untimed; bench_slab_order.py times both paths at 33 bounds.
KERNEL_BOUNDS = 64
# The widest row sorted in registers: 16,384 keys in 16 warps, 32 a thread as at 4,096 (ptxas, sm_90a: 128
# registers, no spill).
MAX_WIDTH = 16384
# Warps of a 4,096-key row (W = 2051): 32 keys a thread. In the layout Triton 3.6 gives the sort (its sm_90 TTGIR) a
# key's low 5 index bits are its lane, the next its warp and the rest its register, so a compare-and-swap step over a
# warp bit goes through shared memory and a barrier: 13 of the sort's 78 steps with 4 warps, 18 with 8. ptxas
# (sm_90a): 128 registers with 4 warps, 80 with 8, 59 with 16, no spill; 4 programs of 4 warps fit an SM's registers,
# and one program a row (32k-64k rows a call) fills the GPU whatever the warps. Untimed (no GPU here):
# bench_slab_order.py --sweep times 4, 8 and 16.
DEFAULT_WARPS = 4


def block_width(width: int) -> int:
    """Keys a program sorts: the power of two at or above ``width`` (at least 1)."""
    return 1 << max(0, width - 1).bit_length()


def default_warps(width: int) -> int:
    """:data:`DEFAULT_WARPS` at 4,096 keys, scaled to the same keys a thread elsewhere (1 to 16 warps)."""
    return min(16, max(1, block_width(width) * DEFAULT_WARPS // 4096))


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def slab_order_kernel(idx_ptr, rows_ptr, offsets_ptr, seq_len, width, slab_rows, counted_bounds, n_bounds,
                          empty_out, stride_b, stride_t, stride_w, BLOCK: tl.constexpr, EMPTY_KEY: tl.constexpr):
        """rows[row] = the row's keys sorted, the empty key stored as ``empty_out``; offsets[row, s] for the first
        ``counted_bounds`` bounds (all ``n_bounds`` or none). ``EMPTY_KEY``: int32's largest (an argument: the
        interpreter does not see the builder's local names)."""
        row = tl.program_id(0).to(tl.int64)
        b = row // seq_len
        t = row - b * seq_len
        slots = tl.arange(0, BLOCK)
        inside = slots < width
        index = tl.load(idx_ptr + b * stride_b + t * stride_t + slots.to(tl.int64) * stride_w, mask=inside, other=-1)
        # The reference's where-then-cast: int64 values wrap to their low 32 bits, like torch's .to(torch.int32).
        keys = tl.where(index < 0, EMPTY_KEY, index).to(tl.int32)
        keys = tl.sort(keys)
        tl.store(rows_ptr + row * width + slots, tl.where(keys == EMPTY_KEY, empty_out, keys), mask=inside)
        for s in range(0, counted_bounds):
            # In int64: s * slab_rows can pass 2^31; the clamp then holds the bound below the empty key.
            bound = tl.minimum((tl.zeros([], tl.int64) + s) * slab_rows, EMPTY_KEY - 1)
            count = tl.sum((keys < bound).to(tl.int32), axis=0)
            tl.store(offsets_ptr + row * n_bounds + s, count)

    return slab_order_kernel


def slab_order(indices: torch.Tensor, slab_rows: int, kv_len: int, *, kernel_bounds: int = KERNEL_BOUNDS,
               warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows [B, T, W]`` int32 (each row ascending, empty slots last as -1) and ``offsets [B, T, n + 1]`` int32, as
    :func:`genolc.model.ops.dsa.tilelang.backward_slabs.slab_order` returns them, on any device Triton runs on (CUDA,
    or CPU tensors under ``TRITON_INTERPRET=1``). ``kernel_bounds``: the most bounds counted in the kernel (more go
    to torch.searchsorted; 0 sends all there); ``warps``: the programs' warps (default :func:`default_warps`); both
    for bench_slab_order.py."""
    n_slabs = slab_count(slab_rows, kv_len)
    if indices.dim() != 3 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be [B, T, W] int32/int64, got {tuple(indices.shape)} {indices.dtype}")
    batch, seq_len, width = indices.shape
    if width > MAX_WIDTH:
        raise ValueError(f"index rows of {width} slots: the Triton slab order sorts at most {MAX_WIDTH} a row in "
                         f"registers; use genolc.model.ops.dsa.tilelang.backward_slabs.slab_order")
    rows = torch.empty(indices.shape, dtype=torch.int32, device=indices.device)
    offsets = torch.empty((batch, seq_len, n_slabs + 1), dtype=torch.int32, device=indices.device)
    if rows.numel() == 0:
        return rows, offsets.zero_()
    in_kernel = n_slabs + 1 <= kernel_bounds
    device = torch.cuda.device(indices.device) if indices.is_cuda else contextlib.nullcontext()
    with device:
        # Slabs of EMPTY_KEY rows or more put every bound past the first at the clamp, as larger ones do.
        _kernel()[(batch * seq_len,)](
            indices, rows, offsets, seq_len, width, min(slab_rows, EMPTY_KEY), n_slabs + 1 if in_kernel else 0,
            n_slabs + 1, -1 if in_kernel else EMPTY_KEY, *indices.stride(), BLOCK=block_width(width),
            EMPTY_KEY=EMPTY_KEY, num_warps=default_warps(width) if warps is None else warps)
    if not in_kernel:
        bounds = slab_bounds(n_slabs, slab_rows, indices.device)
        torch.searchsorted(rows, bounds.expand(batch, seq_len, n_slabs + 1).contiguous(), out_int32=True,
                           out=offsets)
        rows.masked_fill_(rows == EMPTY_KEY, -1)
    return rows, offsets
