"""collectives.broadcast_module: replicas built from different random numbers end up with rank 0's weights (the
trainer broadcasts a fresh model, which each rank initialises on its own device)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from process_group import free_port  # noqa: E402


def _worker(rank: int, world: int, port: int, out: str) -> None:
    from genolc.model import build_model, preset
    from genolc.parallel.collectives import broadcast_module

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(rank)                       # different weights on every rank
        model = build_model(preset("tiny", vocab_size=16))
        broadcast_module(model)
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_ends_with_rank_zeros_weights(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    first, second = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    torch.manual_seed(0)
    from genolc.model import build_model, preset

    own = build_model(preset("tiny", vocab_size=16)).state_dict()
    assert first.keys() == second.keys() == own.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
        assert torch.equal(first[name], own[name]), name      # rank 0's own draw, unchanged
