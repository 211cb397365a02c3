"""The DSA layers' sparse-attention forwards, kept from the chunked step's first pass for its second.

The chunked step (genolc/train/chunked.py) runs every chunk's forward but the last twice: once without grad to fill
the window's caches, once with grad before the chunk's backward (the last chunk's only once, with grad). A DSA
layer's sparse attention gives the same ``o_lat`` and log-sum-exp both times: the same queries over the same latent
rows and, with the kept selections, the same pools. Its forward is a gather of ``W`` latent rows per query, bound by
memory: 0.82 s of a 16.3 s `base` step at 512k on the H200, 0.36 s of `small`'s 7.85 s
(benchmarks/results/kda_inputs_2026-12-03/), for the second pass alone. Kept, the second pass runs only its backward
(``kept=`` of genolc.model.ops.dispatch.sparse_latent_attention).

What is kept is large: ``o_lat`` is ``H * R`` values a token and layer, 18 GiB for `base`'s four DSA layers at 512k
tokens (bf16), more than the device has left at that length. On CUDA it therefore goes to host memory: each
forward is copied out on a side stream as the first pass makes it, and in the second pass, which runs the chunks
last to first, the chunk before the one computing is copied back while it computes. The device holds at most two
chunks' forwards at once. The host memory is page-locked blocks of ``BLOCK_BYTES`` (:class:`PinnedArena`), each
forward packed into them byte by byte and the blocks reused by every later window: torch's pinned allocator rounds
each allocation up to a power of two, which for a 302 MB forward of `base` would take 512 MB. Off CUDA (the CPU tests)
the forwards stay where they are.

If the second pass's queries differ from the first's by rounding (a compiled graph with and without grad may fuse
differently), its backward uses the first pass's probabilities with the second pass's queries: the gradient of the
forward whose outputs the later chunks read, to that rounding.
"""

from __future__ import annotations

import logging
import threading

import torch

_logger = logging.getLogger(__name__)

Key = tuple[int, int]          # (chunk start, layer index)
# A power of two, so that torch's pinned allocator gives each block exactly this much.
BLOCK_BYTES = 256 << 20
# Each kept tensor starts on a page.
ALIGN_BYTES = 4096


class PinnedArena:
    """Page-locked host memory for one window's kept forwards: blocks of ``BLOCK_BYTES`` filled in order, emptied
    (not freed) for the next window. Where the host refuses to page-lock a block it is ordinary memory instead, whose
    copies then run synchronously (said once).

    Page-locking is slow: the 18 GiB `base` keeps at 512k took 13.1 s of its first step on the H200 machine, in the
    first pass's copies (benchmarks/results/finetune_sync_slab_2026-12-04/, ``_block``). :meth:`reserve` therefore
    allocates the blocks a window will need in a thread of their own from the run's start, while the first step
    compiles; torch lets go of the GIL while it allocates, and :meth:`take` waits for a block the thread has not
    made yet."""

    def __init__(self) -> None:
        self.blocks: list[torch.Tensor] = []
        self.used = 0
        self._unpinned_said = False
        self._blocks_added = threading.Condition()
        self._reserving: threading.Thread | None = None
        self._stop_reserving = False

    def reset(self) -> None:
        self.used = 0

    def reserve(self, nbytes: int) -> None:
        """Start allocating, in a thread, the blocks that ``nbytes`` of kept forwards fill (a no-op while one runs)."""
        if self._reserving is not None and self._reserving.is_alive():
            return
        self._stop_reserving = False
        self._reserving = threading.Thread(target=self._reserve, args=(-(-nbytes // BLOCK_BYTES),),
                                           name="genolc-pinned-arena")
        self._reserving.start()

    def stop_reserving(self) -> None:
        """Stop the thread after the block it is allocating (the run ends) and wait for it."""
        self._stop_reserving = True
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None

    def _reserve(self, blocks: int) -> None:
        try:
            while not self._stop_reserving:
                with self._blocks_added:
                    if len(self.blocks) >= blocks:
                        return
                block = self._block()
                with self._blocks_added:
                    self.blocks.append(block)
                    self._blocks_added.notify_all()
        except Exception as error:
            # take() makes the rest itself, where the same failure, if it comes again, stops the run as usual.
            _logger.warning("page-locking host memory for the kept DSA forwards ahead of the first pass stopped (%s): "
                            "the first pass allocates the rest", str(error).splitlines()[0])
        finally:
            with self._blocks_added:
                self._blocks_added.notify_all()

    def _block_at(self, index: int) -> torch.Tensor:
        """Block ``index``, waiting for the reserving thread while it is still making blocks, else made here."""
        with self._blocks_added:
            while index >= len(self.blocks) and self._reserving is not None and self._reserving.is_alive():
                self._blocks_added.wait(timeout=1.0)
            if index < len(self.blocks):
                return self.blocks[index]
        block = self._block()
        with self._blocks_added:
            self.blocks.append(block)
            return self.blocks[index]

    def take(self, nbytes: int) -> list[torch.Tensor]:
        """``nbytes`` of the arena as uint8 pieces of its blocks, in order."""
        self.used = -(-self.used // ALIGN_BYTES) * ALIGN_BYTES
        pieces = []
        while nbytes:
            index, offset = divmod(self.used, BLOCK_BYTES)
            block = self._block_at(index)
            size = min(nbytes, BLOCK_BYTES - offset)
            pieces.append(block[offset: offset + size])
            self.used += size
            nbytes -= size
        return pieces

    def _block(self) -> torch.Tensor:
        try:
            return torch.empty(BLOCK_BYTES, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as error:
            if not self._unpinned_said:
                self._unpinned_said = True
                _logger.warning("could not page-lock host memory for the kept DSA forwards (%s): their copies run "
                                "synchronously", str(error).splitlines()[0])
            return torch.empty(BLOCK_BYTES, dtype=torch.uint8)


def _byte_pieces(tensor: torch.Tensor, pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensor``'s bytes (contiguous) cut like ``pieces``."""
    flat = tensor.reshape(-1).view(torch.uint8)
    cuts, offset = [], 0
    for piece in pieces:
        cuts.append(flat[offset: offset + piece.numel()])
        offset += piece.numel()
    return cuts


class KeptAttention:
    """The kept forwards of one window (``put`` in the first pass, ``take`` in the second); reused across steps,
    where it keeps its page-locked host memory. CUDA tensors go to host memory; others stay where they are."""

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None
        self._arena = PinnedArena()
        # This window's forwards: on the host as (shape, dtype, arena pieces) per tensor, or the tensors themselves.
        self._kept: dict[Key, tuple] = {}
        self._fetched: dict[int, tuple[torch.cuda.Event, dict[int, tuple[torch.Tensor, torch.Tensor]]]] = {}

    def reserve(self, nbytes: int) -> None:
        """Start page-locking, in a thread, the host memory for ``nbytes`` of kept forwards (a window's)."""
        self._arena.reserve(nbytes)

    def close(self) -> None:
        """The run ends: stop page-locking more host memory."""
        self._arena.stop_reserving()

    def clear(self) -> None:
        """Forget this window's forwards (the host memory stays for the next window)."""
        self._kept.clear()
        self._fetched.clear()
        self._arena.reset()

    def put(self, start: int, layer: int, out: torch.Tensor, lse: torch.Tensor) -> None:
        """Keep layer ``layer``'s forward ``(o_lat, lse)`` of the chunk starting at ``start``."""
        if not out.is_cuda:
            self._kept[(start, layer)] = (out, lse)
            return
        stream = self._copy_stream(out.device)
        stream.wait_stream(torch.cuda.current_stream(out.device))
        kept = []
        for tensor in (out.contiguous(), lse.contiguous()):
            pieces = self._arena.take(tensor.numel() * tensor.element_size())
            with torch.cuda.stream(stream):
                for target, source in zip(pieces, _byte_pieces(tensor, pieces)):
                    target.copy_(source, non_blocking=True)
            # The first pass drops its reference at once: the allocator must not hand the memory out again before
            # the copy has read it.
            tensor.record_stream(stream)
            kept.append((tensor.shape, tensor.dtype, pieces))
        self._kept[(start, layer)] = tuple(kept)

    def prefetch(self, start: int, device: torch.device) -> None:
        """Start copying the chunk at ``start``'s forwards back to ``device`` (a no-op when they are already on the
        way, or were never copied out: off CUDA)."""
        layers = sorted(layer for (chunk, layer) in self._kept if chunk == start)
        if start in self._fetched or not layers or device.type != "cuda":
            return
        stream = self._copy_stream(device)
        # Allocated on the compute stream, written on the copy stream: the copy must wait for the work already
        # queued there, which may still use the memory these tensors are carved from.
        stream.wait_stream(torch.cuda.current_stream(device))
        fetched = {}
        for layer in layers:
            tensors = []
            for shape, dtype, pieces in self._kept.pop((start, layer)):
                tensor = torch.empty(shape, dtype=dtype, device=device)
                with torch.cuda.stream(stream):
                    for target, source in zip(_byte_pieces(tensor, pieces), pieces):
                        target.copy_(source, non_blocking=True)
                # Dropped without take() (a step that failed in between), its memory must wait for the copy too.
                tensor.record_stream(stream)
                tensors.append(tensor)
            fetched[layer] = tuple(tensors)
        event = torch.cuda.Event()
        event.record(stream)
        self._fetched[start] = (event, fetched)

    def take(self, start: int, layer: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer ``layer``'s kept forward of the chunk at ``start``, on ``device`` and ready for the current stream
        (None when none was kept); the store lets go of it."""
        if device.type != "cuda":
            return self._kept.pop((start, layer), None)
        self.prefetch(start, device)
        if start not in self._fetched:
            return None
        event, fetched = self._fetched[start]
        torch.cuda.current_stream(device).wait_event(event)
        value = fetched.pop(layer, None)
        if not fetched:
            del self._fetched[start]
        return value

    def _copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._stream is None or self._stream.device != device:
            self._stream = torch.cuda.Stream(device)
        return self._stream
