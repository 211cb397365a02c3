"""KDA across context-parallel ranks by heads: an all-to-all to the whole span for ``H / cp`` heads and back.

The alternative to genolc/parallel/kda_cp.py's boundary-state passing (``--cp-kda heads``; kda_cp.py is
``state``). KDA heads are independent, so each rank can run the plain recurrence over every position of the span
for its share of the heads:

1. the per-token projections and the short convolution run on the rank's own pieces, the convolution's first
   ``kernel - 1`` outputs of a piece from the previous piece's last inputs (all-gathered, as kda_cp.py does);
2. one all-to-all turns q, k, v, the gate's pre-activation and beta from ``[local positions, all heads]`` into
   ``[every position of the span in window order, H / cp heads]`` (genolc/parallel/context.py's
   :meth:`heads_to_span`, which places zigzag and contiguous pieces by the layout);
3. the layer's op runs once over the span for those heads, from the cached state's rows of those heads under the
   chunk-recurrent step;
4. one all-to-all back to ``[local positions, all heads]``, then the layer's gated norm and output projection.

The convolution runs before the exchange because it mixes the q, k, v channels of every head at a position's
neighbours only: on local pieces it needs ``kernel - 1`` rows per piece from other ranks, the layer's own
``short_conv`` serves unchanged, and the chunk cache's convolution tail stays the full-width rows every rank holds
alike. After the exchange it would need the convolution's weights cut by head and a per-head tail in the cache.

Per layer each rank sends and receives ``(cp - 1) / cp`` of its ``[T_local, H, 4 Dk + 1]`` inputs and of its
``[T_local, H, Dv]`` outputs: communication grows with the window, where kda_cp.py's does not, but no piece runs
the op with ``Dk`` extra value columns and no prefix is composed. Gradients are exact: the all-to-all's backward is
the reverse exchange (genolc/parallel/collectives.py).
"""

from __future__ import annotations

import functools

import torch

from genolc.errors import ConfigError
from genolc.model.cache import LayerCache
from genolc.parallel.collectives import all_gather, anchor
from genolc.parallel.context import ContextParallel
from genolc.parallel.kda_cp import PieceInputs


def check_heads(num_heads: int, cp: int) -> None:
    """ConfigError unless ``num_heads`` KDA heads split evenly over ``cp`` ranks."""
    if num_heads % cp:
        divisors = [n for n in range(2, num_heads + 1) if num_heads % n == 0]
        raise ConfigError(f"--cp-kda heads splits each KDA layer's {num_heads} heads over the --cp {cp} ranks, and "
                          f"{num_heads} heads do not divide evenly by {cp}", where="--cp / --cp-kda",
                          fix=f"use --cp {' or '.join(map(str, divisors))}, or --cp-kda state (any --cp)"
                          if divisors else "use --cp-kda state")


def kda_forward_heads(layer, context: ContextParallel, x: torch.Tensor, cache: LayerCache | None = None
                      ) -> torch.Tensor:
    """``KimiDeltaAttention.forward`` for this rank's concatenated pieces ``x [B, T_local, D]`` with the recurrence
    run by head (module docstring), from the layer's own steps; with ``cache`` the span is one chunk of the window
    (the state and convolution inputs before it in ``cache.past``, the chunk's in ``cache.present``)."""
    heads, dim = layer.num_heads, layer.head_dim
    share = heads // context.size
    own_heads = slice(context.rank * share, (context.rank + 1) * share)
    given = PieceInputs.of(layer, context, x, cache)
    past = given.past
    mixed = torch.cat([given.convolved(piece.index, piece_input)
                       for piece, piece_input in zip(context.layout.rank_pieces(context.rank), given.inputs)], dim=1)
    per_head = (*layer.split_heads(mixed), given.gate_input, given.beta.unsqueeze(-1))
    dtypes = [t.dtype for t in per_head]
    common = functools.reduce(torch.promote_types, dtypes)     # one exchange; each input gets its dtype back
    span = context.heads_to_span(torch.cat([t.to(common) for t in per_head], dim=-1))
    q, k, v, span_gate, span_beta = (t.to(dtype) for t, dtype in zip(span.split([dim, dim, dim, dim, 1], dim=-1),
                                                                        dtypes))
    state = past.get("state")
    initial = None if state is None else state[:, own_heads]
    core, final = layer.recurrence(q, k, v, span_gate, span_beta.squeeze(-1), initial, cache is not None,
                                   heads=own_heads)
    gathered_state = None
    if cache is not None:
        # Every rank's cache holds the whole state, as in kda_cp.py: the next chunk's ranks each read their heads.
        gathered_state = all_gather(final, context.group)                  # [cp, B, H / cp, Dk, Dv]
        cache.present["state"] = gathered_state.transpose(0, 1).flatten(1, 2)
        cache.present["conv_tail"] = given.tail_before(len(given.lengths))
    return anchor(layer.output(context.span_to_heads(core), given.gate_low), given.gathered_tails, gathered_state)
