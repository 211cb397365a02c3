"""The kept DSA forwards' store on the CPU: the host arena's packing, and what the store hands back.

The copies through page-locked memory and the side stream run on the GPU only (tests/gpu/test_kept_attention_fast.py);
here the arena's blocks are ordinary memory (no CUDA device to page-lock for) and the store keeps CPU tensors as they
are."""

from __future__ import annotations

import threading

import torch

from genolc.train import kept_attention
from genolc.train.kept_attention import ALIGN_BYTES, KeptAttention, PinnedArena, _byte_pieces


def test_the_arena_packs_tensors_across_its_blocks_and_gives_them_back(monkeypatch):
    monkeypatch.setattr(kept_attention, "BLOCK_BYTES", 3 * ALIGN_BYTES)
    arena = PinnedArena()
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3000, generator=generator).bfloat16(), torch.randn(7, 5, generator=generator),
               torch.randn(2 * ALIGN_BYTES, generator=generator)]
    stored = []
    for tensor in tensors:
        pieces = arena.take(tensor.numel() * tensor.element_size())
        assert sum(piece.numel() for piece in pieces) == tensor.numel() * tensor.element_size()
        for target, source in zip(pieces, _byte_pieces(tensor, pieces)):
            target.copy_(source)
        stored.append(pieces)
    assert len(arena.blocks) == 4, "6000 + 140 + 32768 bytes, each from a page, in blocks of 12 KiB"
    for tensor, pieces in zip(tensors, stored):
        back = torch.empty_like(tensor)
        for target, source in zip(_byte_pieces(back, pieces), pieces):
            target.copy_(source)
        assert torch.equal(back, tensor)
    arena.reset()
    arena.take(100)
    assert len(arena.blocks) == 4 and arena.used == 100, "a new window reuses the blocks from the start"


def test_the_store_hands_each_forward_back_once():
    store = KeptAttention()
    out, lse = torch.randn(1, 4, 2, 3), torch.randn(1, 4, 2)
    store.put(0, 3, out, lse)
    assert store.take(0, 2, torch.device("cpu")) is None
    got = store.take(0, 3, torch.device("cpu"))
    assert got[0] is out and got[1] is lse
    assert store.take(0, 3, torch.device("cpu")) is None
    store.put(4, 3, out, lse)
    store.clear()
    assert store.take(4, 3, torch.device("cpu")) is None


class _SignallingCondition(threading.Condition):
    """A condition that sets ``waiting`` whenever a thread waits on it."""

    def __init__(self, waiting: threading.Event) -> None:
        super().__init__()
        self.waiting = waiting

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


def _arena_with_slow_blocks(monkeypatch, release: threading.Event,
                            entered: threading.Event | None = None) -> tuple[PinnedArena, list[str]]:
    """An arena whose first block is made only once ``release`` is set (``entered`` is set as it starts); ``made``
    names the thread of each block."""
    made = []
    arena = PinnedArena()

    def block():
        if not made:
            if entered is not None:
                entered.set()
            assert release.wait(timeout=10)
        made.append(threading.current_thread().name)
        return torch.zeros(kept_attention.BLOCK_BYTES, dtype=torch.uint8)

    monkeypatch.setattr(arena, "_block", block)
    return arena, made


def test_blocks_reserved_in_a_thread_are_the_ones_taken(monkeypatch):
    """reserve() page-locks a window's blocks in a thread from the run's start; take() waits for a block that thread
    has not made yet instead of allocating a second one, and makes blocks itself once the thread is done."""
    monkeypatch.setattr(kept_attention, "BLOCK_BYTES", 2 * ALIGN_BYTES)
    taking = threading.Event()
    arena, made = _arena_with_slow_blocks(monkeypatch, release=taking)
    # The thread's first block waits until take() waits for it.
    arena._blocks_added = _SignallingCondition(taking)
    arena.reserve(3 * 2 * ALIGN_BYTES - 1)
    pieces = arena.take(5 * ALIGN_BYTES)
    arena.stop_reserving()
    assert made == ["genolc-pinned-arena"] * 3, "the three blocks came from the thread, none from take()"
    assert [piece.data_ptr() for piece in pieces] == [arena.blocks[i].data_ptr() for i in range(3)]
    more = arena.take(2 * ALIGN_BYTES)
    assert len(arena.blocks) == 4 and made[-1] == threading.current_thread().name
    assert more[-1].data_ptr() == arena.blocks[3].data_ptr()


def test_stopping_the_reservation_leaves_the_rest_to_take(monkeypatch):
    """stop_reserving() (the run ends) lets the thread finish the block it is making and no more."""
    monkeypatch.setattr(kept_attention, "BLOCK_BYTES", ALIGN_BYTES)
    release, entered = threading.Event(), threading.Event()
    arena, made = _arena_with_slow_blocks(monkeypatch, release, entered)
    arena.reserve(4 * ALIGN_BYTES)
    assert entered.wait(timeout=10)
    # The first block is let go only once the stop is asked for, so the thread sees it before a second block.
    stopping = threading.Thread(target=arena.stop_reserving)
    stopping.start()
    for _ in range(1000):
        if arena._stop_reserving:
            break
        threading.Event().wait(0.01)
    release.set()
    stopping.join(timeout=10)
    assert not stopping.is_alive()
    assert made == ["genolc-pinned-arena"], "one block of the four reserved"
    assert sum(piece.numel() for piece in arena.take(3 * ALIGN_BYTES)) == 3 * ALIGN_BYTES
    assert made[1:] == [threading.current_thread().name] * 2


def test_a_failing_reservation_leaves_the_blocks_to_take(monkeypatch, caplog):
    monkeypatch.setattr(kept_attention, "BLOCK_BYTES", ALIGN_BYTES)
    arena = PinnedArena()
    calls = []

    def block():
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise RuntimeError("cannot allocate memory\nmore")
        return torch.zeros(ALIGN_BYTES, dtype=torch.uint8)

    monkeypatch.setattr(arena, "_block", block)
    arena.reserve(2 * ALIGN_BYTES)
    assert len(arena.take(2 * ALIGN_BYTES)) == 2
    arena.stop_reserving()
    assert calls[0] == "genolc-pinned-arena" and calls[1:] == [threading.current_thread().name] * 2
    assert "stopped (cannot allocate memory): the first pass allocates the rest" in caplog.text
