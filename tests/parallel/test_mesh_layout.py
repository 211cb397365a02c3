"""The context-parallel layouts' pieces and the mesh's refusals (no processes needed)."""

from __future__ import annotations

import pytest

from genolc.errors import ConfigError
from genolc.parallel.layout import Layout
from genolc.parallel.mesh import init_mesh, split_world


@pytest.mark.parametrize("name, cp", [("zigzag", 2), ("zigzag", 4), ("contiguous", 3)])
def test_pieces_cover_the_window_once_and_ranks_own_them(name, cp):
    layout = Layout(1001, cp, name)
    pieces = layout.pieces
    assert pieces[0].start == 0 and pieces[-1].stop == 1001
    assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    held = sorted(p.index for rank in range(cp) for p in layout.rank_pieces(rank))
    assert held == list(range(layout.piece_count))
    for rank in range(cp):
        for slot, piece in enumerate(layout.rank_pieces(rank)):
            assert layout.owner(piece.index) == (rank, slot)


def test_zigzag_gives_each_rank_an_early_and_a_late_piece():
    layout = Layout(800, 4, "zigzag")
    assert [[p.index for p in layout.rank_pieces(r)] for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    # Causal work per rank (keys seen, summed over its queries) is balanced, unlike the contiguous layout.
    work = [sum(p.stop ** 2 - p.start ** 2 for p in layout.rank_pieces(r)) for r in range(4)]
    assert max(work) / min(work) < 1.05


def test_a_window_too_short_for_the_pieces_is_refused():
    with pytest.raises(ConfigError, match="cannot be cut into the 8 pieces"):
        Layout(7, 4, "zigzag")
    with pytest.raises(ConfigError, match="unknown context-parallel layout"):
        Layout(100, 2, "ring")


def test_cp_must_divide_the_world_and_needs_torchrun(monkeypatch):
    with pytest.raises(ConfigError, match="--cp 3 does not divide the 4 processes"):
        split_world(4, 3)
    assert split_world(8, 2) == 4
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="not started by torchrun"):
        init_mesh(2, "cpu")
    assert init_mesh(1, "cpu").world_size == 1


def test_rank_variables_without_a_rendezvous_are_one_message_not_a_traceback(monkeypatch):
    from genolc.parallel.mesh import SINGLE

    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert init_mesh(1, "cpu") is SINGLE
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="MASTER_ADDR and MASTER_PORT are not"):
        init_mesh(1, "cpu")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="not whole numbers"):
        init_mesh(1, "cpu")
