"""MoE routing diagnostics: how unevenly each MoE layer's router spreads tokens, and what a capacity would drop.

genolc's MoE is dropless (every token reaches its top-k experts), but a capacity-based dispatcher, or simply the
memory of the busiest device in expert parallelism, is not. These figures say what the real routing would cost:

* ``tokens_per_expert``: token slots (token, chosen expert) each expert received; a token counts once per chosen
  expert, so the counts of a layer add up to ``tokens * top_k``.
* ``busiest_over_mean``: the busiest expert's slots over the mean (1.0 = balanced, ``E / top_k`` at worst).
* ``router_entropy``: the mean over tokens of the entropy (nats) of the router's sigmoid scores normalised to sum to
  1 over the experts; ``log(E)`` is the most (a router that cannot tell experts apart), 0 the least.
* ``drop_share[c]``: the share of token slots a capacity factor ``c`` would drop (see :func:`drop_shares`).

Routing is captured without touching the model: a forward hook on each MoE layer's ``gate`` (the
:class:`~genolc.model.layers.moe.TopKRouter`, whose output holds ``expert_ids [N, K]`` and ``scores [N, E]``) feeds
a :class:`RoutingTally` per layer. Tokens are grouped into dispatch groups in the order the layer routes them: a
forward of ``[B, T]`` routes window after window, so a group of 64k tokens holds 16 windows of 4k or one of 64k.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

CAPACITY_FACTORS = (1.0, 1.25, 1.5, 2.0)
DEFAULT_GROUP_TOKENS = 64 * 1024
_GATE_NAME = re.compile(r"^(?:.*\.)?layers\.(\d+)\.mlp\.gate$")


def drop_shares(group_counts: np.ndarray, group_tokens: Sequence[int], top_k: int,
                factors: Sequence[float] = CAPACITY_FACTORS) -> dict[str, float]:
    """Share of token slots a capacity-based dispatcher would drop, per capacity factor.

    Each dispatch group ``g`` holds ``group_tokens[g]`` tokens (a fixed budget; only the last group of a run may
    hold fewer, and its capacity is then scaled to the tokens it holds, as a dispatcher given a shorter batch would).
    For capacity factor ``c`` every expert may take ``capacity = floor(c * group_tokens[g] * top_k / E)`` slots in
    group ``g``; an expert given ``n`` slots there drops ``max(0, n - capacity)`` of them (which ones does not change
    the count). The share is the dropped slots summed over groups and experts over all slots (``tokens * top_k``).

    Args:
        group_counts: ``[G, E]`` token slots per group and expert.
        group_tokens: tokens in each of the G groups.
        top_k: experts per token.
    Returns:
        ``{str(c): share}`` for each factor, shares in [0, 1].
    """
    counts = np.asarray(group_counts, dtype=np.int64)
    tokens = np.asarray(group_tokens, dtype=np.int64)
    if counts.ndim != 2 or counts.shape[0] != tokens.shape[0]:
        raise ValueError(f"group_counts must be [G, E] with one token count per group; got {counts.shape} and "
                         f"{tokens.shape[0]} groups")
    if (counts.sum(1) != tokens * top_k).any():
        raise ValueError("each group's slots must add up to its tokens * top_k")
    slots = int(tokens.sum()) * top_k
    n_experts = counts.shape[1]
    shares: dict[str, float] = {}
    for factor in factors:
        capacity = np.floor(factor * tokens * top_k / n_experts).astype(np.int64)
        dropped = np.clip(counts - capacity[:, None], 0, None).sum()
        shares[f"{factor:g}"] = float(dropped) / slots if slots else 0.0
    return shares


@dataclass
class RoutingTally:
    """One MoE layer's routing, accumulated call by call and cut into dispatch groups of ``group_tokens``.

    Counts and entropies are added up where the routing is (on the GPU in training) and read back only when a
    :meth:`summary` or :meth:`merge` needs them: after a training step, once per layer. Until 2026-12-04 every call
    read them back: the entropy's ``float``, CUDA ``bincount``'s read of the largest id and the counts' copy, three
    host syncs per MoE layer and chunk in the middle of the forward (216 in a `small` step at 512k, 624 in `base`'s),
    each draining the GPU's launch queue. The bare steps that the profiles time (benchmarks/profile_chunked_step.py)
    tally nothing, and `finetune`'s steps took 0.08-0.32 s longer than them at 512k.
    """

    n_experts: int
    top_k: int
    group_tokens: int = DEFAULT_GROUP_TOKENS
    groups: list[np.ndarray] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    entropy_sum: float = 0.0
    tokens: int = 0

    def __post_init__(self) -> None:
        self._open = np.zeros(self.n_experts, dtype=np.int64)       # the open group's counts read back so far
        self._open_tokens = 0
        self._open_pending: Any = None            # the open group's counts since the last read, where they were made
        self._closed_pending: list[tuple[np.ndarray, Any]] = []     # closed groups' (read part, unread part)
        self._entropy_pending: Any = None

    def add(self, expert_ids: Any, scores: Any) -> None:
        """Add N routed tokens: ``expert_ids [N, K]`` and ``scores [N, E]`` (torch tensors, any device)."""
        import torch

        with torch.no_grad():
            probs = scores.float() / (scores.float().sum(-1, keepdim=True) + 1e-20)
            entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(dtype=torch.float64)
            self._entropy_pending = entropy if self._entropy_pending is None else self._entropy_pending + entropy
            start, n = 0, expert_ids.shape[0]
            while start < n:
                take = min(n - start, self.group_tokens - self._open_tokens)
                piece = expert_ids[start:start + take].reshape(-1).long()
                # A scatter rather than bincount, whose CUDA kernel reads the largest id back to the host.
                counts = torch.zeros(self.n_experts, dtype=torch.int64, device=piece.device)
                counts.scatter_add_(0, piece, torch.ones_like(piece))
                self._open_pending = counts if self._open_pending is None else self._open_pending + counts
                self._open_tokens += take
                start += take
                if self._open_tokens == self.group_tokens:
                    self._close()
        self.tokens += n

    def merge(self, other: "RoutingTally") -> None:
        """Add another tally of the same layer (e.g. the next training step): groups never span the two, so each
        one's last, partial group stays a group of its own."""
        self._read_back()
        other._read_back()
        if self._open_tokens:
            self._close()
            self._read_back()
        self.groups.extend(other.groups)
        self.sizes.extend(other.sizes)
        if other._open_tokens:
            self.groups.append(other._open.copy())
            self.sizes.append(other._open_tokens)
        self.entropy_sum += other.entropy_sum
        self.tokens += other.tokens

    def _close(self) -> None:
        self._closed_pending.append((self._open, self._open_pending))
        self.sizes.append(self._open_tokens)
        self._open = np.zeros(self.n_experts, dtype=np.int64)
        self._open_pending = None
        self._open_tokens = 0

    def _read_back(self) -> None:
        """Bring the counts and entropies added since the last read to the host (after a training step, whose own
        synchronisation has already drained the GPU's queue)."""
        import torch

        unread = [part for _, part in self._closed_pending if part is not None]
        if self._open_pending is not None:
            unread.append(self._open_pending)
        values = iter(torch.stack(unread).cpu().numpy()) if unread else iter(())
        for read, part in self._closed_pending:
            self.groups.append(read + next(values) if part is not None else read)
        self._closed_pending = []
        if self._open_pending is not None:
            self._open = self._open + next(values)
            self._open_pending = None
        if self._entropy_pending is not None:
            self.entropy_sum += float(self._entropy_pending)
            self._entropy_pending = None

    def summary(self, factors: Sequence[float] = CAPACITY_FACTORS) -> dict[str, Any]:
        """The layer's figures (module docstring), the open last group counted at its own size."""
        self._read_back()
        groups, sizes = list(self.groups), list(self.sizes)
        if self._open_tokens:
            groups.append(self._open)
            sizes.append(self._open_tokens)
        if not groups:
            return {"tokens": 0}
        per_group = np.stack(groups)
        load = per_group.sum(0)
        mean = load.mean()
        return {"tokens": self.tokens, "groups": len(groups), "tokens_per_expert": load.tolist(),
                "busiest_over_mean": float(load.max() / mean) if mean else 0.0,
                "router_entropy": self.entropy_sum / self.tokens if self.tokens else 0.0,
                "max_entropy": math.log(self.n_experts),
                "drop_share": drop_shares(per_group, sizes, self.top_k, factors)}


def moe_gates(model: Any) -> dict[int, Any]:
    """Layer index -> that layer's MoE router module (found by its transformers-compatible name)."""
    found = {}
    for name, module in model.named_modules():
        match = _GATE_NAME.match(name)
        if match and hasattr(module, "num_experts") and hasattr(module, "top_k"):
            found[int(match.group(1))] = module
    return found


@contextlib.contextmanager
def capture_routing(model: Any, group_tokens: int = DEFAULT_GROUP_TOKENS, *,
                    training: bool = False) -> Iterator[dict[int, RoutingTally]]:
    """Tally every MoE layer's routing while the block runs: yields ``layer -> RoutingTally`` (empty without MoE).

    With ``training=True`` only forwards that build a graph count: a chunked step's no-grad fill pass and the
    replay of checkpointed layers (recompute) during backward route the same tokens again and are skipped.
    """
    import torch

    tallies: dict[int, RoutingTally] = {}
    handles = []

    def hook_for(layer: int):
        def record(module: Any, inputs: Any, routing: Any) -> None:
            if training and (not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1):
                return
            tallies[layer].add(routing.expert_ids.detach(), routing.scores.detach())
        return record

    for layer, gate in moe_gates(model).items():
        tallies[layer] = RoutingTally(int(gate.num_experts), int(gate.top_k), int(group_tokens))
        handles.append(gate.register_forward_hook(hook_for(layer)))
    try:
        yield tallies
    finally:
        for handle in handles:
            handle.remove()


def routing_summary(tallies: dict[int, RoutingTally]) -> dict[str, Any]:
    """``{layer: figures}`` (layer indices as strings, JSON keys) for layers that routed at least one token."""
    return {str(layer): tally.summary() for layer, tally in sorted(tallies.items()) if tally.tokens}


def flat_metrics(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A routing summary as metrics.jsonl keys: ``routing_<figure>`` -> ``{layer: value}``."""
    out: dict[str, dict[str, float]] = {"routing_busiest_over_mean": {}, "routing_entropy": {}}
    for layer, figures in summary.items():
        out["routing_busiest_over_mean"][layer] = figures["busiest_over_mean"]
        out["routing_entropy"][layer] = figures["router_entropy"]
        for factor, share in figures["drop_share"].items():
            out.setdefault(f"routing_drop_c{factor}", {})[layer] = share
    return out


def plot_load_heatmap(by_length: dict[str, dict[str, Any]], path: Any, title: str) -> None:
    """One seaborn heatmap per context length: MoE layer x expert, each expert's load over the layer's mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    lengths = list(by_length)
    n_layers = max((len(figures) for figures in by_length.values()), default=1)
    # A quarter inch per layer row keeps the layer labels apart (`base` has 40 MoE layers).
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.5 * len(lengths) + 1, max(3.5, 1.5 + 0.25 * n_layers)),
                             squeeze=False)
    top = max((max(l["tokens_per_expert"]) / np.mean(l["tokens_per_expert"])
               for figures in by_length.values() for l in figures.values()), default=2.0)
    for ax, length in zip(axes[0], lengths):
        layers = by_length[length]
        rows = [np.asarray(layers[k]["tokens_per_expert"], dtype=float) for k in layers]
        grid = np.stack([r / r.mean() for r in rows]) if rows else np.zeros((0, 0))
        sns.heatmap(grid, ax=ax, cmap="rocket_r", vmin=0, vmax=max(top, 1.0), yticklabels=list(layers),
                    cbar_kws={"label": "load / mean"})
        ax.tick_params(axis="y", labelrotation=0)
        ax.set_xlabel("expert")
        ax.set_ylabel("MoE layer")
        ax.set_title(length)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
