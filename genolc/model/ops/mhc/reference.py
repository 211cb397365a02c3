"""mHC in pure torch, as transformers' ``glm5_next`` computes it: the mixing logits (the unweighted RMS norm of the
streams in fp32, then a Linear onto the logits; under autocast the product runs in the autocast dtype, as a
Linear's does) and the stream-mixing matrix made from its logits (softmax, then Sinkhorn iterations)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mixing_logits_and_rstd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (each token's N streams side by side), ``weight [W, K]`` -> (``[M, W]`` logits, ``[M]`` fp32
    ``rsqrt(mean(x^2) + eps)``, which the custom op's backward reuses)."""
    x32 = x.float()
    rstd = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    return F.linear(x32 * rstd, weight.float()), rstd.squeeze(-1)


def mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [M, K]``, ``weight [W, K]`` -> ``[M, W]`` logits."""
    return mixing_logits_and_rstd(x, weight, eps)[0]


def pre_weights(logits: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, n_streams: int,
                eps: float) -> torch.Tensor:
    """``pre [M, N] = sigmoid(logits[:, :N] * scale[0] + base[:N]) + eps``: how much of each stream goes into the
    block's input, from the mixing logits ``[M, W]`` and the hyper-connection's ``scale [3]`` and ``base [W]``."""
    return torch.sigmoid(logits[:, :n_streams] * scale[0] + base[:n_streams]) + eps


def weighted_streams(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """The block's input ``sum_n pre[:, n] * stream_n`` ``[M, D]`` in x's dtype, from ``x [M, N * D]`` (the streams side
    by side) and ``pre [M, N]``; the products and their sum in pre's dtype (fp32)."""
    rows, n_streams = pre.shape
    return (pre.unsqueeze(-1) * x.view(rows, n_streams, -1)).sum(dim=1).to(x.dtype)


def block_input(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, norm_eps: float,
                hc_eps: float, n_streams: int, *, mixing=mixing_logits
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A hyper-connection's reading of its streams ``x [M, N * D]``: (the mixing logits ``[M, W]``, the block's input
    ``[M, D]`` in x's dtype, x for the merge) with the ``pre`` weights of :func:`pre_weights`; ``mixing`` makes the
    logits. The third is x itself here; the fused op (op.BlockInputPassingStreams) returns an alias of x through
    which the merge's share of x's gradient reaches its backward."""
    logits = mixing(x, weight, norm_eps)
    return logits, weighted_streams(x, pre_weights(logits, scale, base, n_streams, hc_eps)), x


def sinkhorn(matrix: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """Normalise the positive ``[..., N, N]`` matrix's columns, then ``iterations - 1`` times rows and columns."""
    matrix = matrix / (matrix.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        matrix = matrix / (matrix.sum(dim=-1, keepdim=True) + eps)
        matrix = matrix / (matrix.sum(dim=-2, keepdim=True) + eps)
    return matrix


def comb_weights(logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """The mixing matrix ``[..., N, N]`` from its logits: a softmax over each row, ``eps`` added, then
    :func:`sinkhorn` (pushed towards doubly stochastic)."""
    return sinkhorn(torch.softmax(logits, dim=-1) + eps, iterations, eps)


def comb_weights_backward(grad: torch.Tensor, logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """The gradient of :func:`comb_weights` with respect to ``logits``, written out as the CUDA kernel runs it
    (genolc/model/ops/mhc/comb_triton.py): the forward again, keeping each normalisation's input, then back through
    them (``y = x / (s + eps)`` with ``s`` the sum along the axis gives ``dx = (dy - sum(dy * y)) / (s + eps)``)
    and the softmax (``dz = p * (dp - sum(dp * p))``). For custom ops, whose bodies run without autograd."""
    p = torch.softmax(logits, dim=-1)
    inputs = []
    matrix = p + eps
    for step in range(2 * iterations - 1):
        inputs.append(matrix)
        matrix = matrix / (matrix.sum(dim=-2 if step % 2 == 0 else -1, keepdim=True) + eps)
    for step in range(2 * iterations - 2, -1, -1):
        x = inputs[step]
        dim = -2 if step % 2 == 0 else -1
        total = x.sum(dim=dim, keepdim=True) + eps
        grad = (grad - (grad * (x / total)).sum(dim=dim, keepdim=True)) / total
    return p * (grad - (grad * p).sum(dim=-1, keepdim=True))


def merge(block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, streams: torch.Tensor, *,
          compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The block's output back into the streams: ``post ⊗ block_out + comb^T @ streams``, from ``[..., D]``,
    ``[..., N]``, ``[..., N, N]``, ``[..., N, D]``: ``new[m] = post[m] * block_out + sum_n comb[n, m] * streams[n]``.

    The ``N x N`` product is written out as N element-wise terms, added in order after the block's term, in
    ``compute_dtype`` (default: the streams'; a lower dtype operand is promoted by each product, so autograd keeps
    the operands themselves, not copies); the result is rounded to the streams' dtype once."""
    dtype = streams.dtype if compute_dtype is None else compute_dtype
    merged = post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2)
    for n in range(streams.shape[-2]):
        merged = merged + comb[..., n, :, None].to(dtype) * streams[..., n, None, :]
    return merged.to(streams.dtype)


def merge_backward(grad: torch.Tensor, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                   streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`merge` computed in fp32 (``d block_out, d post, d comb, d streams``, each in its
    input's dtype), written out for custom ops, whose bodies run without autograd:
    ``d block_out = sum_m post[m] g[m]``, ``d post[m] = <g[m], block_out>``, ``d comb[n, m] = <g[m], streams[n]>``,
    ``d streams[n] = sum_m comb[n, m] g[m]`` (sums over D for the inner products)."""
    g = grad.float()
    d_block = (post.float().unsqueeze(-1) * g).sum(-2)
    d_post = (g * block_out.float().unsqueeze(-2)).sum(-1)
    d_comb = torch.einsum("...nd,...md->...nm", streams.float(), g)
    d_streams = torch.einsum("...nm,...md->...nd", comb.float(), g)
    return (d_block.to(block_out.dtype), d_post.to(post.dtype), d_comb.to(comb.dtype), d_streams.to(streams.dtype))
