"""Parallel sizes for training a GLM-5.3-Flash-shaped model with Megatron-core, from a small memory model.

Context parallelism: SkyRL 0.4.0's KDA layer refuses it (``skyrl/backends/skyrl_train/patches/megatron/mcore_ext/
kda.py``, lines 16-18 and 97-98: "KimiDeltaAttention does not support context parallelism") and so does
megatron-core 0.16.1's ``DSAttention`` ("Currently context parallelism is not supported by DSAttention!"), so CP
is searched only up to ``max_context_parallel``, 1 by default. Long windows are therefore split by tensor
parallelism (with sequence parallelism, the sequence dimension of activations splits over TP too) and pipeline
parallelism (each stage keeps only its own layers' activations).

Bytes per GPU on the heaviest pipeline stage, for tensor-parallel size TP, pipeline PP, context CP, expert EP (expert
tensor parallel 1), data-parallel DP = world / (TP * PP * CP), expert data-parallel EDP = world / (PP * EP),
S tokens a window, ``Ls = ceil(layers / PP)`` layers a stage (the first stage takes the remainder):

- weights, bf16: 2 * (P_layers * Ls / layers / TP + P_experts * Ls / layers / EP + P_embedding / TP / min(PP, 2)),
  where P_experts are the routed experts' parameters, P_embedding the input embedding plus LM head (on the first
  and last stage when PP > 1) and P_layers the rest;
- gradients, fp32: 4 * the same (SkyRL's Megatron DDP default ``grad_reduce_in_fp32: true``);
- optimizer, Megatron's distributed optimizer (fp32 master weights + Adam moments, 12 bytes a parameter), sharded over
  the data-parallel group: 12 * (dense local / (DP * CP) + experts local / EDP); 0 when the optimizer is offloaded
  to CPU (``optimizer_cpu_offload``);
- activations with full recompute (one checkpoint per layer) and one micro-batch in flight: every stage layer's input,
  S / (CP * TP) tokens of hc_mult residual streams in bf16 (2 * hc_mult * hidden bytes a token), plus one layer's
  recompute working set, S / (CP * TP) tokens at 34 * hidden bytes (Korthikanti et al. 2022, with sequence
  parallelism) and the routed copies, num_experts_per_tok * (2 * hidden + 3 * moe_intermediate) * 2 bytes a token;
- logits: S / CP tokens * vocab / TP * 6 bytes (bf16 logits and their fp32 softmax gradient) on the last stage;
- a fixed reserve of 8 GiB (CUDA context, NCCL buffers, allocator fragmentation).

This is not genolc's own trainer's model (genolc/train/plan.py), which it shares only where the two count the same
thing: parameter counts (``parameter_counts``) and the residual streams per-layer recompute keeps
(``recompute_checkpoint_bytes_per_token``). The rest differs because the training differs: Megatron keeps bf16
weights with fp32 gradients and shards a distributed optimizer (plan.py: one process's fp32 master weights, gradients
and AdamW moments, 16 bytes a parameter, 18 with autocast's bf16 copies, nothing sharded); a Megatron layer's
recompute working set is Korthikanti's
``34 * hidden`` under sequence parallelism (plan.py: per-layer tables measured on genolc's own KDA, DSA and MoE
code); Megatron's vocabulary-parallel loss keeps 6 bytes a logit (plan.py: genolc's loss keeps ``a + 8``); and a
fixed 8 GiB reserve for NCCL buffers stands where plan.py adds 10 % for fragmentation.

The search keeps TP within a node (TP <= GPUs per node), takes EP as large as divides the expert count and
world / PP (experts spread over data-parallel ranks at no cost to throughput), and picks the layout with the least
model parallelism TP * PP * CP that fits (most data parallelism), then the fewest pipeline stages (each adds a
pipeline bubble), then the smallest TP. Only if no layout fits does it offload the optimizer to CPU. The model errs
on the generous side; it is a starting point to measure from, not a promise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from genolc.errors import ConfigError
from genolc.model.config import ModelConfig
from genolc.model.presets import parameter_counts
from genolc.train.plan import GIB, recompute_checkpoint_bytes_per_token
from genolc.units import format_length

RESERVE_GIB = 8.0
# Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022): 34 * s * h bytes of
# activations per transformer layer with sequence parallelism; the recompute working set of one layer.
LAYER_WORKING_BYTES_PER_HIDDEN = 34
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ParallelLayout:
    world: int
    tensor_parallel: int
    pipeline_parallel: int
    context_parallel: int
    expert_parallel: int
    data_parallel: int
    first_stage_layers: int | None   # layers of the first pipeline stage when it takes fewer than the others
    optimizer_offload: bool
    memory_gib: dict[str, float]

    @property
    def expert_tensor_parallel(self) -> int:
        return 1

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["expert_tensor_parallel"] = 1
        return out


def routed_expert_parameters(config: ModelConfig) -> int:
    one_expert = 3 * config.hidden_size * config.moe_intermediate_size
    return len(config.moe_layers) * config.n_routed_experts * one_expert


def stage_split(layers: int, pp: int) -> tuple[int, int | None] | None:
    """``(layers a stage, first stage's layers or None when equal)``; None when ``pp`` stages cannot split them."""
    per = math.ceil(layers / pp)
    first = layers - (pp - 1) * per
    if first < 1:
        return None
    return per, (first if first != per else None)


def memory_gib(config: ModelConfig, seq_tokens: int, world: int, tp: int, cp: int, ep: int,
               optimizer_offload: bool, pp: int = 1) -> dict[str, float]:
    """Per-GPU memory by part (GiB) on the heaviest stage under the module's model."""
    counts = parameter_counts(config)
    experts = routed_expert_parameters(config)
    layers_dense = counts.total - experts - counts.embedding
    split = stage_split(config.num_hidden_layers, pp)
    per = split[0] if split is not None else math.ceil(config.num_hidden_layers / pp)
    share = per / config.num_hidden_layers
    dense_local = layers_dense * share / tp + counts.embedding / tp / min(pp, 2)
    expert_local = experts * share / ep
    dp, edp = world // (tp * pp * cp), world // (pp * ep)
    d = config.hidden_size
    tokens = seq_tokens / (cp * tp)
    parts = {
        "weights": 2 * (dense_local + expert_local),
        "gradients": 4 * (dense_local + expert_local),
        "optimizer": 0.0 if optimizer_offload else 12 * (dense_local / (dp * cp) + expert_local / edp),
        "activations": (tokens * recompute_checkpoint_bytes_per_token(config, per, bf16=True)
                        + tokens * LAYER_WORKING_BYTES_PER_HIDDEN * d
                        + tokens * config.num_experts_per_tok * (2 * d + 3 * config.moe_intermediate_size) * 2),
        "logits": seq_tokens / cp * config.vocab_size / tp * 6,
    }
    out = {k: round(v / GIB, 2) for k, v in parts.items()}
    out["reserve"] = RESERVE_GIB
    out["total"] = round(sum(parts.values()) / GIB + RESERVE_GIB, 2)
    return out


def _powers_of_two_dividing(n: int) -> list[int]:
    return [p for p in (1 << i for i in range(n.bit_length())) if n % p == 0]


def choose_layout(config: ModelConfig, seq_tokens: int, gpus: int, gpus_per_node: int, gpu_memory_gib: float,
                  max_context_parallel: int = 1) -> ParallelLayout:
    """The layout the module docstring describes, or a ConfigError saying how far the closest one is from fitting."""
    closest: tuple[float, int, int, int, int] | None = None
    for offload in (False, True):
        candidates = []
        for pp in _powers_of_two_dividing(gpus):
            split = stage_split(config.num_hidden_layers, pp)
            if split is None:
                continue
            ep = max(e for e in range(1, gpus // pp + 1) if (gpus // pp) % e == 0 and config.n_routed_experts % e == 0)
            for tp in TP_SIZES:
                if tp > min(gpus, gpus_per_node) or (gpus // pp) % tp:
                    continue
                for cp in _powers_of_two_dividing(gpus // (pp * tp)):
                    if cp > max_context_parallel:
                        continue
                    memory = memory_gib(config, seq_tokens, gpus, tp, cp, ep, offload, pp)
                    if memory["total"] <= gpu_memory_gib:
                        candidates.append((tp * pp * cp, pp, tp, cp, ep, split[1], memory))
                    elif closest is None or memory["total"] < closest[0]:
                        closest = (memory["total"], tp, pp, cp, ep)
        if candidates:
            _, pp, tp, cp, ep, first, memory = min(candidates, key=lambda c: c[:4])
            return ParallelLayout(world=gpus, tensor_parallel=tp, pipeline_parallel=pp, context_parallel=cp,
                                  expert_parallel=ep, data_parallel=gpus // (tp * pp * cp), first_stage_layers=first,
                                  optimizer_offload=offload, memory_gib=memory)
    need, tp, pp, cp, ep = closest if closest is not None else (float("inf"), 1, 1, 1, 1)
    raise ConfigError(
        f"by genolc's memory model a {format_length(seq_tokens)}-token window of this model does not fit on {gpus} "
        f"GPUs of {gpu_memory_gib:g} GiB; the closest layout (TP {tp}, PP {pp}, CP {cp}, EP {ep}, optimizer on CPU) "
        f"needs {need:.0f} GiB per GPU",
        where="--gpus/--gpu-memory",
        fix="use more GPUs, GPUs with more memory, a shorter --seq, or a checkpoint resized to the genome "
            "vocabulary (docs/scaling-out.md)")
