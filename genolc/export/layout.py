"""Parallel sizes for training a GLM-5.3-Flash-shaped model with Megatron-core, from a small memory model.

Bytes per GPU, for tensor-parallel size TP, context-parallel CP, expert-parallel EP (expert tensor parallel 1,
pipeline 1), data-parallel DP = world / (TP * CP), expert data-parallel EDP = world / EP, sequence S tokens:

- weights, bf16: 2 * (P_dense / TP + P_experts / EP), where P_experts are the routed experts' parameters and P_dense
  the rest (embeddings and LM head included: Megatron splits the vocabulary over TP);
- gradients, fp32: 4 * the same (SkyRL's Megatron DDP default ``grad_reduce_in_fp32: true``);
- optimizer, Megatron's distributed optimizer (fp32 master weights + Adam moments, 12 bytes a parameter), sharded over
  the data-parallel group: 12 * (P_dense / TP / (DP * CP) + P_experts / EP / EDP); 0 when the optimizer is offloaded
  to CPU (``optimizer_cpu_offload``);
- activations with full recompute (one checkpoint per layer): every layer's input, S / (CP * TP) tokens of hc_mult
  residual streams in bf16 (2 * hc_mult * hidden bytes a token), plus one layer's recompute working set,
  S / (CP * TP) tokens at 34 * hidden bytes (Korthikanti et al. 2022, with sequence parallelism) and the routed
  copies, num_experts_per_tok * (2 * hidden + 3 * moe_intermediate) * 2 bytes a token;
- logits: S / CP tokens * vocab / TP * 6 bytes (bf16 logits and their fp32 softmax gradient);
- a fixed reserve of 8 GiB (CUDA context, NCCL buffers, allocator fragmentation).

The search keeps TP within a node (TP <= GPUs per node), takes EP as large as divides both the expert count and the
world (experts then spread over data-parallel ranks at no cost to throughput), and picks the smallest TP * CP that
fits (most data parallelism), smaller TP first. Only if no layout fits does it offload the optimizer to CPU. The
model errs on the generous side; it is a starting point, and ``genolc plan`` measures genolc's own trainer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from genolc.errors import ConfigError
from genolc.model.config import ModelConfig
from genolc.model.presets import parameter_counts
from genolc.units import format_length

GIB = 1 << 30
RESERVE_GIB = 8.0
# Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022): 34 * s * h bytes of
# activations per transformer layer with sequence parallelism; the recompute working set of one layer.
LAYER_WORKING_BYTES_PER_HIDDEN = 34
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ParallelLayout:
    world: int
    tensor_parallel: int
    context_parallel: int
    expert_parallel: int
    data_parallel: int
    optimizer_offload: bool
    memory_gib: dict[str, float]

    @property
    def pipeline_parallel(self) -> int:
        return 1

    @property
    def expert_tensor_parallel(self) -> int:
        return 1

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(pipeline_parallel=1, expert_tensor_parallel=1)
        return out


def routed_expert_parameters(config: ModelConfig) -> int:
    one_expert = 3 * config.hidden_size * config.moe_intermediate_size
    return len(config.moe_layers) * config.n_routed_experts * one_expert


def memory_gib(config: ModelConfig, seq_tokens: int, world: int, tp: int, cp: int, ep: int,
               optimizer_offload: bool) -> dict[str, float]:
    """Per-GPU memory by part (GiB) under the module's model."""
    total = parameter_counts(config).total
    experts = routed_expert_parameters(config)
    dense = total - experts
    dp, edp = world // (tp * cp), world // ep
    local = dense / tp + experts / ep
    d = config.hidden_size
    tokens = seq_tokens / (cp * tp)
    parts = {
        "weights": 2 * local,
        "gradients": 4 * local,
        "optimizer": 0.0 if optimizer_offload else 12 * (dense / tp / (dp * cp) + experts / ep / edp),
        "activations": (config.num_hidden_layers * tokens * 2 * config.hc_mult * d
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


def choose_layout(config: ModelConfig, seq_tokens: int, gpus: int, gpus_per_node: int,
                  gpu_memory_gib: float) -> ParallelLayout:
    """The layout the module docstring describes, or a ConfigError saying how far the best one is from fitting."""
    eps = [e for e in range(1, gpus + 1) if gpus % e == 0 and config.n_routed_experts % e == 0]
    ep = max(eps)
    best: tuple[float, int, int] | None = None
    for offload in (False, True):
        candidates = []
        for tp in TP_SIZES:
            if tp > min(gpus, gpus_per_node) or gpus % tp:
                continue
            for cp in _powers_of_two_dividing(gpus // tp):
                memory = memory_gib(config, seq_tokens, gpus, tp, cp, ep, offload)
                if memory["total"] <= gpu_memory_gib:
                    candidates.append((tp * cp, tp, cp, memory))
                elif best is None or memory["total"] < best[0]:
                    best = (memory["total"], tp, cp)
        if candidates:
            _, tp, cp, memory = min(candidates, key=lambda c: (c[0], c[1]))
            return ParallelLayout(world=gpus, tensor_parallel=tp, context_parallel=cp, expert_parallel=ep,
                                  data_parallel=gpus // (tp * cp), optimizer_offload=offload, memory_gib=memory)
    need, tp, cp = best if best is not None else (float("inf"), 1, 1)
    raise ConfigError(
        f"by genolc's memory model a {format_length(seq_tokens)}-token window of this model does not fit on {gpus} "
        f"GPUs of {gpu_memory_gib:g} GiB; the closest layout (TP {tp}, CP {cp}, EP {ep}, optimizer on CPU) needs "
        f"{need:.0f} GiB per GPU",
        where="--gpus/--gpu-memory", fix="use more GPUs, GPUs with more memory, or a shorter --seq")
