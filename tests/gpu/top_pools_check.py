"""Score blocks that reach each path of the indexer's top-k kernel (genolc.model.ops.indexer.triton_topk), and the
check of its output against the pure-torch reference (``reference.top_pools``). Shared by test_indexer_triton.py
(CUDA) and triton_interpreter_check.py (CPU, Triton's interpreter); pytest does not collect this file.
"""

from __future__ import annotations

import torch

from genolc.model.ops.indexer import reference
from genolc.model.ops.indexer.triton_topk import launch_shape


def score_blocks(rows: int, cols: int, keep: int, *, seed: int, device: str) -> dict[str, torch.Tensor]:
    """fp32 ``[rows, cols]`` blocks by what they exercise: spread scores (the candidate slots), ReLU-like zeros and
    -0.0 (ties at the cut, and rows with fewer than ``keep`` scores above zero), every ``G``-th pool far below the
    rest (the candidates overflow their slots; the cut comes from counts over the whole row), all-equal rows,
    scores of a few distinct values of both signs (an untrained model's: ties at the cut in every row, whose kept
    pools are chosen among thousands of equal ones by id), and those with the overflow as well."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    spread = torch.randn(rows, cols, generator=gen)
    zeros = torch.relu(torch.randn(rows, cols, generator=gen) - 2.0)
    half = zeros[::3, ::2]
    zeros[::3, ::2] = torch.where(half == 0, -0.0, half)     # -0.0 beside +0.0 in every third row
    overflow = torch.rand(rows, cols, generator=gen)
    overflow[:, :: launch_shape(keep).groups] = -100.0
    equal = torch.full((rows, cols), 0.5)
    levels = torch.tensor([-3.5, -0.25, 0.0, 0.125, 1.5, 2.0, 7.0])[torch.randint(0, 7, (rows, cols), generator=gen)]
    # The same levels with -0.0 beside +0.0 and every G-th pool far below: the candidates overflow, and the cut over
    # the whole row (the radix selection) lands on a value repeated thousands of times.
    tied_overflow = torch.where(levels == 0, torch.where(torch.rand(rows, cols, generator=gen) < 0.5, -0.0, 0.0),
                                levels)
    tied_overflow[:, :: launch_shape(keep).groups] = -100.0
    return {name: block.to(device) for name, block in
            {"spread": spread, "zeros": zeros, "overflow": overflow, "equal": equal, "levels": levels,
             "tied_overflow": tied_overflow}.items()}


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
