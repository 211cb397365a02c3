"""Memory and time estimates for a training run, used in CUDA out-of-memory messages (and by `plan` later).

Formula (bytes; ``P`` parameters, ``N`` tokens per micro-batch = windows * seq_len, ``a`` bytes per activation
value: 2 under bf16 autocast, 4 in fp32)::

    weights       4 P (+ 2 P)  fp32 master weights (and under bf16 autocast their bf16 copies: those the matmuls
                               save, and the routed experts' that the chunked step keeps for a micro-batch)
    gradients     4 P          fp32
    optimizer     8 P          AdamW exp_avg + exp_avg_sq
    activations   N * sum over layers of act(layer)                    saved for backward, reference path
                  with recompute: N * (n_layers * hc_mult * d * s + max act(layer))   (s: the streams' bytes;
                  the fast path adds terms of its own, below)
    logits        N * V * (a + 8)                                      logits, fp32 copy for the loss, its gradient
    total         the sum above * 1.10                                 allocator fragmentation and workspaces

``act(layer)`` in bytes per token, from the values the pure-torch reference path saves for backward (measured with
``torch.autograd.graph.saved_tensors_hooks`` on the tiny and small presets, within 5 % of these terms)::

    KDA token mixer   4 B * (3.5 * H * C * Dk + 6 * W)    always fp32: the chunked reference (C = 64) keeps
                                                          [C, C, Dk] pair-decay products per head
    DSA token mixer   a * (d + 4 r_q + 2 r_kv + 2 H (d_qk + d_v))  + 8 B * W_idx when T > index_topk (int64 rows)
    dense MLP         a * (6 I + d)
    MoE               a * ((k + n_shared) (6 I_moe + d) + 4 d + 2 E + 2 k)
    2 x mHC           a * (2 hc_mult d + 2 sinkhorn_iters hc_mult^2 + 8 (2 + hc_mult) hc_mult)  each
    2 x RMSNorm, 2 x stream merge    a * 2 d  each
    (W = H_kda * Dk: KDA width; W_idx = index_topk (+ tail pool): DSA keys per query)

Checked on an H200 (small preset, bf16 autocast, one 4k/16k window, reference ops): without recompute 46.1 GiB
estimated against 43.2 GiB measured peak at 4k, and 167 GiB at 16k, which indeed ran out of the 140 GiB device; with
recompute 10.6 against 10.4 GiB at 4k and 24.8 against 25.6 GiB at 16k.

On CUDA the model runs the fast kernels (``fast_kernels=True``, bf16 autocast) and mHC's fused ops, which save far
less; ``act(layer)`` is then (bytes per token, ``a`` = 2, ``s`` the residual streams' bytes: 2 for bf16 streams, the
default under autocast, 4 with ``--stream-dtype float32``; ``x`` the copies of the block's input its projections
save: with bf16 streams the norm hands them one bf16 input, x = 1; with fp32 streams each product casts the fp32
norm output on its own, x = 2 in DSA and in MoE (its router's product and its shared expert's gate and up), and 1
elsewhere: KDA's six projections are one product, the dense MLP's gate and up another)::

    2 x mHC           s n d + 8 n^2 + 12 n + 4     the streams, the fused block-input op's fp32 logits and rstd, the
                                                   weights
    2 x RMSNorm       (4 + s) d + 4                input, fp32 normalised value, rstd
    2 x stream merge  (s + 2) d + 8 n (n + 1)      both merges together: the block output, post and comb
    KDA token mixer   a (x d + 16 W + 2 Dk + 3 H)  input, conv in/out, q k v, the raw gate and the gated norm's
                                                   values (W = H Dk)
    DSA token mixer   a (x d + 2 H R + H (d_qk + d_v) + r_q + r_kv) + 6 (r_q + r_kv) + 4 H + 8
                      + 4 W_idx when T > index_topk   q_lat and o_lat (R = kv_lora_rank), lse, int32 rows
    dense MLP         a (d + 6 I)
    MoE               a (x d + 6 n_shared I_moe + E) + 12 k + 4    shared expert, router, routing weights
      routed experts  k (a (2 d + 3 I_moe) + 8)    grouped GEMM inputs, the SwiGLU's gate/up, the combine's rows and
                                                   slot positions: saved when a forward has at most 64k tokens (one
                                                   expert chunk); longer ones checkpoint them per 64k tokens, one
                                                   chunk of one layer recomputed at a time in backward

measured on CPU as the growth between two lengths of what autograd saves, with the fast ops' autograd Functions
around stand-in kernels, the mHC ops on their CPU paths and a grouped GEMM that saves its two inputs, as CUDA's
derivative does: exact with bf16 streams and within 2.5 % with fp32 ones for `tiny` and `tiny` with other widths,
stream counts, heads and experts (tests/train/test_train_plan.py), and exact for three layers of `small`'s
dimensions (76,924 / 69,248 / 104,512 bytes a token in a KDA+MoE, DSA+MoE and KDA+dense layer, routed experts
checkpointed). The table of 2026-11-30, from before the fused mHC ops and the bf16 streams, counted 177-200 KB for
those layers and left the routed experts out.

Against the steady-state peaks of chunked steps on the H200 (the second step's, or a bare step's plus AdamW's 8 P;
compiled, bf16 streams, the pools kept): `small` 512k in 32k and 64k chunks and 1M in 64k, 45.2-83.1 GiB; `base`
512k in 16k and 32k chunks and 1M and 2M in 16k, 81.2-120.7 GiB (benchmarks/results/plan_peaks_2026-12-03/,
chunk_length_bf16_streams_2026-12-02/, finetune_512k_2026-12-02_s18/), these terms with the bf16 weight copies (2 P)
are 4-9 % above each peak before the margin, 15-19 % with it (not yet attributed: the compiled norms and
hyper-connections probably keep less than eager autograd). These peaks and percentages date from before the router
read its bf16 input as it is (2026-12-03): each MoE layer saves 2 d bytes a token fewer since, which lowered the plan
and the measured peaks alike (`base` at 512k in 32k chunks: planned 135.6 -> 134.1 GiB, bare step 102.98 -> 101.58
GiB; benchmarks/results/profile_2026-12-03/). With per-layer recompute a
recomputed layer's fused kernels hold the gradients of all it saved beside them: one more ``max act(layer)`` per
token, as fitted on 2026-11-30 to `base` at 512k-2M in 32k chunks with recompute; today's `base` at 1M in 32k
chunks with recompute peaks at 77.1 GiB, 7.3 % under the plan and 2 % over it before the margin.
`finetune --compile off` (eager) keeps more than the compiled step: `base` at 512k in 32k chunks peaked at
132.05 GiB, 2.6 % under the plan and 7 % over it before the margin: for these two the margin is needed. No
context-parallel step has been measured against this table (the 2026-12-01 runs on two H200s used fp32 streams and
the unfused mHC ops, which kept more).

The chunk-recurrent step (genolc/train/chunked.py, ``--chunk``) keeps one chunk's activations (the table above for
``chunk`` tokens, with or without recompute) plus, for the whole window of ``T`` tokens and ``B`` windows::

    DSA latent rows   B T R (10 n_dsa + 10)      per layer: the rows (fp32), their fp32 gradient, the kernel's bf16
                                                 copy; one layer's backward adds its leaf's and the kernel's gradient
                                                 (on CUDA under autocast the rows are kept in bf16 since 2026-12-04,
                                                 genolc.train.chunked.compute_dtype_rows: 8 n_dsa + 8 by this count,
                                                 not yet measured; the measured count stays)
    pool keys         B T / kpool * Di * 8 n_dsa  rows and their gradient
    chosen pools      B T (topk / kpool) 4 n_idx  kept from the first pass for the second (n_idx: DSA layers with an
                                                 indexer), unless the strategy chose them again
    KDA states        ceil(T / chunk) n_kda B H Dk Dv * 4   one per chunk boundary

and, where the step strategy adds them (genolc/train/strategy.py: where they fit), the DSA forwards of one more chunk
(``kept_attention_device_bytes``) and fla's KDA intermediates kept for the backward, ``B chunk n_kda ((5 a + 4) W +
a H Dk Dv / 64)``, plus ``(128 a + 8) H`` a token in chunks longer than a KDA segment (32k) (one KDA layer's under
recompute; ``kda_intermediates_device_bytes``). Measured on the H200 (benchmarks/results/kda_intermediates_2026-12-03/):
+11.28 GiB at `small`'s 64k chunks (11.29 planned before the margin), +10.12 at `base`'s 32k (10.13) and +5.07 at
its 16k (5.06).

A context-parallel rank (``--cp N``, genolc/parallel) holds its share ``s = ceil(S / N)`` of each span (the window,
or one chunk of ``S`` tokens under the chunked step) and is planned as one process with a window (or chunk) of ``s``
tokens plus what the span adds (``context_parallel_saved_bytes``, bytes per layer; zigzag layout, ``2N`` pieces)::

    DSA layer         4 R (S + S / 2N - s) + (a + 4) R s     each piece saves the fp32 latent rows from position 0
                      (+ a d s under bf16)                   to its end, and the rank's rows are projected again for
                                                             the gather (its bf16 cast of the hidden states); chunked:
                                                             4 R (P + S / 2N - s), P tokens before the last chunk (its
                                                             second piece reads them again)
      with indexer    + 4 Di (2 S + (3 S + P) / kpool)       the span's keys and gate logits pooled by every rank
                      (+ 2 a d s under bf16)                 and two more casts for their projections
    KDA layer         reference: 20 W s + 4 H Dk^2 s / 64    value-sized fp32 tensors Dk columns wider, the
                      fast:      (a + 4) W s                 correction's fp32 input; fast: the values' zero
                                                             columns, the correction's input
                      + 24 N H Dk^2                          the gathered end states and the identity start states
    one DSA backward  4 R (3 S + P) + 16 Di S               the rows' fp32 gradients and the padded gather buffer

(summed over layers; with recompute the largest layer's). Measured on CPU (`tiny`, 2 gloo ranks, 2048 tokens): 823,292
bytes more than one process of 1024 tokens in the DSA token mixer (819,200 planned) and up to 1,399,056 in each KDA one
(1,425,408); with the fast ops' autograd Functions around stand-in kernels under bf16 autocast 1,011,708 (1,146,880, an
upper bound on this path: see the DSA term below) and 443,520 (442,368); the rank's peak within 1.5 % of the plan whole
and chunked (tests/parallel/test_context_parallel_memory.py). At large ``N`` these terms are a large part of a rank:
`small` at 4M over 8 ranks in 512k chunks plans 150.1 GiB per rank against 125.5 GiB for a one-process 64k chunk (both
with the pools chosen again, as a rank's are).

Time: the FLOPs of genolc/train/flops.py (dense, DSA core, indexer scoring) per step over ``peak_flops * mfu``
(defaults: H200 bf16 dense 989 TFLOP/s, 30 %), the indexer's scoring at its kernel's measured rate. That assumes the
fast kernels; the pure-torch reference path runs orders of magnitude below it (about 230 tokens/s for the small preset
at 4k on an H200), so use it only to compare settings. These are estimates for choosing options, not measurements.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from genolc.errors import ConfigError, GenolcError
from genolc.model import ModelConfig, parameter_counts
from genolc.model.ops.moe.grouped_mm import DEFAULT_CHUNK_TOKENS as EXPERT_CHUNK_TOKENS
from genolc.train.flops import PEAK_BF16_FLOPS, token_flops
from genolc.units import format_length

GIB = 1024**3
KDA_CHUNK = 64
H200_BF16_FLOPS = PEAK_BF16_FLOPS["H200"]
# The indexer's Triton scoring + Triton top-k at 1M tokens on the H200: 1.94 s for 1.4e14 FLOPs (2.27 s with
# torch.topk; benchmarks/results/indexer_topk_2026-12-02/indexer_2026-12-02.json).
INDEXER_FLOPS_PER_S = 72e12
# The chunk --chunk auto adds per-layer recompute to reach rather than run shorter chunks without it: `base` at 1M on
# the H200 took > 390 s a step in 8k chunks, 153 s in 32k chunks with recompute
# (benchmarks/results/long_context_2026-11-30.json). Where the first pass's pools cannot be kept, under context
# parallelism, and for chunks that need recompute anyway, every chunk under it counts as short.
FAST_CHUNK = 32 * 1024
# Where the pools are kept, the shortest chunk that does not count as short: one run each, `base` at 512k on one
# H200, micro-batch 1, steps 2-5 of the learning-rate warm-up, took 25.5, 25.2, 24.5, 24.1 s in 16k chunks without
# recompute against 26.7, 25.8, 25.9, 25.7 s in 32k chunks with it
# (benchmarks/results/finetune_512k_chunks_2026-12-02/).
FAST_UNRECOMPUTED_CHUNK = 16 * 1024
# The longest chunk whose KDA layers keep fla's intermediates (one unsegmented fla call a chunk): measured at 16k, 32k
# and 64k (benchmarks/results/kda_intermediates_2026-12-03/). A longer call's backward workspace grows with it, where
# fla's 32k segments bound it, and no longer one was measured, so longer chunks stay segmented.
KDA_KEEP_LONGEST_CHUNK = 64 * 1024
# Allocator fragmentation and kernel workspaces on top of every estimate. An explicit --chunk may run inside it
# (fits_within_margin), with a warning: `base` at 1M over 2 H200s ran in 32k chunks at 134.0 GiB a rank, planned
# 142.6 with the margin and 129.6 without.
PLAN_MARGIN = 1.10
# Lengths the fast kernels handle without padding on CUDA: KDA's chunk size (a multiple of the DSA pool size).
CUDA_SEQ_MULTIPLE = 64


def format_gib(size_bytes: float) -> str:
    """GiB with one decimal, or two significant digits below 1 GiB (a CPU test's budget is MiB)."""
    gib = size_bytes / GIB
    return f"{gib:.1f}" if gib >= 1 else f"{gib:.2g}"


class OutOfMemoryPlanError(GenolcError):
    """The run did not fit in device memory; the message carries the estimate and an option that fits."""


@dataclass(frozen=True)
class MemoryPlan:
    parameters: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    total: int
    per_token_per_layer: dict[str, int]   # bytes saved per token, largest layer of each attention kind

    def gib(self, field: str = "total") -> float:
        return getattr(self, field) / GIB


def plans_fp32_streams(bf16: bool, stream_dtype: str) -> bool:
    """Whether a run under bf16 autocast (``bf16``) with the resolved ``stream_dtype`` is planned with fp32 residual
    streams (``--stream-dtype float32``); without autocast everything is fp32 anyway."""
    return bf16 and stream_dtype == "float32"


def routed_expert_bytes_per_token(config: ModelConfig, bf16: bool = True) -> int:
    """Bytes per token one MoE layer's routed experts save for backward on CUDA when they run whole (module
    docstring): under bf16 autocast the grouped GEMMs' inputs, the gate/up output the SwiGLU keeps and the rows the
    combine keeps; in fp32 (CUDA's grouped GEMM is bf16-only) the per-expert loop's values, measured on CPU."""
    c = config
    if not bf16:
        return c.num_experts_per_tok * (10 * c.hidden_size + 24 * c.moe_intermediate_size + 64)
    return c.num_experts_per_tok * (2 * (2 * c.hidden_size + 3 * c.moe_intermediate_size) + 8)


def routed_experts_checkpointed(tokens: int, bf16: bool) -> bool:
    """Whether a forward of ``tokens`` tokens runs its routed experts checkpointed per ``EXPERT_CHUNK_TOKENS``
    (genolc.model.ops.moe.grouped_mm.grouped_experts; the fp32 per-expert loop never is). The plan drops by most of
    the routed term just above 64k tokens, as the memory does."""
    return bf16 and tokens > EXPERT_CHUNK_TOKENS


def fast_activation_bytes_per_token(config: ModelConfig, seq_len: int, bf16: bool = True,
                                     fp32_streams: bool = False, windows: int = 1) -> list[int]:
    """Bytes saved for backward per token on the fast-kernel path, one entry per decoder layer (module docstring);
    ``fp32_streams``: mHC's residual streams kept in fp32 under bf16 autocast (``--stream-dtype float32``). The
    routed experts save theirs when the forward's ``windows * seq_len`` tokens are at most one expert chunk
    (``EXPERT_CHUNK_TOKENS``); longer forwards checkpoint them per chunk (:func:`estimate_memory` counts one chunk's
    recompute)."""
    c = config
    d, n = c.hidden_size, c.hc_mult
    a = 2 if bf16 else 4
    s = 4 if fp32_streams or not bf16 else 2
    # fp32 streams reach the token mixer and the feed-forward as an fp32 norm output, which every projection casts
    # to bf16 and saves on its own; bf16 streams hand them one bf16 input that all of them share.
    own_casts = s > a
    hyper = s * n * d + 8 * n * n + 12 * n + 4
    norm = (4 + s) * d + 4
    merges = (s + 2) * d + 8 * n * (n + 1)
    routed = 0 if routed_experts_checkpointed(windows * seq_len, bf16) else routed_expert_bytes_per_token(c, bf16)
    per_layer = []
    for attn, mlp in zip(c.layer_types, c.mlp_layer_types):
        layer_bytes = 2 * hyper + 2 * norm + merges
        # One product for the dense MLP's gate and up (SwiGLUMLP.forward): one cast of x. A MoE layer's router and
        # shared expert are two products, each casting an fp32 x on its own.
        if mlp == "dense":
            layer_bytes += a * (d + 6 * c.intermediate_size)
        else:
            casts = 2 if own_casts and c.n_shared_experts else 1
            layer_bytes += (a * (casts * d + 6 * c.n_shared_experts * c.moe_intermediate_size + c.n_routed_experts)
                            + 12 * c.num_experts_per_tok + 4 + routed)
        if attn == "linear_attention":
            width = c.linear_num_heads * c.linear_head_dim
            # One product for all six input projections (KimiDeltaAttention.mixer_inputs): one cast of x either way.
            layer_bytes += a * (d + 16 * width + 2 * c.linear_head_dim + 3 * c.linear_num_heads)
        else:
            heads = c.num_attention_heads
            layer_bytes += (a * ((2 if own_casts else 1) * d + 2 * heads * c.kv_lora_rank
                                 + heads * (c.qk_head_dim + c.v_head_dim) + c.q_lora_rank + c.kv_lora_rank)
                            + 6 * (c.q_lora_rank + c.kv_lora_rank) + 4 * heads + 8)
            if seq_len > c.index_topk:
                layer_bytes += 4 * c.index_width
        per_layer.append(layer_bytes)
    return per_layer


def activation_bytes_per_token(config: ModelConfig, seq_len: int, bf16: bool = True) -> list[int]:
    """Bytes saved for backward per token, one entry per decoder layer (the table in the module docstring)."""
    c = config
    d = c.hidden_size
    a = 2 if bf16 else 4
    n = c.hc_mult
    hyper = 2 * n * d + 2 * c.hc_sinkhorn_iters * n * n + 8 * (2 + n) * n
    per_layer = []
    for attn, mlp in zip(c.layer_types, c.mlp_layer_types):
        values = 2 * hyper + 2 * (2 * d) + 2 * (2 * d)          # two mHC, two norms, two stream merges
        if mlp == "dense":
            values += 6 * c.intermediate_size + d
        else:
            values += ((c.num_experts_per_tok + c.n_shared_experts) * (6 * c.moe_intermediate_size + d)
                       + 4 * d + 2 * c.n_routed_experts + 2 * c.num_experts_per_tok)
        layer_bytes = 0
        if attn == "linear_attention":
            width = c.linear_num_heads * c.linear_head_dim
            layer_bytes += 4 * int(3.5 * c.linear_num_heads * KDA_CHUNK * c.linear_head_dim + 6 * width)
        else:
            values += (d + 4 * c.q_lora_rank + 2 * c.kv_lora_rank
                       + 2 * c.num_attention_heads * (c.qk_head_dim + c.v_head_dim))
            if seq_len > c.index_topk:
                layer_bytes += 8 * c.index_width
        per_layer.append(layer_bytes + a * values)
    return per_layer


def recompute_checkpoint_bytes_per_token(config: ModelConfig, layers: int, bf16: bool = True) -> int:
    """Bytes per token that per-layer recompute keeps for ``layers`` layers: each layer's input, ``hc_mult``
    residual streams of ``hidden_size`` values (genolc/export/layout.py counts Megatron's the same way)."""
    return layers * config.hc_mult * config.hidden_size * (2 if bf16 else 4)


def estimate_memory(config: ModelConfig, *, seq_len: int, windows: int = 1, bf16: bool = True,
                    recompute: bool = False, fast_kernels: bool = False, fp32_streams: bool = False) -> MemoryPlan:
    """Peak training memory for micro-batches of ``windows`` windows of ``seq_len`` tokens (module docstring);
    ``fast_kernels``: the CUDA path's activation table instead of the reference path's; ``fp32_streams``: fp32
    residual streams under bf16 autocast (``--stream-dtype float32``)."""
    a = 2 if bf16 else 4
    params = parameter_counts(config).total
    tokens = windows * seq_len
    per_layer = (fast_activation_bytes_per_token(config, seq_len, bf16, fp32_streams, windows) if fast_kernels
                 else activation_bytes_per_token(config, seq_len, bf16))
    if recompute:
        streams_bf16 = bf16 and not fp32_streams
        saved = recompute_checkpoint_bytes_per_token(config, config.num_hidden_layers, streams_bf16) + max(per_layer)
    else:
        saved = sum(per_layer)
    activations = tokens * saved
    if fast_kernels and recompute:
        # A recomputed layer's fused kernels hold the gradients of all it saved, and their workspaces, beside them:
        # about one more layer's activations (fitted to the H200's recomputed steps: module notes).
        activations += tokens * max(per_layer)
    if fast_kernels and routed_experts_checkpointed(tokens, bf16) and "sparse" in config.mlp_layer_types:
        # The routed experts run checkpointed per expert chunk: one chunk's saved values at a time in backward.
        activations += EXPERT_CHUNK_TOKENS * routed_expert_bytes_per_token(config, bf16)
    logits = tokens * config.vocab_size * (a + 8)
    weights, grads, optim = (6 if bf16 else 4) * params, 4 * params, 8 * params
    total = int((weights + grads + optim + activations + logits) * PLAN_MARGIN)
    kinds: dict[str, int] = {}
    for attn, layer_bytes in zip(config.layer_types, per_layer):
        kinds[attn] = max(kinds.get(attn, 0), layer_bytes)
    return MemoryPlan(parameters=params, weights=weights, gradients=grads, optimizer=optim, activations=activations,
                      logits=logits, total=total, per_token_per_layer=kinds)


def chunked_cache_bytes(config: ModelConfig, *, seq_len: int, chunk: int, windows: int = 1,
                        keep_selections: bool = True) -> int:
    """Bytes the chunk-recurrent step keeps for the whole window besides one chunk's activations (module notes);
    ``keep_selections``: the chosen pools kept from the first pass (the step's choice, see genolc/train/strategy.py)."""
    c = config
    tokens = windows * seq_len
    n_dsa = len(c.dsa_layers)
    n_kda = c.num_hidden_layers - n_dsa
    # Per DSA layer: the latent rows (fp32: an fp32-weighted RMSNorm's output), their fp32 gradient and the kernel's
    # bf16 copy of the rows up to the chunk; one layer's backward adds its leaf gradient and the kernel's. On CUDA
    # under autocast the rows are now kept in bf16 (genolc.train.chunked.compute_dtype_rows), 2 B T R (n_dsa + 1)
    # less (about 2 GiB at `base` 512k); the count stays at the measured H200 peaks' until a device measures the new.
    latent = tokens * c.kv_lora_rank * (10 * n_dsa + 10)
    pools = tokens // c.index_kpool * c.index_head_dim * 8 * n_dsa
    n_indexed = sum(c.indexer_types[layer] == "full" for layer in c.dsa_layers)
    chosen = tokens * (c.index_topk // c.index_kpool) * 4 * n_indexed if keep_selections else 0
    boundaries = -(-seq_len // chunk)
    states = boundaries * n_kda * windows * c.linear_num_heads * c.linear_head_dim * c.linear_head_dim * 4
    return latent + pools + chosen + states


def kept_attention_bytes(config: ModelConfig, tokens: int, bf16: bool = True) -> int:
    """Bytes of the DSA layers' sparse-attention forwards of ``tokens`` tokens as the chunked step keeps them
    (genolc/train/kept_attention.py): ``o_lat [H, R]`` in the compute dtype and the fp32 lse ``[H]`` per token and
    DSA layer. The window's go to host memory; the device holds one chunk's more (the next, copied back early)."""
    itemsize = 2 if bf16 else 4
    return tokens * len(config.dsa_layers) * config.num_attention_heads * (config.kv_lora_rank * itemsize + 4)


def kept_attention_device_bytes(config: ModelConfig, *, chunk: int, windows: int = 1, bf16: bool = True,
                                recompute: bool = False) -> int:
    """What keeping the DSA forwards adds to a chunked step's device peak: the next chunk's, copied back while a chunk
    computes (the current chunk's are what its autograd graph saves anyway, already planned); under per-layer
    recompute the current chunk's too, which the chunk's cache holds for the layers' replays while the plan counts
    one layer's saved activations."""
    return (2 if recompute else 1) * kept_attention_bytes(config, chunk * windows, bf16)


def kda_intermediates_device_bytes(config: ModelConfig, *, chunk: int, windows: int = 1, bf16: bool = True,
                                   recompute: bool = False) -> int:
    """What a chunked step adds to the device peak when fla keeps KDA's intermediates for backward instead of
    computing them again there (genolc/model/ops/kda/fla.py, ``keep_intermediates``), per token and KDA layer, with
    ``a`` bytes per value of the compute dtype (2 under bf16): ``w``, ``u``, the gated q and k and the corrected
    values (5 a W), the fp32 decay sum (4 W), the states every 64 tokens (a H Dk Dv / 64); for a chunk longer than a
    KDA segment (which ran segment-wise and saved only its inputs before) also fla's two 64-wide intra-chunk matrices
    (128 a H) and q's and k's fp32 norms (8 H). Every KDA layer of the chunk holds them until its backward; under
    per-layer recompute only the replayed layer does."""
    from genolc.model.ops.kda.fla import DEFAULT_SEGMENT_LEN

    c = config
    a = 2 if bf16 else 4
    heads, dim = c.linear_num_heads, c.linear_head_dim
    width = heads * dim
    per_token = (5 * a + 4) * width + a * heads * dim * dim // 64
    if chunk > DEFAULT_SEGMENT_LEN:
        per_token += (128 * a + 8) * heads
    layers = 1 if recompute else c.num_hidden_layers - len(c.dsa_layers)
    return chunk * windows * layers * per_token


def estimate_chunked_memory(config: ModelConfig, *, seq_len: int, chunk: int, windows: int = 1, bf16: bool = True,
                            recompute: bool = False, fast_kernels: bool = False, fp32_streams: bool = False,
                            keep_selections: bool = True) -> MemoryPlan:
    """Peak memory of the chunk-recurrent step (genolc.train.chunked): one chunk's activations as for a window of
    ``chunk`` tokens, plus :func:`chunked_cache_bytes` for the window (counted with the activations)."""
    chunk = min(chunk, seq_len)
    one_chunk = estimate_memory(config, seq_len=chunk, windows=windows, bf16=bf16, recompute=recompute,
                                fast_kernels=fast_kernels, fp32_streams=fp32_streams)
    return with_more_activations(one_chunk, chunked_cache_bytes(config, seq_len=seq_len, chunk=chunk, windows=windows,
                                                                keep_selections=keep_selections))


def fits_within_margin(total_bytes: int, budget_bytes: int) -> bool:
    """True when an estimate over ``budget_bytes`` fits once the plan's margin (``PLAN_MARGIN``) is taken off."""
    return total_bytes / PLAN_MARGIN <= budget_bytes


def with_more_activations(plan: MemoryPlan, extra: int) -> MemoryPlan:
    """``plan`` with ``extra`` bytes of activations added (and its total, with the same 10 % margin)."""
    activations = plan.activations + extra
    fixed = plan.weights + plan.gradients + plan.optimizer
    return dataclasses.replace(plan, activations=activations,
                               total=int((fixed + activations + plan.logits) * PLAN_MARGIN))


def largest_fitting_chunk(config: ModelConfig, *, seq_len: int, windows: int, bf16: bool, recompute: bool,
                          budget_bytes: int, fast_kernels: bool, fp32_streams: bool = False, multiple: int = 1,
                          smallest: int = 1024, keep_selections: bool = True) -> int | None:
    """The longest chunk (``seq_len`` halved until it is a multiple of ``multiple``, down to ``smallest``) whose
    chunked step is estimated to fit ``budget_bytes``, or None."""
    chunk = seq_len // 2
    while chunk >= min(smallest, seq_len):
        if chunk % multiple == 0 and estimate_chunked_memory(
                config, seq_len=seq_len, chunk=chunk, windows=windows, bf16=bf16, recompute=recompute,
                fast_kernels=fast_kernels, fp32_streams=fp32_streams,
                keep_selections=keep_selections).total <= budget_bytes:
            return chunk
        chunk //= 2
    return None


def estimate_step_seconds(config: ModelConfig, *, seq_len: int, tokens_per_step: int,
                          peak_flops: float = H200_BF16_FLOPS, mfu: float = 0.3, forwards: int = 1,
                          indexer_passes: int | None = None,
                          indexer_flops_per_s: float = INDEXER_FLOPS_PER_S) -> float:
    """Seconds per optimizer step: the dense and DSA-core FLOPs of genolc/train/flops.py (one backward, ``forwards``
    forwards: 2 with recompute or the chunked step) at ``mfu``, plus the indexer's scoring ``indexer_passes`` times
    (default: once per forward; the chunked step on one process chooses once and keeps the choice) at the rate the
    Triton scoring kernel reached on the H200."""
    flops = token_flops(config, seq_len)
    matmul = (2 + forwards) * (flops.dense_forward + flops.attention_forward) * tokens_per_step
    passes = forwards if indexer_passes is None else indexer_passes
    indexer = passes * flops.indexer_forward * tokens_per_step / indexer_flops_per_s
    return matmul / (peak_flops * mfu) + indexer


def _fast_unrecomputed(config: ModelConfig, seq_len: int, chunk: int, bf16: bool, budget_bytes: int,
                       fp32_streams: bool = False) -> int:
    """The shortest chunk worth running without recompute rather than ``FAST_CHUNK`` chunks with it, as the step
    strategy (genolc/train/strategy.py) judges ``chunk``: ``FAST_UNRECOMPUTED_CHUNK`` where the first pass's pools
    can be kept at that chunk (what was measured), else ``FAST_CHUNK``."""
    kept = estimate_chunked_memory(config, seq_len=seq_len, chunk=chunk, bf16=bf16, fast_kernels=True,
                                   fp32_streams=fp32_streams, keep_selections=True).total
    return FAST_UNRECOMPUTED_CHUNK if kept <= budget_bytes else FAST_CHUNK


def fitting_option(config: ModelConfig, *, seq_len: int, micro_batch: int, grad_accum: int, recompute: bool,
                   bf16: bool, budget_bytes: int, fast_kernels: bool = False, fp32_streams: bool = False,
                   chunk: int | None = None, chunk_multiple: int = 1, whole_only: bool = False) -> str | None:
    """The first change that brings the estimate under ``budget_bytes``, as command-line options, or None.

    Tried in order of how little they change the run: fewer windows per micro-batch with more accumulation (same
    tokens per step), then --recompute, then the chunked step (the longest --chunk that fits; same results, two
    forwards per step; with fast kernels ``--chunk 32k --recompute`` instead of a chunk under
    ``FAST_UNRECOMPUTED_CHUNK``), then the longest shorter --seq (halving) that fits, whole or, unless the run fixed
    its chunk, in chunks with recompute (what the automatic step strategy then picks). ``chunk``: the run already
    asked for chunks of this length.
    ``whole_only``: the run asked for the whole window (``--chunk off``): a --chunk for the same length is still
    offered (it replaces ``off``), but a shorter --seq only where the whole window fits. Chunked steps are planned
    without the kept selections, which the step gives up when they alone do not fit.
    """
    def fits(seq: int, windows: int, rc: bool) -> bool:
        if chunk is not None and chunk < seq:
            plan = estimate_chunked_memory(config, seq_len=seq, chunk=chunk, windows=windows, bf16=bf16,
                                           recompute=rc, fast_kernels=fast_kernels, fp32_streams=fp32_streams,
                                           keep_selections=False)
        else:
            plan = estimate_memory(config, seq_len=seq, windows=windows, bf16=bf16, recompute=rc,
                                   fast_kernels=fast_kernels, fp32_streams=fp32_streams)
        return plan.total <= budget_bytes

    for windows in range(micro_batch - 1, 0, -1):
        if micro_batch * grad_accum % windows == 0 and fits(seq_len, windows, recompute):
            return f"--micro-batch {windows} --grad-accum {micro_batch * grad_accum // windows}"
    if not recompute and fits(seq_len, 1, True):
        return "--recompute" + (f" --micro-batch 1 --grad-accum {micro_batch * grad_accum}" if micro_batch > 1 else "")
    batch = f" --micro-batch 1 --grad-accum {micro_batch * grad_accum}" if micro_batch > 1 else ""
    for rc in ((recompute,) if recompute else (False, True)):
        chosen = largest_fitting_chunk(config, seq_len=seq_len, windows=1, bf16=bf16, recompute=rc,
                                       budget_bytes=budget_bytes, fast_kernels=fast_kernels,
                                       fp32_streams=fp32_streams, multiple=chunk_multiple, smallest=chunk_multiple,
                                       keep_selections=False)
        if (fast_kernels and not rc and not recompute and chosen is not None
                and chosen < _fast_unrecomputed(config, seq_len, chosen, bf16, budget_bytes, fp32_streams)
                and (chunk is None or FAST_CHUNK < chunk) and FAST_CHUNK < seq_len
                and estimate_chunked_memory(config, seq_len=seq_len, chunk=FAST_CHUNK, bf16=bf16, recompute=True,
                                            fast_kernels=True, fp32_streams=fp32_streams,
                                            keep_selections=False).total <= budget_bytes):
            return f"--chunk {format_length(FAST_CHUNK)} --recompute" + batch
        if chosen is not None and (chunk is None or chosen < chunk):
            return f"--chunk {format_length(chosen)}" + (" --recompute" if rc and not recompute else "") + batch

    def fits_in_chunks(seq: int) -> bool:
        return chunk is None and not whole_only and largest_fitting_chunk(
            config, seq_len=seq, windows=1, bf16=bf16, recompute=True, budget_bytes=budget_bytes,
            fast_kernels=fast_kernels, fp32_streams=fp32_streams, multiple=chunk_multiple,
            smallest=chunk_multiple, keep_selections=False) is not None

    seq = seq_len // 2
    while seq >= 1:
        if fits(seq, 1, True) or fits_in_chunks(seq):
            return f"--seq {format_length(seq)}" + ("" if recompute else " --recompute") + batch
        seq //= 2
    return None


def oom_error(config: ModelConfig, *, seq_len: int, micro_batch: int, grad_accum: int, recompute: bool, bf16: bool,
              budget_bytes: int, where: str, fast_kernels: bool = False, fp32_streams: bool = False,
              chunk: int | None = None, chunk_multiple: int = 1, keep_selections: bool = False, whole_only: bool = False
              ) -> OutOfMemoryPlanError:
    """The error for a run that does not fit (refused up front, or a device out-of-memory): the estimate, the
    device size, and an option that would fit (:func:`fitting_option`; when that is a shorter window, also the
    fewest context-parallel ranks that fit the asked one, :func:`fitting_context_parallel`). ``keep_selections``:
    the chunked step ran keeping its first pass's pools (a device out-of-memory of such a step); a setting refused
    up front is planned without them, the least a chunked step needs. ``whole_only``: as fitting_option's."""
    if chunk is not None and chunk < seq_len:
        plan = estimate_chunked_memory(config, seq_len=seq_len, chunk=chunk, windows=micro_batch, bf16=bf16,
                                       recompute=recompute, fast_kernels=fast_kernels, fp32_streams=fp32_streams,
                                       keep_selections=keep_selections)
        setting = f"--seq {format_length(seq_len)} --chunk {format_length(chunk)}"
    else:
        plan = estimate_memory(config, seq_len=seq_len, windows=micro_batch, bf16=bf16, recompute=recompute,
                               fast_kernels=fast_kernels, fp32_streams=fp32_streams)
        setting = f"--seq {format_length(seq_len)}"
    option = fitting_option(config, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum,
                            recompute=recompute, bf16=bf16, budget_bytes=budget_bytes, fast_kernels=fast_kernels,
                            fp32_streams=fp32_streams, chunk=chunk, chunk_multiple=chunk_multiple,
                            whole_only=whole_only)
    what = (f"out of device memory at {setting}: estimated {format_gib(plan.total)} GiB "
            f"(weights+grads+AdamW {format_gib(plan.weights + plan.gradients + plan.optimizer)}, activations "
            f"{format_gib(plan.activations)}, logits {format_gib(plan.logits)}) on a {format_gib(budget_bytes)} GiB "
            "device")
    spread = None
    if option is None or option.startswith("--seq"):
        spread = fitting_context_parallel(config, seq_len=seq_len, windows=micro_batch, bf16=bf16,
                                          budget_bytes=budget_bytes, fast_kernels=fast_kernels,
                                          fp32_streams=fp32_streams, chunk_multiple=chunk_multiple,
                                          whole_only=whole_only)
    streams = " --stream-dtype float32" if fp32_streams else ""
    keep = (f"keep --seq {format_length(seq_len)} and split each window over {spread[0]} GPUs with {spread[1]} "
            f"(genolc plan {spread[1]} --seq {format_length(seq_len)}{streams} checks it)") if spread else None
    if option and keep:
        fix = f"try {option} (estimated to fit), or {keep}"
    elif option:
        fix = f"try {option} (estimated to fit)"
    elif keep:
        fix = f"no single-device setting fits; {keep}"
    else:
        fix = "no single-device setting fits this model; use a smaller --model"
    return OutOfMemoryPlanError(what, where=where, fix=fix)


# The most context-parallel ranks an out-of-memory message suggests.
MAX_ADVISED_CP = 1024
# --chunk auto's shortest chunk (per context-parallel rank, genolc/train/strategy.py): below it the per-chunk
# overheads (kernel launches, the window's cache copies) dominate; --chunk may go lower.
SMALLEST_AUTO_CHUNK = 256


def fitting_context_parallel(config: ModelConfig, *, seq_len: int, windows: int, bf16: bool, budget_bytes: int,
                             fast_kernels: bool, fp32_streams: bool = False, chunk_multiple: int = 1,
                             whole_only: bool = False) -> tuple[int, str] | None:
    """The fewest context-parallel ranks (a power of two, at most ``MAX_ADVISED_CP``) whose ranks are each estimated
    to fit one window of ``seq_len`` (:func:`estimate_context_parallel_memory`, the zigzag layout), with the options
    that say so: ``--cp N`` when the ranks fit it whole, ``--cp N --recompute`` when they need recompute, whole or
    in the longest chunk that --chunk auto would pick. None when no such count fits. ``chunk_multiple``: the
    kernels' multiple for one process (each chunk is cut into 2 cp pieces of it). ``whole_only``: the ranks run
    their share whole (``--chunk off``)."""
    cp = 2
    while cp <= min(MAX_ADVISED_CP, seq_len):
        args = dict(seq_len=seq_len, cp=cp, windows=windows, bf16=bf16, fast_kernels=fast_kernels,
                    fp32_streams=fp32_streams)
        multiple = chunk_multiple * 2 * cp if chunk_multiple > 1 else 1
        if estimate_context_parallel_memory(config, recompute=False, **args).total <= budget_bytes:
            return cp, f"--cp {cp}"
        if (estimate_context_parallel_memory(config, recompute=True, **args).total <= budget_bytes
                or not whole_only and largest_fitting_context_parallel_chunk(
                    config, recompute=True, budget_bytes=budget_bytes, multiple=multiple,
                    smallest=max(multiple, SMALLEST_AUTO_CHUNK * cp), **args) is not None):
            return cp, f"--cp {cp} --recompute"
        cp *= 2
    return None


def required_seq_multiple(device_type: str) -> int:
    """Window lengths the kernels need: any on CPU (reference path), a multiple of 64 on CUDA (KDA chunks)."""
    return CUDA_SEQ_MULTIPLE if device_type == "cuda" else 1


def check_window_lengths(lengths, device_type: str, cp: int = 1, cp_layout: str = "zigzag") -> None:
    """ConfigError naming the first of ``lengths`` the ``device_type`` kernels cannot run (each context-parallel
    piece runs through them on its own), with the nearest lengths that they can."""
    multiple = required_seq_multiple(device_type)
    pieces = ""
    if cp > 1 and multiple > 1:
        from genolc.parallel.layout import Layout

        count = Layout(max(lengths), cp, cp_layout).piece_count
        multiple *= count
        pieces = f"; --cp {cp} {cp_layout} cuts each window into {count} pieces"
    bad = [n for n in lengths if n % multiple]
    if bad:
        n = bad[0]
        lower, upper = n // multiple * multiple, -(-n // multiple) * multiple
        raise ConfigError(
            f"window length {n} is not a multiple of {multiple}, which the {device_type} kernels need "
            f"(KDA processes 64-token chunks{pieces}; the CPU reference path takes any length)",
            where="--seq / --seq-warmup",
            fix=f"use {upper}" + (f" or {lower}" if lower else "") + " (genolc does not pad training windows: "
                "padding would train on positions that are not genome)")


def context_parallel_saved_bytes(config: ModelConfig, *, span: int, cp: int, past: int = 0, bf16: bool = True,
                                 fast_kernels: bool = False) -> list[int]:
    """Bytes a context-parallel rank saves for backward in each decoder layer beyond what one process running its
    share of ``span`` tokens (a window, or one chunk of it after ``past`` tokens of the window, counted as
    :func:`estimate_chunked_memory` counts them) saves, for one window (module notes)."""
    c = config
    a = 2 if bf16 else 4
    share = -(-span // cp)
    pieces = 2 * cp
    width = c.linear_num_heads * c.linear_head_dim
    # Per piece the [offset | transition] end state all-gathered (fp32 [H, Dk, Dv + Dk], 2cp of them) and the
    # [0 | I] start state its op call keeps.
    kda_states = (pieces + cp) * c.linear_num_heads * c.linear_head_dim * 2 * c.linear_head_dim * 4
    if fast_kernels:
        # SegmentedKDA saves its inputs: the values padded with Dk zero columns are a new [T, H, Dv + Dk] tensor
        # (one process saves the values alone); the correction's einsum saves an fp32 copy of the extra output
        # columns [T, H, Dk] (`tiny`, 2 ranks of 1024 tokens, stand-in kernels: 443,520 bytes more than one process;
        # this 442,368). The layer hands its op contiguous q, k, v (convolved_heads), so no view of them keeps the
        # convolution's whole output alive.
        kda = share * (a + 4) * width + kda_states
    else:
        # The chunked reference saves value-sized fp32 tensors per token, each Dk columns wider, the correction's
        # einsum the extra output columns, and one [H, Dk, Dv + Dk] state per 64-token chunk instead of [H, Dk, Dv]:
        # `tiny` at 2048 tokens over 2 ranks saved 1.40 MB more per KDA layer than one process of 1024 tokens
        # (saved_tensors_hooks), this 1.43 MB.
        kda = (share * 5 * 4 * width + -(-share // KDA_CHUNK) * c.linear_num_heads * c.linear_head_dim ** 2 * 4
               + kda_states)
    # Each piece's attention saves the latent rows from position 0 to the piece's end: under zigzag a rank's two pieces
    # end at (r + 1) / 2cp and (2cp - r) / 2cp of the span, span (1 + 1 / 2cp) rows in all (contiguous: at most span),
    # against ``share`` in one process. Counted in fp32 (an fp32-weighted RMSNorm's output), as the reference path
    # saves them. The fast kernels save their ``a``-byte cast: until 2026-12-04 the indexer KL's checkpoint kept the
    # fp32 rows beside it, and since its target is computed outside the checkpoint this term is an upper bound there
    # by ``rows * R * (4 - a)`` bytes. It is kept: every context-parallel plan was set on it, and a lower term would
    # plan windows to fit that no device run has checked (``base`` at 4M on 2 ranks). Under the chunked step both
    # pieces of the last chunk also read the ``past`` rows of the earlier chunks, where one process's chunk reads them
    # once (in its cache terms). The rank's own rows are projected and normalised once more for the gather (the norm's
    # input, ``a`` bytes, and output), and under bf16 autocast that projection saves its own bf16 cast of the rank's
    # hidden states [share, d].
    rows = (span + -(-span // pieces) - share) if not past else (past + -(-span // pieces) - share)
    cast = share * c.hidden_size * a if bf16 else 0
    dsa = rows * c.kv_lora_rank * 4 + share * c.kv_lora_rank * (a + 4) + cast
    # With an indexer: pool_keys over the whole span saves its per-token keys and gate logits (fp32 [span, Di]
    # each) besides each piece's own pooling, and three pooled-size tensors of the span's pools; the second piece
    # reads the past's pools again. The gather's key and gate projections cast the hidden states once more each.
    indexer = (2 * span + (3 * span + past) // c.index_kpool) * c.index_head_dim * 4 + 2 * cast
    # Measured for `tiny` (2048 tokens, 2 ranks): 823,292 bytes more in its DSA layer (fast path 1,011,708, and
    # 1,208,316 before the KL's change); these terms give 819,200 (1,146,880, 196,608 of it the upper bound above).
    per_layer = []
    for attn, index in zip(c.layer_types, c.indexer_types):
        if attn == "linear_attention":
            per_layer.append(kda)
        else:
            per_layer.append(dsa + (indexer if index == "full" else 0))
    return per_layer


def context_parallel_extra_bytes(config: ModelConfig, *, span: int, cp: int, past: int = 0, windows: int = 1,
                                 bf16: bool = True, recompute: bool = False, fast_kernels: bool = False) -> int:
    """Bytes a context-parallel rank holds beyond a one-process run of its share of ``span`` tokens (after ``past``
    tokens under the chunked step): what its layers save (:func:`context_parallel_saved_bytes`; one layer's with
    per-layer recompute) and one DSA layer's backward."""
    c = config
    per_layer = context_parallel_saved_bytes(c, span=span, cp=cp, past=past, bf16=bf16, fast_kernels=fast_kernels)
    saved = max(per_layer) if recompute else sum(per_layer)
    backward = 0
    if c.dsa_layers:
        # One DSA layer's backward at a time: the fp32 gradient of the pieces' latent rows, of the span's rows and
        # the padded all-gather buffer it reduce-scatters from (three [span, R]), and of the span's indexer keys and
        # gate logits with their gathered buffers; under the chunked step the second piece's gradient of the past
        # rows.
        indexed = any(c.indexer_types[i] == "full" for i in c.dsa_layers)
        backward = (3 * span + past) * c.kv_lora_rank * 4 + (4 * span * c.index_head_dim * 4 if indexed else 0)
    return windows * (saved + backward)


def estimate_context_parallel_memory(config: ModelConfig, *, seq_len: int, cp: int, chunk: int | None = None,
                                     windows: int = 1, bf16: bool = True, recompute: bool = False,
                                     fast_kernels: bool = False, fp32_streams: bool = False) -> MemoryPlan:
    """Peak memory of one rank of ``--cp cp``: the one-process estimate for its share of the window (or, with
    ``chunk`` shorter than the window, of each chunk plus the window's caches, whole on every rank) plus
    :func:`context_parallel_extra_bytes` for the span (counted with the activations)."""
    if chunk is None or chunk >= seq_len:
        span, past = seq_len, 0
        base = estimate_memory(config, seq_len=-(-seq_len // cp), windows=windows, bf16=bf16, recompute=recompute,
                               fast_kernels=fast_kernels, fp32_streams=fp32_streams)
        caches = 0
    else:
        # The last chunk is the largest: it reads the rows of all the window before it.
        span = chunk
        past = (seq_len - 1) // chunk * chunk
        base = estimate_memory(config, seq_len=-(-chunk // cp), windows=windows, bf16=bf16, recompute=recompute,
                               fast_kernels=fast_kernels, fp32_streams=fp32_streams)
        # The chunk caches hold the whole window on every rank, with one KDA state per chunk (not per rank's share).
        caches = chunked_cache_bytes(config, seq_len=seq_len, chunk=chunk, windows=windows, keep_selections=False)
    extra = context_parallel_extra_bytes(config, span=span, cp=cp, past=past, windows=windows, bf16=bf16,
                                         recompute=recompute, fast_kernels=fast_kernels)
    return with_more_activations(base, caches + extra)


def largest_fitting_context_parallel_chunk(config: ModelConfig, *, seq_len: int, cp: int, windows: int, bf16: bool,
                                           recompute: bool, budget_bytes: int, fast_kernels: bool,
                                           fp32_streams: bool = False, multiple: int = 1,
                                           smallest: int = 1024) -> int | None:
    """The longest chunk (``seq_len`` halved until it is a multiple of ``multiple``, down to ``smallest``) whose
    context-parallel chunked step is estimated to fit ``budget_bytes`` on each rank, or None."""
    chunk = seq_len // 2
    while chunk >= min(smallest, seq_len):
        if chunk % multiple == 0 and estimate_context_parallel_memory(
                config, seq_len=seq_len, cp=cp, chunk=chunk, windows=windows, bf16=bf16, recompute=recompute,
                fast_kernels=fast_kernels, fp32_streams=fp32_streams).total <= budget_bytes:
            return chunk
        chunk //= 2
    return None


def context_parallel_oom_error(config: ModelConfig, *, seq_len: int, cp: int, chunk: int | None, windows: int,
                               recompute: bool, bf16: bool, fast_kernels: bool, budget_bytes: int, where: str,
                               chunk_multiple: int = 1, fp32_streams: bool = False) -> OutOfMemoryPlanError:
    """The error for a context-parallel run whose ranks would not fit: the per-rank estimate, the device size, and
    the first of --recompute or the longest --chunk that fits."""
    chunk = None if chunk is not None and chunk >= seq_len else chunk
    plan = estimate_context_parallel_memory(config, seq_len=seq_len, cp=cp, chunk=chunk, windows=windows, bf16=bf16,
                                            recompute=recompute, fast_kernels=fast_kernels, fp32_streams=fp32_streams)
    setting = f"--seq {format_length(seq_len)} --cp {cp}"
    if chunk is not None:
        setting += f" --chunk {format_length(chunk)}"
    option = None
    if not recompute and estimate_context_parallel_memory(
            config, seq_len=seq_len, cp=cp, chunk=chunk, windows=windows, bf16=bf16, recompute=True,
            fast_kernels=fast_kernels, fp32_streams=fp32_streams).total <= budget_bytes:
        option = "--recompute"
    for rc in ((recompute,) if recompute else (False, True)):
        if option is not None:
            break
        chosen = largest_fitting_context_parallel_chunk(
            config, seq_len=seq_len, cp=cp, windows=windows, bf16=bf16, recompute=rc, budget_bytes=budget_bytes,
            fast_kernels=fast_kernels, fp32_streams=fp32_streams, multiple=chunk_multiple, smallest=chunk_multiple)
        if chosen is not None and (chunk is None or chosen < chunk):
            option = f"--chunk {format_length(chosen)}" + (" --recompute" if rc and not recompute else "")
    what = (f"out of device memory at {setting}: estimated {format_gib(plan.total)} GiB per rank (weights+grads+AdamW "
            f"{format_gib(plan.weights + plan.gradients + plan.optimizer)}, activations "
            f"{format_gib(plan.activations)}, logits {format_gib(plan.logits)}) on a {format_gib(budget_bytes)} GiB "
            "device")
    if option:
        fix = f"try {option} (estimated to fit)"
    else:
        # Every rank keeps the whole window's caches, so one process of the window may fit where its ranks do not.
        alone = None
        for rc in (False, True):
            alone = largest_fitting_chunk(config, seq_len=seq_len, windows=windows, bf16=bf16, recompute=rc,
                                          budget_bytes=budget_bytes, fast_kernels=fast_kernels,
                                          fp32_streams=fp32_streams, multiple=CUDA_SEQ_MULTIPLE if fast_kernels else 1,
                                          keep_selections=False)
            if alone is not None:
                alone = f"--cp 1 --chunk {format_length(alone)}" + (" --recompute" if rc else "")
                break
        fix = ("no chunk fits on this many ranks (each keeps the whole window's caches); use a larger --cp or a "
               "smaller --model" + (f", or one GPU per window: {alone} is estimated to fit" if alone else ""))
    return OutOfMemoryPlanError(what, where=where, fix=fix)

