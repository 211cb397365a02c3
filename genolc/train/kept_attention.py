"""The DSA layers' sparse-attention forwards, kept from the chunked step's first pass for its second.

The chunked step (genolc/train/chunked.py) runs every chunk's forward twice: once without grad to fill the window's
caches, once with grad before the chunk's backward. A DSA layer's sparse attention gives the same ``o_lat`` and
log-sum-exp both times: the same queries over the same latent rows and, with the kept selections, the same pools.
Its forward is a gather of ``W`` latent rows per query, bound by memory: 0.82 s of a 16.3 s `base` step at 512k on
the H200, 0.36 s of `small`'s 7.85 s (benchmarks/results/kda_inputs_2026-12-03/), for the second pass alone. Kept,
the second pass runs only its backward (``kept=`` of genolc.model.ops.dispatch.sparse_latent_attention).

What is kept is large: ``o_lat`` is ``H * R`` values a token and layer, 18 GiB for `base`'s four DSA layers at 512k
tokens (bf16), more than the device has left at that length. On CUDA it therefore goes to host memory: each
forward is copied out on a side stream as the first pass makes it, and in the second pass, which runs the chunks
last to first, the chunk before the one computing is copied back while it computes. The device holds at most two
chunks' forwards at once. The host buffers are page-locked once (``cudaHostRegister``, exact sizes; torch's pinned
allocator rounds each block up to a power of two) and reused by every later step. Off CUDA (the CPU tests) the
forwards stay where they are.

If the second pass's queries differ from the first's by rounding (a compiled graph with and without grad may fuse
differently), its backward uses the first pass's probabilities with the second pass's queries: the gradient of the
forward whose outputs the later chunks read, to that rounding.
"""

from __future__ import annotations

import logging

import torch

_logger = logging.getLogger(__name__)

Key = tuple[int, int]          # (chunk start, layer index)


class KeptAttention:
    """The kept forwards of one window (``put`` in the first pass, ``take`` in the second); reused across steps,
    where it keeps its page-locked host buffers. ``offload``: copy them to host memory (CUDA only; else they stay
    on their device)."""

    def __init__(self, offload: bool = True) -> None:
        self.offload = offload
        self._stream: torch.cuda.Stream | None = None
        self._host: dict[Key, tuple[torch.Tensor, torch.Tensor]] = {}       # registered buffers, kept across steps
        self._kept: dict[Key, tuple[torch.Tensor, torch.Tensor]] = {}       # this window's forwards
        self._fetched: dict[int, tuple[torch.cuda.Event, dict[int, tuple[torch.Tensor, torch.Tensor]]]] = {}
        self._unpinned_said = False

    def clear(self) -> None:
        """Forget this window's forwards (the host buffers stay for the next window)."""
        self._kept.clear()
        self._fetched.clear()

    def put(self, start: int, layer: int, out: torch.Tensor, lse: torch.Tensor) -> None:
        """Keep layer ``layer``'s forward ``(o_lat, lse)`` of the chunk starting at ``start``."""
        if not (self.offload and out.is_cuda):
            self._kept[(start, layer)] = (out, lse)
            return
        stream = self._copy_stream(out.device)
        stream.wait_stream(torch.cuda.current_stream(out.device))
        host = self._host_buffers((start, layer), out, lse)
        with torch.cuda.stream(stream):
            for target, source in zip(host, (out, lse)):
                target.copy_(source, non_blocking=True)
                # The first pass drops its reference at once: the allocator must not hand the memory out again
                # before the copy has read it.
                source.record_stream(stream)
        self._kept[(start, layer)] = host

    def prefetch(self, start: int, device: torch.device) -> None:
        """Start copying the chunk at ``start``'s forwards back to ``device`` (a no-op when they are already on the
        way, or not offloaded)."""
        if start in self._fetched or not any(key[0] == start for key in self._kept):
            return
        layers = sorted(layer for (chunk, layer) in self._kept if chunk == start)
        if not self.offload or device.type != "cuda":
            return
        stream = self._copy_stream(device)
        # Allocated on the compute stream, written on the copy stream: the copy must wait for the work already
        # queued there, which may still use the memory these buffers are carved from.
        stream.wait_stream(torch.cuda.current_stream(device))
        fetched = {}
        for layer in layers:
            host = self._kept.pop((start, layer))
            on_device = tuple(torch.empty(t.shape, dtype=t.dtype, device=device) for t in host)
            with torch.cuda.stream(stream):
                for target, source in zip(on_device, host):
                    target.copy_(source, non_blocking=True)
            fetched[layer] = on_device
        event = torch.cuda.Event()
        event.record(stream)
        self._fetched[start] = (event, fetched)

    def take(self, start: int, layer: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer ``layer``'s kept forward of the chunk at ``start``, on ``device`` and ready for the current stream
        (None when none was kept); the store lets go of it."""
        if (start, layer) in self._kept and not (self.offload and device.type == "cuda"):
            return self._kept.pop((start, layer))
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

    def _host_buffers(self, key: Key, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buffers = self._host.get(key)
        if buffers is not None and all(b.shape == t.shape and b.dtype == t.dtype for b, t in zip(buffers, (out, lse))):
            return buffers
        if buffers is not None:
            # A window of another shape: the old buffers' last copies must be done before they are let go.
            self._copy_stream(out.device).synchronize()
            for buffer in buffers:
                _unregister(buffer)
        buffers = tuple(self._pinned_like(t) for t in (out, lse))
        self._host[key] = buffers
        return buffers

    def _pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        host = torch.empty(tensor.shape, dtype=tensor.dtype)
        cudart = torch.cuda.cudart()
        nbytes = host.numel() * host.element_size()
        if nbytes and cudart.cudaHostRegister(host.data_ptr(), nbytes, 0) != cudart.cudaError.success:
            if not self._unpinned_said:
                self._unpinned_said = True
                _logger.warning("could not page-lock %.0f MB of host memory for the kept DSA forwards: their copies "
                                "run synchronously", host.numel() * host.element_size() / 1e6)
        return host

    def __del__(self) -> None:
        for buffers in self._host.values():
            for buffer in buffers:
                _unregister(buffer)


def _unregister(buffer: torch.Tensor) -> None:
    # A buffer that never got registered (the warning above) answers with an error, which changes nothing.
    if buffer.numel() and torch.cuda.is_available():
        torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
