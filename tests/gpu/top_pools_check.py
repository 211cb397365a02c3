"""Score blocks that reach each path of the indexer's top-k kernel (genolc.model.ops.indexer.triton_topk), and the
check of its output against ``torch.topk``. Shared by test_indexer_triton.py (CUDA) and triton_interpreter_check.py
(CPU, Triton's interpreter); pytest does not collect this file.
"""

from __future__ import annotations

import torch

from genolc.model.ops.indexer.triton_topk import launch_shape


def score_blocks(rows: int, cols: int, keep: int, *, seed: int, device: str) -> dict[str, torch.Tensor]:
    """fp32 ``[rows, cols]`` blocks by what they exercise: spread scores (the candidate slots), ReLU-like zeros and
    -0.0 (ties at the cut, and rows with fewer than ``keep`` scores above zero), every ``G``-th pool far below the
    rest (the candidates overflow their slots; the cut comes from counts over the whole row) and all-equal rows."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    spread = torch.randn(rows, cols, generator=gen)
    zeros = torch.relu(torch.randn(rows, cols, generator=gen) - 2.0)
    half = zeros[::3, ::2]
    zeros[::3, ::2] = torch.where(half == 0, -0.0, half)     # -0.0 beside +0.0 in every third row
    overflow = torch.rand(rows, cols, generator=gen)
    overflow[:, :: launch_shape(keep).groups] = -100.0
    equal = torch.full((rows, cols), 0.5)
    return {name: block.to(device) for name, block in
            {"spread": spread, "zeros": zeros, "overflow": overflow, "equal": equal}.items()}


def ordered(scores: torch.Tensor) -> torch.Tensor:
    """fp32 -> int32 patterns in the floats' order, as the kernels compare scores (-0.0 just below +0.0, NaNs
    above +inf and below -inf by sign)."""
    bits = scores.contiguous().view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def top_pools_problems(scores: torch.Tensor, out: torch.Tensor, *, first_query: int, kpool: int,
                       keep: int) -> list[str]:
    """What is wrong with ``out``, the kernel's answer for ``scores`` (empty when it is exactly the documented
    top-``keep``: the best ordered patterns, the lowest pool ids among those tied at the cut, ascending, -1 after)."""
    problems = []
    for t in range(scores.shape[0]):
        n = min((first_query + t + 1) // kpool, scores.shape[1])
        kept = min(n, keep)
        row = out[t].long()
        # A stable descending sort keeps tied patterns in pool order, so its first `kept` are the expected pools.
        expected = torch.sort(ordered(scores[t, :n]), descending=True, stable=True).indices[:kept].sort().values
        if not bool((row[kept:] == -1).all()):
            problems.append(f"row {t}: {int((row[kept:] != -1).sum())} slots after the kept pools are not -1")
        elif not torch.equal(row[:kept], expected):
            problems.append(f"row {t}: {int((~torch.isin(row[:kept], expected)).sum())} of the {kept} kept pools "
                            f"differ from the expected ones (or the order does)")
        if len(problems) >= 3:
            break
    return problems
