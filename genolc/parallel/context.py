"""One rank's share of every window, for a plain model patched by genolc/parallel/apply.py.

The model is not rewritten: the token mixers' and MoE layers' ``forward`` of each instance are replaced (as
genolc/train/apply.py does for recompute; parameter names and checkpoints are unchanged) by versions that take the
rank's concatenated pieces (genolc/parallel/layout.py) and exchange, per layer, only what crosses positions:

    KDA   each piece's last ``kernel - 1`` convolution inputs and its boundary state transition (kda_cp.py), or
          with ``--cp-kda heads`` the convolution inputs and an all-to-all to H / cp heads of the span and back
          (kda_heads.py)
    DSA   the latent rows and per-token indexer keys / gate logits of the whole window (dsa_cp.py)
    MoE   the window's tokens per expert, for the balance loss's expert fractions (moe_cp.py)

``GenomeLM.forward(local_ids)`` then returns the logits of exactly this rank's positions of the window, each
auxiliary loss as this rank's share of the window's (the shares add up over the group), and this rank's
tokens per expert. Norms, mHC, the MoE experts, the LM head and the loss are per token and need nothing.

With a chunk cache (genolc/model/cache.py: ``GenomeLM.forward(local_ids, cache=...)`` under the chunk-recurrent
step) the span is one chunk: what earlier chunks left comes in ``cache.past`` (the same on every rank) and each
mixer writes the whole chunk's entries to ``cache.present`` (the same on every rank too, built from the gathered
rows). Those replicas are what makes the chunked step's backward exact without more communication: each rank
sends into its replica the gradient its own later chunks produced, and the gathers' reduce-scatter adds the
ranks' shares, which by linearity is the gradient of the sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from genolc.parallel.collectives import all_gather, all_reduce_counts, all_to_all
from genolc.parallel.layout import Layout, Piece

CONTEXT_ATTRIBUTE = "_genolc_context_parallel"


class ContextParallel:
    """One rank's view of the split: its group, rank and the span of the window that runs next.

    The span is the whole window (:meth:`set_window`), or one chunk of it under the chunk-recurrent step
    (:meth:`take`, genolc/train/chunked.py): the chunk's positions are then cut into pieces over the ranks, and what
    earlier chunks left comes in the layers' caches, identical on every rank.
    """

    def __init__(self, group, layout_name: str = "zigzag") -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.layout_name = layout_name
        self.layout: Layout | None = None
        self.start = 0                       # absolute position of the span's first token
        self.window_len = 0                  # the whole window's length (the losses' denominators)

    def set_window(self, window_len: int, start: int = 0, stop: int | None = None) -> Layout:
        """Run positions ``start .. stop`` (default: all) of a ``window_len``-token window next."""
        stop = window_len if stop is None else stop
        if self.layout is None or self.layout.window_len != stop - start:
            self.layout = Layout(stop - start, self.size, self.layout_name)
        self.start, self.window_len = start, window_len
        return self.layout

    @property
    def pieces(self) -> list[Piece]:
        """This rank's pieces of the span, in absolute positions."""
        return [Piece(p.index, self.start + p.start, self.start + p.stop)
                for p in self._layout().rank_pieces(self.rank)]

    def _layout(self) -> Layout:
        if self.layout is None:
            raise RuntimeError("context parallel: set_window(window_len) before running the model")
        return self.layout

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's positions of a whole-window tensor ``[B, T, ...]``, pieces concatenated in window order."""
        if tensor.shape[1] != self.window_len:
            raise ValueError(f"expected a window of {self.window_len} positions, got {tuple(tensor.shape)}")
        return torch.cat([tensor[:, p.start:p.stop] for p in self.pieces], dim=1)

    def take(self, tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """This rank's positions of chunk ``start .. stop`` of the whole-window ``tensor [B, T, ...]``; the chunk
        runs next (the chunk-recurrent step's hook, genolc/train/chunked.py)."""
        self.set_window(tensor.shape[1], start, stop)
        return self.local(tensor)

    def window_counts(self, counts: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Tokens per expert of the whole window from this rank's (the chunked step's balance-loss fractions)."""
        return all_reduce_counts(counts, group=self.group)

    def split(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """``[B, local positions, ...]`` -> one tensor per piece of this rank."""
        return list(tensor.split([len(p) for p in self.pieces], dim=1))

    def gather_pieces(self, per_piece: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every piece's rows of the span, in window order, from each rank's ``per_piece [B, len, ...]``.

        Pieces are padded to the longest piece for the collective; returns ``(rows per piece, gathered)`` where
        ``gathered`` is the raw collective output (for :func:`genolc.parallel.collectives.anchor`).
        """
        layout = self._layout()
        longest = layout.longest_piece
        padded = torch.stack([nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, longest - t.shape[1]))
                              for t in per_piece])
        gathered = all_gather(padded, self.group)                  # [cp, slots, B, longest, ...]
        rows = []
        for piece in layout.pieces:
            rank, slot = layout.owner(piece.index)
            rows.append(gathered[rank, slot, :, : len(piece)])
        return rows, gathered

    def gather_fixed(self, per_piece: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Like :meth:`gather_pieces` for tensors of one shape per piece (no padding)."""
        layout = self._layout()
        gathered = all_gather(torch.stack(per_piece), self.group)
        return [gathered[layout.owner(p.index)] for p in layout.pieces], gathered

    def heads_to_span(self, local: torch.Tensor) -> torch.Tensor:
        """This rank's positions of every head ``[B, T_local, H, F]`` -> every position of the span, in window order,
        of this rank's ``H / size`` heads ``[B, T_span, H / size, F]`` (heads ``rank * H / size`` onwards).

        One all-to-all: each rank sends every other rank that rank's heads of its own pieces (padded to the longest
        piece, so every rank sends one shape) and places what it receives by :meth:`Layout.owner`."""
        layout = self._layout()
        longest = layout.longest_piece
        batch, _, heads, features = local.shape
        share = heads // self.size
        slots = torch.stack([nn.functional.pad(t, (0, 0, 0, 0, 0, longest - t.shape[1])) for t in self.split(local)])
        outgoing = slots.view(len(slots), batch, longest, self.size, share, features).permute(3, 0, 1, 2, 4, 5)
        received = all_to_all(outgoing, self.group)                 # [source rank, slot, B, longest, share, F]
        rows = []
        for piece in layout.pieces:
            rank, slot = layout.owner(piece.index)
            rows.append(received[rank, slot, :, : len(piece)])
        return torch.cat(rows, dim=1)

    def span_to_heads(self, span: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`heads_to_span`: ``[B, T_span, H / size, F]`` (this rank's heads, every position)
        -> ``[B, T_local, H, F]`` (every head, this rank's positions, pieces concatenated in window order)."""
        layout = self._layout()
        longest = layout.longest_piece
        batch, _, share, features = span.shape
        rows = span.split(self.span_lengths, dim=1)
        outgoing = torch.stack([
            torch.stack([nn.functional.pad(rows[p.index], (0, 0, 0, 0, 0, longest - len(p)))
                         for p in layout.rank_pieces(rank)])
            for rank in range(self.size)])                          # [destination rank, slot, B, longest, share, F]
        received = all_to_all(outgoing, self.group)                 # [head group, slot, B, longest, share, F]
        slots = received.permute(1, 2, 3, 0, 4, 5).reshape(-1, batch, longest, self.size * share, features)
        return torch.cat([slots[slot, :, : len(p)] for slot, p in enumerate(layout.rank_pieces(self.rank))], dim=1)

    @property
    def span_lengths(self) -> list[int]:
        """The length of every piece of the span, in window order."""
        return [len(p) for p in self._layout().pieces]


def context_of(model: nn.Module) -> ContextParallel | None:
    """The context :func:`genolc.parallel.apply.apply_context_parallel` gave ``model``, or None."""
    return getattr(model, CONTEXT_ATTRIBUTE, None)

