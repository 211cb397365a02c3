"""python benchmarks/topk_ties_model.py   (CPU, seconds)

How often the indexer's top-k kernels (genolc/model/ops/indexer/triton_topk.py) leave their fast path when scores
repeat, as an untrained model's do: at initialisation a pool's index key depends mostly on its few tokens, so a row
of pool scores holds a few hundred distinct values, each many times. For one row of ``n`` scores drawn from
``levels`` distinct values (uniform, or Dirichlet-skewed as k-mer frequencies are), the kernels' floor (the lowest
of ``G`` strided groups' second-best scores) is computed as the kernels do, and counted: the candidates at or above
it (more than ``CAP`` send the row to the row-wide path, up to 32 reads of the row), and whether the cut falls in a
tie that needs the bisection over pool ids. keep 512 (topk 2048 / kpool 4), G 256, CAP 4096 (launch_shape(512)).
Prints a table and writes JSON (command, git SHA) to $OUT or benchmarks/results/topk_ties_model_<date>.json.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from genolc.model.ops.indexer.triton_topk import launch_shape  # noqa: E402

KEEP = 512
TRIALS = 20


def one_row(n: int, levels: int | None, skew: float | None, generator: torch.Generator) -> tuple[int, bool, bool]:
    """(candidates at or above the floor, the row-wide path taken, the id bisection taken) for one random row."""
    shape = launch_shape(KEEP)
    if levels is None:
        scores = torch.randn(n, generator=generator, dtype=torch.float64)
    else:
        values = torch.randn(levels, generator=generator, dtype=torch.float64)
        weights = (torch.ones(levels, dtype=torch.float64) if skew is None else
                   torch._standard_gamma(torch.full((levels,), skew, dtype=torch.float64)))
        scores = values[torch.multinomial(weights, n, replacement=True, generator=generator)]
    pad = (-n) % shape.groups
    grouped = torch.cat([scores, torch.full((pad,), float("-inf"), dtype=torch.float64)]).view(-1, shape.groups)
    floor = grouped.topk(2, dim=0).values[1].min()
    copied = int((scores >= floor).sum())
    cut = scores.topk(KEEP).values[-1]
    ids_bisected = int((scores == cut).sum()) > KEEP - int((scores > cut).sum())
    return copied, copied > shape.cap, ids_bisected


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for n in (4096, 32768, 131072):
        for levels, skew in ((None, None), (256, None), (256, 0.3), (64, None)):
            results = [one_row(n, levels, skew, generator) for _ in range(TRIALS)]
            rows.append({"pools": n, "distinct_scores": levels or "continuous", "dirichlet_skew": skew,
                         "mean_candidates": sum(r[0] for r in results) / TRIALS,
                         "row_wide_path": sum(r[1] for r in results) / TRIALS,
                         "id_bisection": sum(r[2] for r in results) / TRIALS})
            print(json.dumps(rows[-1]), flush=True)
    out = Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results"))
    out.mkdir(parents=True, exist_ok=True)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent).stdout.strip()
    path = out / f"topk_ties_model_{datetime.date.today().isoformat()}.json"
    path.write_text(json.dumps({"command": "python benchmarks/topk_ties_model.py", "git_sha": sha,
                                "trials_per_row": TRIALS, "keep": KEEP, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
