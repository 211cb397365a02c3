"""Memory and time estimates for a training run, used in CUDA out-of-memory messages (and by `plan` later).

Formula (bytes; ``P`` parameters, ``N`` tokens per micro-batch = windows * seq_len, ``a`` bytes per activation
value: 2 under bf16 autocast, 4 in fp32)::

    weights       4 P          fp32 master weights
    gradients     4 P          fp32
    optimizer     8 P          AdamW exp_avg + exp_avg_sq
    activations   N * sum over layers of act(layer)                    saved for backward, reference path
                  with recompute: N * (n_layers * hc_mult * d * a + max act(layer))
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

Checked on an H200 (small preset, bf16 autocast, one 4k/16k window): without recompute 46.1 GiB estimated against
43.2 GiB measured peak at 4k, and 167 GiB at 16k, which indeed ran out of the 140 GiB device; with recompute 10.6
against 10.4 GiB at 4k and 24.8 against 25.6 GiB at 16k.

Time: ``(6 * active_parameters + 12 * sum over DSA layers of H (d_qk + d_v) min(T, W_idx)) * tokens`` FLOPs per
step over ``peak_flops * mfu`` (defaults: H200 bf16 dense 989 TFLOP/s, 30 %). That assumes the fast kernels; the
pure-torch reference path runs orders of magnitude below it (about 230 tokens/s for the small preset at 4k on an
H200), so use it only to compare settings. These are estimates for choosing options, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from genolc.errors import GenolcError
from genolc.model import ModelConfig, parameter_counts
from genolc.units import format_length

GIB = 1024**3
KDA_CHUNK = 64
H200_BF16_FLOPS = 989e12
# Lengths the fast kernels handle without padding on CUDA: KDA's chunk size (a multiple of the DSA pool size).
CUDA_SEQ_MULTIPLE = 64


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


def estimate_memory(config: ModelConfig, *, seq_len: int, windows: int = 1, bf16: bool = True,
                    recompute: bool = False) -> MemoryPlan:
    """Peak training memory for micro-batches of ``windows`` windows of ``seq_len`` tokens (module docstring)."""
    a = 2 if bf16 else 4
    params = parameter_counts(config).total
    tokens = windows * seq_len
    per_layer = activation_bytes_per_token(config, seq_len, bf16)
    if recompute:
        saved = config.num_hidden_layers * config.hc_mult * config.hidden_size * a + max(per_layer)
    else:
        saved = sum(per_layer)
    activations = tokens * saved
    logits = tokens * config.vocab_size * (a + 8)
    weights, grads, optim = 4 * params, 4 * params, 8 * params
    total = int((weights + grads + optim + activations + logits) * 1.10)
    kinds: dict[str, int] = {}
    for attn, layer_bytes in zip(config.layer_types, per_layer):
        kinds[attn] = max(kinds.get(attn, 0), layer_bytes)
    return MemoryPlan(parameters=params, weights=weights, gradients=grads, optimizer=optim, activations=activations,
                      logits=logits, total=total, per_token_per_layer=kinds)


def estimate_step_seconds(config: ModelConfig, *, seq_len: int, tokens_per_step: int,
                          peak_flops: float = H200_BF16_FLOPS, mfu: float = 0.3) -> float:
    """Seconds per optimizer step from the FLOP count in the module docstring."""
    active = parameter_counts(config).active
    keys = min(seq_len, config.index_width)
    attn = sum(12 * config.num_attention_heads * (config.qk_head_dim + config.v_head_dim) * keys
               for _ in config.dsa_layers)
    return (6 * active + attn) * tokens_per_step / (peak_flops * mfu)


def fitting_option(config: ModelConfig, *, seq_len: int, micro_batch: int, grad_accum: int, recompute: bool,
                   bf16: bool, budget_bytes: int) -> str | None:
    """The first change that brings the estimate under ``budget_bytes``, as command-line options, or None.

    Tried in order of how little they change the run: fewer windows per micro-batch with more accumulation (same
    tokens per step), then --recompute, then the longest shorter --seq (halving) that fits.
    """
    def fits(seq: int, windows: int, rc: bool) -> bool:
        return estimate_memory(config, seq_len=seq, windows=windows, bf16=bf16, recompute=rc).total <= budget_bytes

    for windows in range(micro_batch - 1, 0, -1):
        if micro_batch * grad_accum % windows == 0 and fits(seq_len, windows, recompute):
            return f"--micro-batch {windows} --grad-accum {micro_batch * grad_accum // windows}"
    if not recompute and fits(seq_len, 1, True):
        return "--recompute" + (f" --micro-batch 1 --grad-accum {micro_batch * grad_accum}" if micro_batch > 1 else "")
    seq = seq_len // 2
    while seq >= 1:
        if fits(seq, 1, True):
            options = f"--seq {format_length(seq)}" + ("" if recompute else " --recompute")
            if micro_batch > 1:
                options += f" --micro-batch 1 --grad-accum {micro_batch * grad_accum}"
            return options
        seq //= 2
    return None


def oom_error(config: ModelConfig, *, seq_len: int, micro_batch: int, grad_accum: int, recompute: bool, bf16: bool,
              budget_bytes: int, where: str) -> OutOfMemoryPlanError:
    """The error raised for a CUDA out-of-memory: the estimate, the device size, and an option that would fit."""
    plan = estimate_memory(config, seq_len=seq_len, windows=micro_batch, bf16=bf16, recompute=recompute)
    option = fitting_option(config, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum,
                            recompute=recompute, bf16=bf16, budget_bytes=budget_bytes)
    what = (f"out of device memory at --seq {format_length(seq_len)}: estimated {plan.gib():.1f} GiB "
            f"(weights+grads+AdamW {(plan.weights + plan.gradients + plan.optimizer) / GIB:.1f}, activations "
            f"{plan.gib('activations'):.1f}, logits {plan.gib('logits'):.1f}) on a {budget_bytes / GIB:.1f} GiB device")
    if option:
        fix = f"try {option} (estimated to fit)"
    else:
        fix = "no single-device setting fits this model; use a smaller --model"
    return OutOfMemoryPlanError(what, where=where, fix=fix)


def required_seq_multiple(device_type: str) -> int:
    """Window lengths the kernels need: any on CPU (reference path), a multiple of 64 on CUDA (KDA chunks)."""
    return CUDA_SEQ_MULTIPLE if device_type == "cuda" else 1
