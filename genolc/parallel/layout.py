"""Which positions of a window each context-parallel rank holds.

The window's ``T`` positions are cut into ``P`` consecutive pieces of ``T // P`` or ``T // P + 1`` tokens (any ``T``
works: it need not be a multiple of the pool size or of the rank count).

- ``contiguous``: ``P = cp``, rank ``r`` holds piece ``r``. Simple, but causal attention makes the last rank's
  queries see the most keys, so DSA work grows with the rank.
- ``zigzag`` (load-balanced): ``P = 2 cp``, rank ``r`` holds pieces ``r`` and ``2 cp - 1 - r``: every rank gets one
  early and one late piece, so every rank's queries see about as many keys.

A rank runs its pieces concatenated in piece order as one sequence (``[B, sum of piece lengths]``): everything but
the token mixers is per token. The mixers (genolc/parallel/kda_cp.py, dsa_cp.py) split it back into pieces, each of
which is a chunk of the window in the sense of genolc/model/cache.py: it starts at an absolute position and sees
what every earlier position left.
"""

from __future__ import annotations

from dataclasses import dataclass

from genolc.errors import ConfigError

LAYOUTS = ("zigzag", "contiguous")


@dataclass(frozen=True)
class Piece:
    index: int          # the piece's place in the window (0 .. P - 1)
    start: int          # absolute position of its first token
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Layout:
    """The pieces of a ``window_len``-token window over ``cp`` ranks (see the module docstring)."""

    window_len: int
    cp: int
    name: str = "zigzag"

    def __post_init__(self) -> None:
        if self.name not in LAYOUTS:
            raise ConfigError(f"unknown context-parallel layout {self.name!r}", where="--cp-layout",
                              fix=f"choose one of {', '.join(LAYOUTS)}")
        if self.window_len < self.piece_count:
            raise ConfigError(f"{self.window_len} tokens (a window, or one chunk of it under --chunk) cannot be cut "
                              f"into the {self.piece_count} pieces that --cp {self.cp} with the {self.name} layout "
                              "needs", where="--seq / --chunk / --cp",
                              fix=f"use a longer --seq, a --chunk that leaves at least {self.piece_count} tokens for "
                                  "the last chunk, or a smaller --cp")

    @property
    def piece_count(self) -> int:
        return self.cp * (2 if self.name == "zigzag" else 1)

    @property
    def pieces(self) -> list[Piece]:
        count = self.piece_count
        bounds = [i * self.window_len // count for i in range(count + 1)]
        return [Piece(i, bounds[i], bounds[i + 1]) for i in range(count)]

    @property
    def longest_piece(self) -> int:
        return -(-self.window_len // self.piece_count)

    def rank_pieces(self, rank: int) -> list[Piece]:
        """Rank ``rank``'s pieces, in window order (the order its tokens are concatenated in)."""
        if not 0 <= rank < self.cp:
            raise ValueError(f"rank {rank} is outside a context-parallel group of {self.cp}")
        pieces = self.pieces
        if self.name == "contiguous":
            return [pieces[rank]]
        return [pieces[rank], pieces[2 * self.cp - 1 - rank]]

    def owner(self, piece_index: int) -> tuple[int, int]:
        """``(rank, slot)``: the rank holding piece ``piece_index`` and its place among that rank's pieces."""
        if self.name == "contiguous":
            return piece_index, 0
        if piece_index < self.cp:
            return piece_index, 0
        return 2 * self.cp - 1 - piece_index, 1
