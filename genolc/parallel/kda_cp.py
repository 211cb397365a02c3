"""KDA across context-parallel ranks by boundary-state passing; communication independent of the window length.

The KDA recurrence is affine in the state: ``S_t = M_t S_{t-1} + beta_t k_t v_t^T`` with ``M_t = (I - beta_t k_t
k_t^T) diag(exp g_t)`` a per-head ``[Dk, Dk]`` matrix. So a piece run from the zero state gives its outputs
``o_t`` and end state ``B``, and the true ones, from the state ``S_in`` the earlier pieces leave, are

    S_end = A S_in + B,  o_t + (q_t^T P_t) S_in,   P_t = M_t ... M_1 (the piece's first t steps),  A = P_last.

``q_t^T P_t`` and ``A`` come from the same op call: the values get ``Dk`` extra zero columns and the initial state
is ``[0 | I]``, so the extra output columns are ``q_t^T P_t I`` and the extra state columns ``P_last I = A``. That
is one KDA call with ``Dv + Dk`` value columns (fla's ``chunk_kda`` takes the initial state and returns the final
one, so the fast kernel serves unchanged). The ranks all-gather each piece's ``[B | A]`` (``H x Dk x (Dv + Dk)``
per piece) and every rank composes the prefix ``S_in`` of its own pieces; the correction is a small einsum.
The short convolution's first ``kernel - 1`` outputs of a piece need the previous piece's last inputs: those are
all-gathered too. Gradients flow through both gathers exactly (genolc/parallel/collectives.py). Under the
chunk-recurrent step the prefix starts from the cached state of the chunks before, and every rank writes the chunk's
end state and last convolution inputs to the cache (genolc/parallel/context.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from genolc.parallel.collectives import anchor
from genolc.model.cache import LayerCache
from genolc.parallel.context import ContextParallel


def tail_before(piece_index: int, tails: list[torch.Tensor], lengths: list[int], keep: int,
                 before: torch.Tensor | None) -> torch.Tensor | None:
    """The last ``keep`` convolution inputs before piece ``piece_index`` of the span (``before``: those before the
    span, from the chunk cache; fewer at the window's start)."""
    parts, have = [], 0
    for j in range(piece_index - 1, -1, -1):
        real = min(keep, lengths[j])
        parts.insert(0, tails[j][:, keep - real:])
        have += real
        if have >= keep:
            break
    if have < keep and before is not None and before.shape[1]:
        parts.insert(0, before.to(tails[0].dtype))
    if not parts:
        return None
    return torch.cat(parts, dim=1)[:, -keep:]


def gather_conv_tails(context: ContextParallel, inputs: list[torch.Tensor],
                      keep: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every piece's last ``keep`` convolution inputs (zero-padded in front when shorter), in window order, from this
    rank's ``inputs`` (one ``[B, len, C]`` per piece); and the raw collective output for ``anchor``."""
    own_tails = [torch.nn.functional.pad(t[:, max(0, t.shape[1] - keep):], (0, 0, keep - min(keep, t.shape[1]), 0))
                 for t in inputs]
    return context.gather_fixed(own_tails)


@dataclass
class PieceInputs:
    """A KDA layer's inputs for this rank's pieces (both context-parallel forms): the convolution inputs split by
    piece, the gate input, beta and the output gate's low-rank projection of all of them, and every piece's
    convolution tail from the other ranks."""

    layer: nn.Module
    past: dict[str, torch.Tensor]
    inputs: list[torch.Tensor]
    gate_input: torch.Tensor
    beta: torch.Tensor
    gate_low: torch.Tensor
    tails: list[torch.Tensor]
    gathered_tails: torch.Tensor
    lengths: list[int]
    keep: int

    @classmethod
    def of(cls, layer, context: ContextParallel, x: torch.Tensor, cache: LayerCache | None) -> "PieceInputs":
        keep = layer.conv1d.weight.shape[-1] - 1
        conv_input, gate_input, beta, gate_low = layer.mixer_inputs(x)
        inputs = context.split(conv_input)
        tails, gathered_tails = gather_conv_tails(context, inputs, keep)
        return cls(layer, {} if cache is None else cache.past, inputs, gate_input, beta, gate_low, tails,
                   gathered_tails, context.span_lengths, keep)

    def convolved(self, piece_index: int, piece_input: torch.Tensor) -> torch.Tensor:
        """Piece ``piece_index`` (of the span) through the layer's short convolution, after the inputs before it."""
        return self.layer.short_conv(piece_input, self.tail_before(piece_index))

    def tail_before(self, piece_index: int) -> torch.Tensor | None:
        return tail_before(piece_index, self.tails, self.lengths, self.keep, self.past.get("conv_tail"))


def kda_forward(layer, context: ContextParallel, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
    """``KimiDeltaAttention.forward`` for this rank's concatenated pieces ``x [B, T_local, D]``, from the layer's own
    steps (``mixer_inputs``, ``convolved_heads``, ``recurrence``, ``output``); with ``cache`` the span
    is one chunk of the window (the state and convolution inputs before it in ``cache.past``, the chunk's in
    ``cache.present``)."""
    batch = x.shape[0]
    heads, dim = layer.num_heads, layer.head_dim
    pieces = context.pieces
    given = PieceInputs.of(layer, context, x, cache)
    past, inputs, lengths = given.past, given.inputs, given.lengths
    first = context.layout.rank_pieces(context.rank)

    gate_inputs = context.split(given.gate_input)
    betas = context.split(given.beta)
    locals_, throughs, finals = [], [], []
    for piece, relative, conv_in, piece_gate, piece_beta in zip(pieces, first, inputs, gate_inputs, betas):
        q, k, v = layer.convolved_heads(conv_in, given.tail_before(relative.index))
        value_dim = v.shape[-1]
        values = torch.cat([v, v.new_zeros(batch, len(piece), heads, dim)], dim=-1)
        start_state = torch.cat([torch.zeros(batch, heads, dim, value_dim, device=x.device),
                                 torch.eye(dim, device=x.device).expand(batch, heads, dim, dim)], dim=-1)
        core, final = layer.recurrence(q, k, values, piece_gate, piece_beta, start_state, True)
        locals_.append(core[..., :value_dim])
        throughs.append(core[..., value_dim:])
        finals.append(final)                                   # [B, H, Dk, Dv + Dk] = [offset B | transition A]
    all_finals, gathered_finals = context.gather_fixed(finals)

    cores = []
    state = past.get("state")
    state = None if state is None else state.float()
    wanted = {p.index: slot for slot, p in enumerate(first)}
    last = len(lengths) if cache is not None else max(wanted) + 1
    # In fp32 like the op's own state (autocast would run these products in bf16).
    with torch.autocast(x.device.type, enabled=False):
        for index in range(last):
            if index in wanted:
                slot = wanted[index]
                core = locals_[slot]
                if state is not None:
                    correction = torch.einsum("bthk,bhkv->bthv", throughs[slot].float(), state)
                    core = (core.float() + correction).to(core.dtype)
                cores.append(core)
            offset, transition = all_finals[index].float().split([all_finals[index].shape[-1] - dim, dim], dim=-1)
            state = offset if state is None else transition @ state + offset
    if cache is not None:
        cache.present["state"] = state
        cache.present["conv_tail"] = given.tail_before(len(lengths))
    return anchor(layer.output(torch.cat(cores, dim=1), given.gate_low), given.gathered_tails, gathered_finals)
