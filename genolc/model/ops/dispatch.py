"""Pick each op's implementation by device: fast kernels for CUDA tensors, the pure-torch reference otherwise.

Every function here has its reference's signature. The fast modules (fla, Triton) are imported inside the CUDA
branch only, so importing this module (or calling it on CPU) never imports triton, tilelang or fla.

    chunk_kda                genolc.model.ops.kda.fla (fla chunk_kda, segment-wise)         | ops.kda.reference
    select_indices           genolc.model.ops.indexer.triton (Triton scores + top-k)        | ops.indexer.reference
    sparse_latent_attention  genolc.model.ops.dsa.tilelang pair, else dsa.triton (fused)    | ops.dsa.reference
    sparse_latent_attention_forward   the same pair's forward kernel (o_lat and lse)          | ops.dsa.reference
    sparse_pool_mass         genolc.model.ops.dsa.triton (no gather; one pass a query given   | ops.dsa.reference
                             the forward's lse, else two)
    sparse_indexer_kl        genolc.model.ops.indexer_kl.triton (a program a query each way) | ops.indexer_kl.reference
    routed_experts           genolc.model.ops.moe.grouped_mm (torch._grouped_mm)            | ops.moe.reference
    mhc_mixing_logits        genolc.model.ops.mhc.op (custom ops, Triton fwd and bwd)        | ops.mhc.reference
    mhc_block_input          genolc.model.ops.mhc.op (autograd function: the mixing logits,  | ops.mhc.reference
                             block's input; x's gradient, the merge's share too, in one kernel)
    mhc_comb_weights         genolc.model.ops.mhc.op (custom ops, comb_triton fwd and bwd)   | ops.mhc.reference
    mhc_merge                genolc.model.ops.mhc.op (custom ops, merge_triton fwd and bwd)  | ops.mhc.reference

DSA sparse attention on CUDA runs the TileLang kernels (tilelang/forward.py, tilelang/backward.py, which hands windows
from 128k keys on to tilelang/backward_slabs.py) when TileLang is installed and takes the operands (bf16/fp16,
H <= 32, R a multiple of 16 up to 512), else the Triton pair; both are fused sparse kernels of one contract, tested
against the reference, and the choice is logged once with its reason. TileLang measured 1.7x faster fwd+bwd for the
base shape at 1M tokens on the H200 (2.88 vs 4.92 s, benchmarks/results/dsa_tilelang_2026-11-29_fwd_bwd.json).
``GENOLC_DSA_KERNELS=triton`` (or ``tilelang``) forces one.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import torch

from genolc.model.ops.dsa import reference as dsa_reference
from genolc.model.ops.indexer import reference as indexer_reference
from genolc.model.ops.indexer_kl import reference as indexer_kl_reference
from genolc.model.ops.kda import reference as kda_reference
from genolc.model.ops.mhc import reference as mhc_reference
from genolc.model.ops.moe import reference as moe_reference


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              scale: float | None = None, initial_state: torch.Tensor | None = None,
              output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, chunk_size: int = 64,
              use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
              dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
              keep_intermediates: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA, ``[B, T, H, D]`` layout; see ``genolc.model.ops.kda.reference.chunk_kda``. ``keep_intermediates``: fla
    keeps what its backward would compute again (``genolc.model.ops.kda.fla``); the reference keeps what autograd
    needs either way."""
    kwargs = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, chunk_size=chunk_size,
                  use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
    if q.is_cuda:
        from genolc.model.ops.kda import fla

        return fla.chunk_kda(q, k, v, g, beta, keep_intermediates=keep_intermediates, **kwargs)
    return kda_reference.chunk_kda(q, k, v, g, beta, **kwargs)


def select_indices(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor, *, kpool: int,
                   topk: int, select_tail: bool, softmax_scale: float, **chunking) -> torch.Tensor:
    """Indexer top-k; see ``genolc.model.ops.indexer.reference.select_indices``."""
    if index_q.is_cuda:
        from genolc.model.ops.indexer import triton as indexer_triton

        return indexer_triton.select_indices(index_q, head_weights, pooled, kpool=kpool, topk=topk,
                                             select_tail=select_tail, softmax_scale=softmax_scale, **chunking)
    return indexer_reference.select_indices(index_q, head_weights, pooled, kpool=kpool, topk=topk,
                                            select_tail=select_tail, softmax_scale=softmax_scale, **chunking)


DSA_KERNELS_ENV = "GENOLC_DSA_KERNELS"
DSA_KERNEL_FAMILIES = ("tilelang", "triton")
_logger = logging.getLogger(__name__)
_logged_choices: set[str] = set()


def dsa_kernel_family(q_lat: torch.Tensor, latent: torch.Tensor) -> str:
    """"tilelang" or "triton" for these CUDA operands as ``ops.dsa.triton.prepare_inputs`` leaves them (see the
    module notes); logs the choice once per reason."""
    from genolc.model.ops.dsa.tilelang import forward as tilelang_forward

    forced = os.environ.get(DSA_KERNELS_ENV, "")
    if forced:
        if forced not in DSA_KERNEL_FAMILIES:
            raise ValueError(f"{DSA_KERNELS_ENV}={forced!r} is not a DSA kernel family; use one of "
                             f"{', '.join(DSA_KERNEL_FAMILIES)} or unset it")
        family, reason = forced, f"{DSA_KERNELS_ENV}={forced}"
    elif importlib.util.find_spec("tilelang") is None:
        family, reason = "triton", "TileLang is not installed"
    else:
        unsupported = tilelang_forward.unsupported_reason(q_lat, latent)
        family, reason = ("triton", f"TileLang kernels do not take {unsupported}") if unsupported else \
            ("tilelang", "TileLang is installed and takes the operands")
    if reason not in _logged_choices:
        _logged_choices.add(reason)
        _logger.info("DSA sparse attention runs the %s kernels: %s", family, reason)
    return family


def sparse_latent_attention(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                            softmax_scale: float, *, query_chunk: int | None = None,
                            recompute: bool | None = None,
                            kept: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """DSA sparse attention in MLA's absorbed form; see ``genolc.model.ops.dsa.reference.sparse_latent_attention``.
    ``kept``: :func:`sparse_latent_attention_forward`'s outputs for these inputs from an earlier pass."""
    if q_lat.is_cuda:
        from genolc.model.ops.dsa import triton as dsa_triton

        q_lat, latent, indices = dsa_triton.prepare_inputs(q_lat, latent, indices)
        if dsa_kernel_family(q_lat, latent) == "tilelang":
            from genolc.model.ops.dsa.tilelang import backward as tilelang_backward

            return tilelang_backward.sparse_latent_attention(q_lat, latent, indices, softmax_scale, kept=kept)
        return dsa_triton.sparse_latent_attention(q_lat, latent, indices, softmax_scale, query_chunk=query_chunk,
                                                  recompute=recompute, kept=kept)
    return dsa_reference.sparse_latent_attention(q_lat, latent, indices, softmax_scale, query_chunk=query_chunk,
                                                 recompute=recompute, kept=kept)


def sparse_latent_attention_forward(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor,
                                    softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o_lat, lse)`` of the forward :func:`sparse_latent_attention` would run, without autograd: what a later
    pass over the same inputs hands back as ``kept``. See ``reference.sparse_latent_attention_forward``."""
    if q_lat.is_cuda:
        from genolc.model.ops.dsa import triton as dsa_triton

        q_lat, latent, indices = dsa_triton.prepare_inputs(q_lat, latent, indices)
        if dsa_kernel_family(q_lat, latent) == "tilelang":
            from genolc.model.ops.dsa.tilelang import backward as tilelang_backward

            return tilelang_backward.sparse_latent_attention_forward(q_lat, latent, indices, softmax_scale)
        dsa_triton.check_kernel_inputs(q_lat, latent, indices)
        return dsa_triton.sparse_latent_attention_forward(q_lat, latent, indices, softmax_scale)
    return dsa_reference.sparse_latent_attention_forward(q_lat, latent, indices, softmax_scale)


def sparse_pool_mass(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, softmax_scale: float, *,
                     kpool: int, topk: int, query_chunk: int | None = None,
                     lse: torch.Tensor | None = None) -> torch.Tensor:
    """The sparse attention's mass per selected pool (the indexer loss's target); see
    ``genolc.model.ops.dsa.reference.sparse_pool_mass`` (``lse``: the attention forward's, which saves the kernel
    its first pass). CUDA operands the Triton kernel does not take (a pool size that is not a power of two, say) go
    to the reference, which gathers in pieces of ``query_chunk`` queries."""
    if q_lat.is_cuda:
        from genolc.model.ops.dsa import triton as dsa_triton

        prepared = dsa_triton.prepare_inputs(q_lat, latent, indices)
        if dsa_triton.pool_mass_unsupported(*prepared, kpool) is None:
            return dsa_triton.sparse_pool_mass(*prepared, softmax_scale, kpool=kpool, topk=topk, lse=lse)
    return dsa_reference.sparse_pool_mass(q_lat, latent, indices, softmax_scale, kpool=kpool, topk=topk,
                                          query_chunk=query_chunk, lse=lse)


def sparse_indexer_kl(pool_mass: torch.Tensor, index_q: torch.Tensor, head_weights: torch.Tensor,
                      pooled: torch.Tensor, indices: torch.Tensor, softmax_scale: float, *, kpool: int, topk: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparse indexer KL per query row and whether the row has a pool (``[B, C]`` each); see
    ``genolc.model.ops.indexer_kl.reference.sparse_kl_rows``. CUDA operands the kernels take (:func:`fused_indexer_kl`)
    run the fused pair, whose backward computes the scores again from the inputs; anything else the reference,
    which keeps autograd's intermediates (genolc/model/indexer_loss.py checkpoints it)."""
    if fused_indexer_kl(index_q, head_weights, pooled):
        from genolc.model.ops.indexer_kl import triton as indexer_kl_triton

        return indexer_kl_triton.sparse_kl_rows(pool_mass, index_q, head_weights, pooled, indices, softmax_scale,
                                                kpool=kpool, topk=topk)
    return indexer_kl_reference.sparse_kl_rows(pool_mass, index_q, head_weights, pooled, indices, softmax_scale,
                                               kpool=kpool, topk=topk)


def fused_indexer_kl(index_q: torch.Tensor, head_weights: torch.Tensor, pooled: torch.Tensor) -> bool:
    """Whether :func:`sparse_indexer_kl` runs the fused kernels for these operands (CUDA, and dtypes and sizes
    ``indexer_kl.triton.unsupported_reason`` accepts)."""
    if not index_q.is_cuda:
        return False
    from genolc.model.ops.indexer_kl import triton as indexer_kl_triton

    return indexer_kl_triton.unsupported_reason(index_q, head_weights, pooled) is None


def routed_experts(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor, swiglu_limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed experts ``x [N, D]`` -> (``out [N, D]``, ``tokens_per_expert [E]``); grouped GEMM on CUDA."""
    if x.is_cuda:
        from genolc.model.ops.moe import grouped_mm

        return grouped_mm.grouped_experts(x, expert_ids, weights, gate_up_proj, down_proj, swiglu_limit)
    return moe_reference.routed_experts(x, expert_ids, weights, gate_up_proj, down_proj, swiglu_limit)


def mhc_mixing_logits(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """mHC's mixing logits ``x [M, K]``, ``weight [W, K]`` -> ``[M, W]``; see ``genolc.model.ops.mhc.reference``.
    CUDA tensors the kernels do not take (fp64, more than 128 logits) go to the reference too. Under autocast the
    kernels' logits are fp32 (TF32 products), the reference's are in the autocast dtype, as a Linear's."""
    if x.is_cuda:
        from genolc.model.ops.mhc import op as mhc_op, triton as mhc_triton

        if mhc_triton.unsupported_reason(x, weight) is None:
            # The kernels take any row stride; only the last dimension must be contiguous.
            x = x if x.stride(-1) == 1 else x.contiguous()
            return mhc_op.mixing_logits(x, weight if weight.stride(-1) == 1 else weight.contiguous(), eps)
    return mhc_reference.mixing_logits(x, weight, eps)


def mhc_block_input(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                    norm_eps: float, hc_eps: float, n_streams: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A hyper-connection's reading of its streams ``x [M, N * D]``: (the mixing logits ``[M, W]``, the block's input
    ``[M, D]``, x for the merge to read); see ``genolc.model.ops.mhc.reference.block_input``. On CUDA, where the
    kernels take the operands (N a power of two), one autograd function whose backward writes x's gradient once: the
    mixing logits' share, the block input's and the merge's (which reaches it through the third output,
    ``op.BlockInputPassingStreams``) in one kernel, where autograd would add them in further passes over the streams.
    Elsewhere the reference, with :func:`mhc_mixing_logits` making the logits, and x itself as the third."""
    if x.is_cuda:
        from genolc.model.ops.mhc import op as mhc_op, triton as mhc_triton

        if mhc_triton.block_input_unsupported_reason(x, weight, scale, base, n_streams) is None:
            x = x if x.stride(-1) == 1 else x.contiguous()
            return mhc_op.block_input(x, weight if weight.stride(-1) == 1 else weight.contiguous(), scale, base,
                                      norm_eps, hc_eps, n_streams)
    return mhc_reference.block_input(x, weight, scale, base, norm_eps, hc_eps, n_streams, mixing=mhc_mixing_logits)


def mhc_comb_weights(logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """mHC's mixing matrix ``sinkhorn(softmax(logits) + eps)`` of ``logits [..., N, N]``; see
    ``genolc.model.ops.mhc.reference.comb_weights``. fp32 CUDA tensors run the fused kernels (one launch each way
    instead of inductor's one per normalisation), anything else the reference."""
    if logits.is_cuda:
        from genolc.model.ops.mhc import comb_triton, op as mhc_op

        if comb_triton.unsupported_reason(logits) is None and iterations >= 1:
            return mhc_op.comb_weights_op(logits, iterations, eps)
    return mhc_reference.comb_weights(logits, iterations, eps)


def mhc_merge(block_out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, streams: torch.Tensor, *,
              compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """mHC's merge ``post ⊗ block_out + comb^T @ streams``, its terms added in ``compute_dtype`` (default: the
    streams') and rounded to the streams' dtype once (``genolc.model.ops.mhc.reference.merge``). Where that sum is
    fp32, CUDA tensors run the fused kernels (one pass over the streams each way); anything they do not take (N not
    a power of two, fp64), other compute dtypes and CPU tensors, the reference."""
    fp32_sum = (streams.dtype if compute_dtype is None else compute_dtype) == torch.float32
    if streams.is_cuda and fp32_sum:
        from genolc.model.ops.mhc import merge_triton, op as mhc_op

        if merge_triton.unsupported_reason(block_out, post, comb, streams) is None:
            return mhc_op.merge_op(block_out, post, comb, streams)
    return mhc_reference.merge(block_out, post, comb, streams, compute_dtype=compute_dtype)
