"""The process mesh: data-parallel (DP) x context-parallel (CP) groups over torch.distributed.

Processes are started by ``torchrun`` (one per GPU, or any number on CPU); genolc reads torchrun's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) and never starts processes itself. Ranks
are laid out CP-major: global rank ``g`` is CP rank ``g % cp`` of DP group ``g // cp``, so the ranks that share a
window are neighbours (one host's NVLink before the network). Backends: NCCL for CUDA, gloo for CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from genolc.errors import ConfigError
from genolc.parallel.launch import alike_on_every_rank, launched_by_torchrun, rank_writes


@dataclass(frozen=True)
class Mesh:
    """This process's place in the mesh; groups are None in a single process."""

    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    cp_rank: int
    cp_size: int
    cp_group: object | None = None      # the ranks sharing this process's window
    dp_group: object | None = None      # the ranks holding the same CP slice of different windows

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files (checkpoints, metrics, summary): genolc.parallel.launch."""
        return rank_writes(self.rank)


SINGLE = Mesh(rank=0, world_size=1, dp_rank=0, dp_size=1, cp_rank=0, cp_size=1)


def split_world(world_size: int, cp: int) -> int:
    """The data-parallel size for ``cp`` context-parallel ranks out of ``world_size``; refuses what does not divide."""
    if not isinstance(cp, int) or cp < 1:
        raise ConfigError(f"--cp must be a positive number of ranks, got {cp!r}", where="--cp")
    if world_size % cp:
        raise ConfigError(f"--cp {cp} does not divide the {world_size} processes torchrun started", where="--cp",
                          fix=f"start a multiple of {cp} processes (torchrun --nproc-per-node), or use a --cp that "
                              f"divides {world_size}")
    return world_size // cp


def init_mesh(cp: int, device_type: str) -> Mesh:
    """Join (or start) the default process group from torchrun's environment and build the DP x CP groups.

    ``device_type`` "cuda" uses NCCL and binds this process to GPU ``LOCAL_RANK``; "cpu" uses gloo. Without
    torchrun's environment this is a single process: ``--cp`` must then be 1.
    """
    if not launched_by_torchrun():
        if cp != 1:
            raise ConfigError(f"--cp {cp} needs {cp} processes, but this one was not started by torchrun",
                              where="--cp", fix=f"launch with torchrun --nproc-per-node {cp} -m genolc.cli finetune "
                                                f"... --cp {cp}")
        return SINGLE
    try:
        world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    except ValueError:
        raise ConfigError(f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} in the "
                          "environment are not whole numbers", where="the environment",
                          fix="launch with torchrun, or unset RANK and WORLD_SIZE") from None
    with alike_on_every_rank():
        dp_size = split_world(world_size, cp)
    if world_size == 1:
        return SINGLE
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        # RANK and WORLD_SIZE alone (a scheduler's or a shell's) are not a torchrun launch: torch would fail its
        # rendezvous with a traceback.
        raise ConfigError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not, so there is no process "
                          "group to join", where="the environment",
                          fix="launch with torchrun (it sets all four), or unset RANK and WORLD_SIZE")
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return build_mesh(rank, world_size, cp, dp_size)


def build_mesh(rank: int, world_size: int, cp: int, dp_size: int) -> Mesh:
    """The groups of an initialised default process group (every rank creates every group, as torch requires)."""
    cp_group = dp_group = None
    for dp_index in range(dp_size):
        ranks = list(range(dp_index * cp, (dp_index + 1) * cp))
        group = dist.new_group(ranks)
        if rank in ranks:
            cp_group = group
    for cp_index in range(cp):
        ranks = list(range(cp_index, world_size, cp))
        group = dist.new_group(ranks)
        if rank in ranks:
            dp_group = group
    return Mesh(rank=rank, world_size=world_size, dp_rank=rank // cp, dp_size=dp_size, cp_rank=rank % cp,
                cp_size=cp, cp_group=cp_group, dp_group=dp_group)
