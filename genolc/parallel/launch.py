"""Which process of a torchrun launch writes the run's files and speaks for it, from torchrun's environment alone.

Global rank 0 writes outputs (checkpoints, metrics, the run record, the output directory's claim) and prints what
the user reads; every other rank stays quiet. A process without torchrun's ``RANK`` and ``WORLD_SIZE`` is a single
process and does both. This module reads only the environment (no torch), so the command line can ask it before
torch is imported and before any process group exists.
"""

from __future__ import annotations

import os

OUTPUT_RANK = 0


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def env_rank() -> int:
    """This process's global rank from torchrun's environment; 0 for a single process, and when ``RANK`` is not a
    whole number (genolc.parallel.mesh.init_mesh then refuses the environment, so rank 0 must be the one to say)."""
    if not launched_by_torchrun():
        return 0
    try:
        return int(os.environ["RANK"])
    except ValueError:
        return OUTPUT_RANK


def rank_writes(rank: int) -> bool:
    """Whether global rank ``rank`` writes the run's files and prints for every rank: rank 0 only."""
    return rank == OUTPUT_RANK


def writes_outputs() -> bool:
    """:func:`rank_writes` for this process, before (or without) a process mesh."""
    return rank_writes(env_rank())

