"""Score blocks that reach each path of the indexer's top-k kernel (genolc.model.ops.indexer.triton_topk), the
check of its output against the pure-torch reference (``reference.top_pools``), and the check of the scoring kernel
that writes the top-k's first read itself. Shared by test_indexer_triton.py (CUDA) and triton_interpreter_check.py
(CPU, Triton's interpreter); pytest does not collect this file.
"""

from __future__ import annotations

import torch

from genolc.model.ops.indexer import reference
from genolc.model.ops.indexer import triton as indexer_triton
from genolc.model.ops.indexer.triton_topk import TopPoolsBuffers, launch_shape, top_pools

# The distinct scores of the `levels` and `tied_overflow` blocks.
LEVELS = (-3.5, -0.25, 0.0, 0.125, 1.5, 2.0, 7.0)


def score_blocks(rows: int, cols: int, keep: int, *, seed: int, device: str) -> dict[str, torch.Tensor]:
    """fp32 ``[rows, cols]`` blocks by what they exercise: spread scores (the candidate slots), ReLU-like zeros and
    -0.0 (ties at the cut, and rows with fewer than ``keep`` scores above zero), spread scores with every ``G``-th
    pool (one whole group) far below the rest, a plateau with that group far above it (the floor lands on the
    plateau and the candidates overflow their slots; with ``keep`` or more of the group visible the cut comes
    from counts over the whole row), all-equal rows, scores of a few distinct values of both signs (an untrained
    model's: ties at the cut in every row, whose kept pools are chosen among thousands of equal ones by id), and
    those levels with the group raised far above them (the floor lands on the top level, thousands of equal
    scores, and the candidates overflow; the cut over the whole row, the radix selection, lands on a repeated
    value)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    groups = launch_shape(keep).groups
    spread = torch.randn(rows, cols, generator=gen)
    zeros = torch.relu(torch.randn(rows, cols, generator=gen) - 2.0)
    half = zeros[::3, ::2]
    zeros[::3, ::2] = torch.where(half == 0, -0.0, half)     # -0.0 beside +0.0 in every third row
    low_group = torch.rand(rows, cols, generator=gen)
    low_group[:, ::groups] = -100.0
    # The floor is the keep-th largest of the groups' two best scores: all but one group's are the plateau's.
    overflow = torch.full((rows, cols), 0.25)
    overflow[:, ::groups] = 1.0 + torch.rand(rows, overflow[:, ::groups].shape[1], generator=gen)
    equal = torch.full((rows, cols), 0.5)
    levels = torch.tensor(LEVELS)[torch.randint(0, len(LEVELS), (rows, cols), generator=gen)]
    tied_overflow = torch.where(levels == 0, torch.where(torch.rand(rows, cols, generator=gen) < 0.5, -0.0, 0.0),
                                levels)
    tied_overflow[:, ::groups] += 100.0
    return {name: block.to(device) for name, block in
            {"spread": spread, "zeros": zeros, "low_group": low_group, "overflow": overflow, "equal": equal,
             "levels": levels, "tied_overflow": tied_overflow}.items()}


def top_pools_problems(scores: torch.Tensor, out: torch.Tensor, *, first_query: int, kpool: int,
                       keep: int) -> list[str]:
    """What is wrong with ``out``, the kernel's answer for ``scores``: rows that differ from
    :func:`genolc.model.ops.indexer.reference.top_pools` (empty when none do)."""
    expected = reference.top_pools(scores, first_query=first_query, kpool=kpool, keep=keep)
    problems = []
    for t in torch.nonzero((out.long() != expected).any(-1)).flatten().tolist()[:3]:
        n = min((first_query + t + 1) // kpool, scores.shape[1])
        differ = int((out[t].long() != expected[t]).sum())
        problems.append(f"row {t} ({n} visible pools): {differ} of {keep} slots differ from the reference")
    return problems


def overflow_problems(name: str, scores: torch.Tensor, buffers: TopPoolsBuffers, *, first_query: int, kpool: int,
                      keep: int) -> list[str]:
    """Whether the overflow blocks reached the paths they are for, from the counters a top_pools call left in
    ``buffers``: candidates over their slots wherever a row's plateau (all of ``overflow``'s pools, the top level's
    share of ``tied_overflow``'s) outnumbers its slots, and in ``tied_overflow``, where a row sees more than ``keep`` pools of
    the high group, the cut over the whole row (``keep`` or more scores above the floor)."""
    rows, cap = scores.shape[0], buffers.cand_vals.shape[1]
    longest = min((first_query + rows) // kpool, scores.shape[1])
    plateau = {"overflow": longest, "tied_overflow": longest // len(LEVELS)}.get(name, 0)
    if plateau <= cap:
        return []
    copied, above = buffers.counts[:rows, 0].cpu(), buffers.counts[:rows, 1].cpu()
    overflowed = copied > cap
    if not overflowed.any():
        return [f"{name}: no row's candidates overflowed their slots (at most {int(copied.max())})"]
    if name == "tied_overflow" and longest // launch_shape(keep).groups > keep and not (
            overflowed & (above >= keep)).any():
        return [f"{name}: no overflowed row had keep or more scores above its floor"]
    return []


def score_tops_problems(rows: int, n_pools: int, first_query: int, keep: int, heads: int, dim: int, *,
                        dtype: torch.dtype, device: str) -> list[str]:
    """The scoring kernel that also writes the groups' two best scores (``pool_score_block`` with ``tops``): its block
    against the plain scoring kernel's (the same causal mask; the same values to fp32 rounding: the tiles differ, and
    the interpreter's products may round a column differently by where it sits in a tile), its tops against
    top_pools' own first read of that block for every segment a row sees, and the pools kept from either tops (the
    same, and a top-k of the block). One head with positive weights makes half the scores ReLU's exact zeros
    (ties)."""
    gen = torch.Generator(device="cpu").manual_seed(n_pools + heads)
    index_q = torch.randn(rows, heads, dim, generator=gen).to(device=device, dtype=dtype)
    weights = (torch.rand(rows, heads, generator=gen) if heads == 1
               else torch.randn(rows, heads, generator=gen)).to(device)
    pooled = torch.randn(n_pools, dim, generator=gen).to(device=device, dtype=dtype)
    kpool, scale = 4, dim ** -0.5
    shape = launch_shape(keep)
    plain, fused = (torch.full((rows, n_pools), float("nan"), device=device) for _ in range(2))
    own_buffers, read_buffers = (TopPoolsBuffers.allocate(rows, n_pools, keep, torch.device(device), shape)
                                 for _ in range(2))
    for buffers in (own_buffers, read_buffers):
        buffers.tops.fill_(12345)
    indexer_triton.pool_score_block(index_q, weights, pooled, first_query, scale, kpool, plain)
    indexer_triton.pool_score_block(index_q, weights, pooled, first_query, scale, kpool, fused,
                                    tops=own_buffers.tops, shape=shape)
    problems = []
    if not torch.equal(torch.isfinite(plain), torch.isfinite(fused)) or bool(fused.isnan().any()):
        problems.append("the blocks' causal masks differ (or a score was not written)")
    elif not torch.allclose(plain, fused, rtol=1e-5, atol=1e-6):
        problems.append(f"blocks differ (max {float((plain - fused).nan_to_num(0, 0, 0).abs().max()):.3g})")
    kept = [torch.empty(rows, keep, dtype=torch.int64, device=device) for _ in range(2)]
    top_pools(fused, first_query=first_query, kpool=kpool, keep=keep, out=kept[0], buffers=own_buffers, shape=shape,
              tops_ready=True)
    top_pools(fused, first_query=first_query, kpool=kpool, keep=keep, out=kept[1], buffers=read_buffers,
              shape=shape)
    visible = torch.clamp((first_query + torch.arange(rows) + 1) // kpool, max=n_pools)
    own_tops, read_tops = own_buffers.tops.cpu(), read_buffers.tops.cpu()
    for row in range(rows):
        seen = -(-int(visible[row]) // shape.segment) * 2 * shape.groups
        if not torch.equal(own_tops[row, :seen], read_tops[row, :seen]):
            problems.append(f"row {row}: tops differ")
    if not torch.equal(kept[0], kept[1]):
        problems.append(f"kept pools differ in {int((kept[0] != kept[1]).any(-1).sum())} rows")
    return problems + top_pools_problems(fused.cpu(), kept[0].cpu(), first_query=first_query, kpool=kpool, keep=keep)
