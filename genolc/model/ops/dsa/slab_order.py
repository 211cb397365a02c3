"""Index rows grouped by key slab, for the slab-ordered DSA backward (genolc/model/ops/dsa/tilelang/backward_slabs.py).

Contract (both forms): ``indices [B, T, W]`` int32/int64 latent rows, -1 for an empty slot, every valid one below
``kv_len``; slabs of ``slab_rows`` rows, ``n = ceil(kv_len / slab_rows)`` of them (at least 1). Returns

    rows     [B, T, W]      int32: each row's valid slots grouped by slab, in the order they had within a slab (the
                            Triton selector's ascending rows stay ascending), its empty slots (negative, as given) last
    offsets  [B, T, n + 1]  int32: query t's slots in slab s are rows[b, t, offsets[b, t, s]:offsets[b, t, s + 1]],
                            and offsets[..., n] is its count of valid slots

:func:`slab_order_reference` is the pure-torch form: a stable sort of each slot's slab number (uint8 up to 255 slabs),
a gather, and searchsorted for the cuts. On the H200 it took 2.33 ms a call for `base`'s last 32k chunk at 512k and
4.62 ms for `small`'s last 64k chunk (the radix sort alone 1.17 and 2.39 ms; benchmarks/results/
finetune_sync_slab_2026-12-04/): some 120 ms of `base`'s 512k step (52 calls) and 97 ms of `small`'s (21).

:func:`slab_order_triton` does it in one Triton program a row, two reads of the row and one write. The first read
counts the slots per slab (the cuts, by a prefix sum) and checks whether the valid slots' slabs ever fall along the
row. Where they do not (the Triton selector's rows: pools ascending, then the tail), grouping by slab is packing the
valid slots in order with the empty ones after them: one prefix sum a block. Other rows (the reference selector's,
best first) take a stable counting sort, one scan of the block per slab: correct for every row, slower. An index at
or past ``kv_len`` breaks the contract in both forms (the kernel counts it in the last slab; the backward would read
past the latent either way).

:func:`slab_order` picks the kernel for CUDA rows with a contiguous last dimension and at most ``MAX_KERNEL_SLABS``
slabs (the kernel's per-slab counts live in registers), the reference otherwise. Not timed on a GPU yet: the
kernel was checked against the reference under Triton's interpreter (tests/gpu/triton_interpreter_check.py
slab_order); benchmarks/bench_slab_order.py times the forms.
"""

from __future__ import annotations

import functools

import torch

from genolc.model.ops.dsa.triton import next_power_of_2

_INT32_MAX = torch.iinfo(torch.int32).max        # rows are int32: every latent row index must fit
MAX_SLABS = 65535          # CUDA's limit on gridDim.y, the slab-ordered backward's slab axis
MAX_KERNEL_SLABS = 255     # the kernel's per-slab counts, in a register tile of 256 bins
BLOCK = 1024               # slots a step of the kernel
NUM_WARPS = 4


def slab_count(slab_rows: int, kv_len: int) -> int:
    """``ceil(kv_len / slab_rows)`` (at least 1); ValueError for sizes the rows or the backward's grid cannot take."""
    if slab_rows < 1:
        raise ValueError(f"slab_rows must be positive, got {slab_rows}")
    if kv_len >= _INT32_MAX:
        raise ValueError(f"kv_len {kv_len} does not fit the int32 rows")
    n_slabs = max(1, -(-kv_len // slab_rows))
    if n_slabs > MAX_SLABS:
        raise ValueError(f"{n_slabs} slabs of {slab_rows} rows over {kv_len} keys: at most {MAX_SLABS} (the grid's "
                         f"second dimension); use slab_rows >= {-(-kv_len // MAX_SLABS)}")
    return n_slabs


def slab_order_reference(indices: torch.Tensor, slab_rows: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's contract in torch: a stable sort on the slab number, a gather, searchsorted for the cuts."""
    n_slabs = slab_count(slab_rows, kv_len)
    # The slab number (n_slabs for an empty slot) as the sort key, in the narrowest dtype that holds it: the row
    # sort's passes go by the key's bits, and 16 slabs (`base` at 512k) need 8 of them where the row's int32 keys
    # took 32.
    key_dtype = torch.uint8 if n_slabs <= 255 else torch.int32
    slabs = torch.where(indices < 0, n_slabs, torch.div(indices, slab_rows, rounding_mode="floor")).to(key_dtype)
    keys, order = slabs.sort(dim=-1, stable=True)
    rows = torch.gather(indices, -1, order).to(torch.int32)
    bounds = torch.arange(n_slabs + 1, device=indices.device).to(key_dtype)
    offsets = torch.searchsorted(keys, bounds.expand(*keys.shape[:-1], n_slabs + 1).contiguous(), out_int32=True)
    return rows.contiguous(), offsets.contiguous()


def kernel_unsupported(indices: torch.Tensor, n_slabs: int) -> str | None:
    """Why :func:`slab_order_triton` cannot take these rows (None when it can)."""
    if indices.dim() != 3 or indices.dtype not in (torch.int32, torch.int64):
        return f"indices must be [B, T, W] int32/int64, got {tuple(indices.shape)} {indices.dtype}"
    if indices.shape[-1] > 1 and indices.stride(-1) != 1:
        return f"indices needs a contiguous last dimension, got strides {indices.stride()}"
    if n_slabs > MAX_KERNEL_SLABS:
        return f"{n_slabs} slabs, more than the kernel's {MAX_KERNEL_SLABS}"
    if indices.shape[0] > 65535:
        return f"batch {indices.shape[0]} exceeds the grid's 65535"
    return None


@functools.cache
def _kernel():
    from genolc.model.ops.dsa import slab_order_kernel

    return slab_order_kernel.slab_order_kernel


def slab_order_triton(indices: torch.Tensor, slab_rows: int, kv_len: int, *,
                      out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's contract in one Triton program per row (CUDA, or CPU under ``TRITON_INTERPRET=1``); ``out``:
    ``(rows, offsets)`` buffers to write (contiguous int32 of the returned shapes). ValueError for rows it does not
    take (:func:`kernel_unsupported`)."""
    n_slabs = slab_count(slab_rows, kv_len)
    unsupported = kernel_unsupported(indices, n_slabs)
    if unsupported:
        raise ValueError(f"the Triton slab order does not take {unsupported}; use slab_order_reference")
    batch, seq_len, width = indices.shape
    shapes = ((batch, seq_len, width), (batch, seq_len, n_slabs + 1))
    if out is None:
        out = tuple(torch.empty(shape, dtype=torch.int32, device=indices.device) for shape in shapes)
    for buffer, shape in zip(out, shapes):
        if tuple(buffer.shape) != shape or buffer.dtype != torch.int32 or not buffer.is_contiguous():
            raise ValueError(f"out buffers must be contiguous int32 {shapes[0]} and {shapes[1]}, got "
                             f"{[(tuple(b.shape), b.dtype) for b in out]}")
    rows, offsets = out
    if batch and seq_len:
        bins = 1 << n_slabs.bit_length()                  # a power of two above n_slabs: the empty slots' key fits
        _kernel()[(seq_len, batch)](
            indices, rows, offsets, seq_len, width, slab_rows, n_slabs, indices.stride(0), indices.stride(1),
            BLOCK=min(BLOCK, max(16, next_power_of_2(width))), BINS=max(bins, 16), num_warps=NUM_WARPS)
    return rows, offsets


def slab_order(indices: torch.Tensor, slab_rows: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's contract: the Triton kernel for CUDA rows it takes, the torch form otherwise."""
    n_slabs = slab_count(slab_rows, kv_len)
    if indices.is_cuda and kernel_unsupported(indices, n_slabs) is None:
        return slab_order_triton(indices, slab_rows, kv_len)
    return slab_order_reference(indices, slab_rows, kv_len)
