"""The indexer's key pooling: one key per complete pool of ``kpool`` tokens, as the DSA layer computes it."""

from __future__ import annotations

import torch


def pool_keys(keys: torch.Tensor, gate_logits: torch.Tensor, position_bias: torch.Tensor, kpool: int) -> torch.Tensor:
    """Compress indexer keys into one key per complete pool.

    Args:
        keys: ``[B, T, D]`` indexer keys (after the key LayerNorm).
        gate_logits: ``[B, T, D]`` per-channel gate logits (``hidden @ compress_gate.T``).
        position_bias: ``[kpool, D]`` learned logit bias per position inside a pool.
        kpool: pool size.

    Returns:
        ``[B, T // kpool, D]``: ``sum_j softmax_j(gate[j] + bias[j]) * keys[j]`` over each pool's tokens ``j``, the
        softmax taken per channel over the pool. The trailing incomplete pool is left out (it is never a candidate).
    """
    if keys.dim() != 3 or gate_logits.shape != keys.shape:
        raise ValueError(f"keys and gate_logits must both be [B, T, D], got {tuple(keys.shape)} and "
                         f"{tuple(gate_logits.shape)}")
    if kpool < 1 or position_bias.shape != (kpool, keys.shape[-1]):
        raise ValueError(f"position_bias must be [kpool={kpool}, D={keys.shape[-1]}], got {tuple(position_bias.shape)}")
    batch, seq_len, dim = keys.shape
    n_pools = seq_len // kpool
    usable = n_pools * kpool
    grouped_keys = keys[:, :usable].reshape(batch, n_pools, kpool, dim)
    logits = gate_logits[:, :usable].reshape(batch, n_pools, kpool, dim).float() + position_bias.float()
    # Softmax in fp32 as transformers does, then back to the keys' dtype before the weighted sum.
    weights = logits.softmax(dim=2).to(keys.dtype)
    return (weights * grouped_keys).sum(dim=2)
