"""Score blocks that reach each path of the indexer's top-k kernel (genolc.model.ops.indexer.triton_topk), and the
check of its output against the pure-torch reference (``reference.top_pools``). Shared by test_indexer_triton.py
(CUDA) and triton_interpreter_check.py (CPU, Triton's interpreter); pytest does not collect this file.
"""

from __future__ import annotations

import torch

from genolc.model.ops.indexer import reference
from genolc.model.ops.indexer.triton_topk import TopPoolsBuffers, launch_shape

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
