"""Dense causal attention, what the DSA layer runs when every query selects all of its causal keys.

That happens for a short sequence (see :func:`genolc.model.ops.indexer.layout.selects_all_causal`); the result
then equals the sparse attention of :mod:`genolc.model.ops.dsa.reference`, computed with
``torch.nn.functional.scaled_dot_product_attention`` in O(T) memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genolc.model.ops.dsa.reference import check_qkv


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """Ordinary causal attention: q ``[B, T, H, Dk]``, k ``[B, S, H, Dk]``, v ``[B, S, H, Dv]`` -> ``[B, T, H, Dv]``.

    The queries are the last ``T`` of the ``S >= T`` key positions (a chunk of a window after its predecessors):
    query ``t`` sees keys ``0 .. S - T + t``. Equals :func:`sparse_attention` whenever every row selects all causal
    keys.

    Memory is O(T): SDPA's fused kernels never build the ``[T, T]`` score matrix, but they need one head size for
    q, k and v (otherwise SDPA falls back to its quadratic math path). When ``Dk != Dv`` the smaller side is
    zero-padded: zero query/key channels add nothing to ``q . k`` and zero value channels are cut off afterwards.
    """
    check_qkv(q, k, v)
    if k.shape[1] < q.shape[1]:
        raise ValueError(f"causal attention needs at least as many keys as queries, got T={q.shape[1]} and "
                         f"S={k.shape[1]}")
    qk_dim, v_dim = q.shape[-1], v.shape[-1]
    if qk_dim < v_dim:
        q, k = F.pad(q, (0, v_dim - qk_dim)), F.pad(k, (0, v_dim - qk_dim))
    elif v_dim < qk_dim:
        v = F.pad(v, (0, qk_dim - v_dim))
    if k.shape[1] == q.shape[1]:
        mask = {"is_causal": True}
    else:
        # Imported here: torch.nn.attention.bias pulls in torch._dynamo, seconds at every genolc start.
        from torch.nn.attention.bias import causal_lower_right

        mask = {"attn_mask": causal_lower_right(q.shape[1], k.shape[1])}
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         scale=softmax_scale, **mask)
    return out.transpose(1, 2)[..., :v_dim]
