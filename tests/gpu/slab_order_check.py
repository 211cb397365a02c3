"""Index rows that reach both paths of the DSA slab order's kernel (genolc.model.ops.dsa.slab_order: ascending rows
packed, rows in any order counting-sorted), and the check of its output against the torch form. Shared by
test_dsa_slab_inputs_triton.py (CUDA) and triton_interpreter_check.py (CPU, Triton's interpreter); pytest does not
collect this file.
"""

from __future__ import annotations

import torch

from genolc.model.ops.dsa import slab_order


def slab_test_rows(batch: int, length: int, width: int, kv_len: int, order: str, seed: int) -> torch.Tensor:
    """``[batch, length, width]`` int64 rows of distinct latent rows below ``kv_len`` (``width <= kv_len``):
    ``ascending`` as the Triton selector writes them (holes anywhere), ``any`` order (the reference selector's are
    best first), or ``mixed`` (every third row in any order). 20 % holes, a quarter of them -3 rather than -1 (any
    negative entry is an empty slot, kept as given), one wholly empty row and one with none."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.stack([torch.randperm(kv_len, generator=gen)[:width] for _ in range(batch * length)])
    ascending = rows.sort(dim=-1).values
    if order == "ascending":
        rows = ascending
    elif order == "mixed":
        rows = torch.where((torch.arange(batch * length) % 3 != 0)[:, None], ascending, rows)
    elif order != "any":
        raise ValueError(f"order must be ascending, any or mixed, got {order!r}")
    holes = torch.rand(rows.shape, generator=gen)
    rows = rows.masked_fill(holes < 0.2, -1).masked_fill(holes < 0.05, -3).reshape(batch, length, width)
    rows[0, length // 2] = -1
    rows[batch - 1, length - 1] = ascending[-1]
    return rows


def slab_order_problems(batch: int, length: int, width: int, kv_len: int, slab_rows: int, order: str,
                        index_dtype: torch.dtype, strided: bool, device: str) -> list[str]:
    """The kernel, into poisoned buffers, against the torch form on :func:`slab_test_rows`: the same rows and
    offsets exactly (empty when they are). ``strided``: the rows are every other query of a longer block."""
    seed = length + width + slab_rows
    indices = slab_test_rows(batch, length, width, kv_len, order, seed).to(device=device, dtype=index_dtype)
    if strided:
        wide = torch.full((batch, 2 * length, width), -5, dtype=index_dtype, device=device)
        wide[:, ::2] = indices
        indices = wide[:, ::2]
    expected = slab_order.slab_order_reference(indices, slab_rows, kv_len)
    out = (torch.full(expected[0].shape, 12345, dtype=torch.int32, device=device),
           torch.full(expected[1].shape, -7, dtype=torch.int32, device=device))
    got = slab_order.slab_order_triton(indices, slab_rows, kv_len, out=out)
    problems = []
    for name, actual, wanted in (("rows", got[0], expected[0]), ("offsets", got[1], expected[1])):
        if actual.shape != wanted.shape or actual.dtype != torch.int32:
            problems.append(f"{name}: {tuple(actual.shape)} {actual.dtype} vs {tuple(wanted.shape)}")
        elif not torch.equal(actual, wanted):
            first = (actual != wanted).nonzero()[0].tolist()
            problems.append(f"{name}: {int((actual != wanted).sum())} entries differ, first at {first}")
    return problems
