"""Which process of a torchrun launch writes the run's files and speaks for it, from torchrun's environment alone.

Global rank 0 writes outputs (checkpoints, metrics, the run record, the output directory's claim) and prints what
the user reads; every other rank stays quiet. A process without torchrun's ``RANK`` and ``WORLD_SIZE`` is a single
process and does both. This module reads only the environment (no torch), so the command line can ask it before
torch is imported and before any process group exists.

An error that every rank raises alike (an option or configuration value that is invalid, checked before any
process-group work: :func:`alike_on_every_rank`) is printed once, by rank 0; the other ranks leave with the same
exit code without a message. Errors raised anywhere else are printed by every rank that meets them: one met by a
single rank (a file missing on one node, a GPU that is not there) must not go unsaid.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from genolc.errors import ConfigError

OUTPUT_RANK = 0
# A quiet rank waits this long before it exits: torchrun stops every worker as soon as one fails, so leaving at once
# could end rank 0 before it prints the error they share (it meets it within milliseconds of the others).
QUIET_EXIT_DELAY_S = 5.0


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


def quiet_rank() -> bool:
    """Whether this process is a rank other than 0 of a real torchrun launch: one with a rendezvous address
    (``MASTER_ADDR``/``MASTER_PORT``) and more than one process, so a rank 0 exists that reports shared errors."""
    if not launched_by_torchrun() or not all(os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT")):
        return False
    try:
        world_size = int(os.environ["WORLD_SIZE"])
    except ValueError:
        return False
    return world_size > 1 and not writes_outputs()


def leave_quietly(exit_code: int) -> None:
    """Exit with ``exit_code`` and no message, after rank 0 has had time to print the error every rank shares."""
    time.sleep(QUIET_EXIT_DELAY_S)
    sys.exit(exit_code)


@contextmanager
def alike_on_every_rank() -> Iterator[None]:
    """Around checks that every rank runs alike before any process-group work (options, their combination, the
    world size): a :class:`~genolc.errors.ConfigError` raised inside is printed by rank 0 only, the other ranks
    leave with its exit code and no message. Keep file, device and network checks outside: those can fail on one
    node alone."""
    try:
        yield
    except ConfigError as exc:
        if quiet_rank():
            leave_quietly(exc.exit_code)
        raise
