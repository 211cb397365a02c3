"""Manifold-constrained hyper-connections (mHC): ``hc_mult`` residual streams instead of one.

The decoder carries ``streams [B, T, N, D]``. Around each block (attention or MLP) a :class:`HyperConnection`
computes, per token and from all N streams, three sets of weights with a one-layer perceptron:

- ``pre [B, T, N]`` (sigmoid + eps): collapses the streams into the block's input ``sum_n pre_n * stream_n``;
- ``post [B, T, N]`` (2 * sigmoid): spreads the block's output back over the streams;
- ``comb [B, T, N, N]``: mixes the incoming streams into the outgoing ones. It is pushed towards a doubly
  stochastic matrix with Sinkhorn iterations (alternately normalising columns and rows), so mixing neither grows
  nor shrinks the residual.

Then ``new_streams = post ⊗ block_out + comb^T @ streams`` (:func:`merge_streams`). After the last layer the
streams are averaged (:func:`collapse_streams`). Parameter names (``fn``, ``base``, ``scale``) match transformers.

The perceptron's logits, the RMS-normed streams projected by ``fn``, and the block's input come from the module
attribute ``input_op`` (``genolc.model.ops.dispatch.mhc_block_input``: the pure-torch reference on CPU, fused kernels
on CUDA whose backward writes the streams' gradient once, the merge's share included), and ``comb`` from ``comb_op``
(``mhc_comb_weights``: softmax and Sinkhorn, one kernel each way on CUDA).
"""

from __future__ import annotations

import torch
from torch import nn

from genolc.model.config import ModelConfig
from genolc.model.ops.dispatch import mhc_block_input, mhc_comb_weights, mhc_merge


class HyperConnection(nn.Module):
    """``forward(streams [B, T, N, D]) -> (post [B, T, N], comb [B, T, N, N], block_input [B, T, D], streams)``.

    The streams it returns hold the same values and are what :meth:`merge` must read: on CUDA they carry the merge's
    share of the streams' gradient into the block-input op's backward kernel, which adds it where it writes the
    streams' gradient (ops.mhc.op.BlockInputPassingStreams); elsewhere they are the input itself."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_streams = config.hc_mult
        self.sinkhorn_iters = config.hc_sinkhorn_iters
        self.eps = config.hc_eps
        self.norm_eps = config.rms_norm_eps
        n = self.n_streams
        width = (2 + n) * n
        self.fn = nn.Parameter(torch.empty(width, n * config.hidden_size))
        self.base = nn.Parameter(torch.zeros(width, dtype=torch.float32))
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float32))
        nn.init.normal_(self.fn, std=0.02)
        self.input_op = mhc_block_input
        self.comb_op = mhc_comb_weights

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if streams.dim() != 4 or streams.shape[2] != self.n_streams:
            raise ValueError(f"streams must be [B, T, {self.n_streams}, D]; got {tuple(streams.shape)}")
        n = self.n_streams
        batch, length = streams.shape[:2]
        # The pre weights (sigmoid(pre logits * scale[0] + base[:N]) + eps) are the op's: reference.block_input.
        mixed, block_input, for_merge = self.input_op(streams.reshape(batch * length, -1), self.fn, self.scale,
                                                      self.base, self.norm_eps, self.eps, n)
        _, post_logit, comb_logit = mixed.view(batch, length, -1).split([n, n, n * n], dim=-1)
        _, post_bias, comb_bias = self.base.split([n, n, n * n])
        _, post_scale, comb_scale = self.scale.unbind(0)

        post = 2 * torch.sigmoid(post_logit * post_scale + post_bias)
        comb_logit = comb_logit.view(batch, length, n, n) * comb_scale + comb_bias.view(n, n)
        comb = self.comb_op(comb_logit, self.sinkhorn_iters, self.eps)
        return post, comb, block_input.view(batch, length, -1), for_merge.view(streams.shape)

    def merge(self, block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
              streams: torch.Tensor) -> torch.Tensor:
        """The block's output back into the streams (:func:`merge_streams`); a method so that transforms
        (genolc/train/apply.py) can replace it on an instance, as they do ``forward``."""
        return merge_streams(block_out, post, comb, streams)


def merge_streams(block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                  streams: torch.Tensor, *, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``post ⊗ block_out + comb^T @ streams``: ``[B, T, D]``, ``[B, T, N]``, ``[B, T, N, N]``, ``[B, T, N, D]``
    (``genolc.model.ops.mhc.reference.merge``).

    The ``N x N`` product is written out as N element-wise terms, which inductor fuses into one fp32 pass. As a
    matmul, autocast ran it in bf16 (rounding the fp32 streams every layer) as a cuBLAS batch of one tiny problem
    per token. On the H200, one 32k chunk of `base` compiled under autocast (benchmarks/results/
    mhc_merge_2026-12-02.json): forward 2.31 -> 0.74 ms, forward + backward 5.21 -> 2.26 ms; error against fp64
    1.4e-3 -> 4.9e-8 on the output, 2.9e-3 -> 4.0e-8 on the streams' gradient. ``compute_dtype`` (default: the
    streams') is the dtype the terms are added in; the result is rounded to the streams' dtype once. A sum in fp32
    runs on CUDA as two fused kernels (``genolc.model.ops.dispatch.mhc_merge``): inductor compiled its backward
    into three passes over the streams."""
    return mhc_merge(block_out, post, comb, streams, compute_dtype=compute_dtype)


def expand_streams(hidden: torch.Tensor, n_streams: int) -> torch.Tensor:
    """``[B, T, D] -> [B, T, N, D]``: every stream starts as the embedding."""
    return hidden.unsqueeze(2).expand(-1, -1, n_streams, -1).contiguous()


def collapse_streams(streams: torch.Tensor) -> torch.Tensor:
    """``[B, T, N, D] -> [B, T, D]``: GLM-5.3-Flash ends with an unweighted mean over streams."""
    return streams.mean(dim=2)
