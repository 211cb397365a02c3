"""Two CPU checks of the whole model behind tests/gpu/test_model_fast_path.py (run from the repository root):

    PYTHONPATH=. .venv/bin/python tests/gpu/model_composition_check.py precision [--length 2111]
    TRITON_INTERPRET=1 PYTHONPATH=. /tmp/tri/bin/python tests/gpu/model_composition_check.py compose [--length 600]

``precision``: the GPU test's model (same config, seed = T, ids in 4..7) on the pure-torch reference ops, under bf16
autocast (CPU autocast plus CUDA autocast's fp32 op list, ``CudaAutocastPolicy`` from
tests/model/test_fast_path_inputs.py, so the dtypes are CUDA's) and in fp32 without autocast. Prints the rel errors
of logits, loss and every parameter gradient for: bf16 vs fp32 each with its own discrete choices (and how often
the MoE routing and the indexer selection differ); bf16 vs fp32 with the fp32 run replaying the bf16 run's choices
(:class:`Decisions`); the ops computed exactly in fp32 under the same autocast vs fp32 (what a perfect kernel
would get); and two bf16 runs whose ops differ (the first GPU test's comparison). These numbers set the GPU test's
design and thresholds. About 3 minutes at T=2111 on 2 cores.

``compose``: the fast path's composition, simulated on CPU in fp32 and compared with the all-reference fp32 model:
the indexer's Triton scoring (``streamed_select``, int32 rows as the layer asks for on CUDA) and the fused DSA
kernels (``SparseLatentAttention`` after the fast op's own ``prepare_inputs``/``check_kernel_inputs``) run under
Triton's interpreter; KDA goes through ``SegmentedKDA`` (segments shorter than T) with the pure-torch kernel; MoE
through ``grouped_experts`` (``torch._grouped_mm`` runs on CPU) in chunks shorter than T. Everything should agree
to ~1e-4 (fp32 summation order only); exit status 1 otherwise. T must exceed index_topk (256) so the DSA layer
selects; 600 takes a few minutes under the interpreter.

Not part of the CI suite (pytest collects ``test_*.py`` only); ``compose`` needs Triton (see
tests/gpu/triton_interpreter_check.py for the throwaway venv). The GPU test imports ``model_config``,
:class:`Decisions` and :func:`selection_agreement` from here (pytest puts tests/gpu on sys.path).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

import genolc.model.layers.moe as moe_layer
from genolc.model import build_model
from genolc.model.layers.dsa import DSAAttention
from genolc.model.layers.kda import KimiDeltaAttention
from genolc.model.layers.moe import Routing, TopKRouter
from genolc.model.ops.dsa import reference as dsa_reference
from genolc.model.ops.indexer import layout as indexer_layout
from genolc.model.ops.indexer import reference as indexer_reference
from genolc.model.ops.kda import reference as kda_reference
from genolc.model.ops.moe import reference as moe_reference
from genolc.model.presets import _genome_preset

COMPOSE_TOLERANCE = 1e-4


def model_config():
    """tests/gpu/test_model_fast_path.py's config (keep the two equal)."""
    return _genome_preset(hidden=512, layers=4, kda_heads=12, kda_head_dim=128, mla_heads=4, q_lora=256, kv_lora=128,
                          qk_nope=128, v_dim=128, index_heads=4, index_head_dim=64, kpool=4, topk=256, experts=8,
                          experts_per_tok=2, moe_inter=256, dense_inter=1024, vocab_size=16)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(actual).all():
        return float("inf")
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


class Decisions:
    """Records the model's discrete choices (each MoE layer's experts, each DSA layer's index rows) in one run and
    replays them in another, so two runs that round differently still route and select alike. Replayed routing
    keeps the router's gradient: the weights are re-gathered from this run's own scores."""

    def __init__(self) -> None:
        self.expert_ids: list[torch.Tensor] = []
        self.rows: list[torch.Tensor] = []
        self.replay = False
        self._calls = {"router": 0, "select": 0}

    def start(self, *, replay: bool) -> None:
        self.replay = replay
        self._calls = {"router": 0, "select": 0}
        if not replay:
            self.expert_ids, self.rows = [], []

    def attach(self, model, select_op) -> None:
        for module in model.modules():
            if isinstance(module, TopKRouter):
                module.forward = self._router(module)
            if isinstance(module, DSAAttention):
                module.select_op = self._select(select_op)

    def _router(self, router: TopKRouter):
        def run(x):
            routing = TopKRouter.forward(router, x)
            call = self._calls["router"]
            self._calls["router"] += 1
            if not self.replay:
                self.expert_ids.append(routing.expert_ids.detach().clone())
                return routing
            expert_ids = self.expert_ids[call]
            weights = routing.scores.gather(1, expert_ids)
            if router.norm_topk_prob:
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
            return Routing(expert_ids=expert_ids, weights=weights * router.routed_scaling_factor,
                           scores=routing.scores)
        return run

    def _select(self, op):
        def run(*args, **kwargs):
            call = self._calls["select"]
            self._calls["select"] += 1
            if self.replay:
                return self.rows[call]
            rows = op(*args, **kwargs)
            self.rows.append(rows.detach().clone())
            return rows
        return run


def discrete_differences(recorded: Decisions, other: Decisions) -> list[str]:
    """How often two recorded runs chose different experts / index sets."""
    lines = []
    for layer, (ids_a, ids_b) in enumerate(zip(recorded.expert_ids, other.expert_ids)):
        same = (ids_a.sort(-1).values == ids_b.sort(-1).values).all(-1)
        lines.append(f"MoE call {layer}: tokens routed differently {1 - float(same.float().mean()):.4f}")
    for layer, (rows_a, rows_b) in enumerate(zip(recorded.rows, other.rows)):
        same = (rows_a.long().sort(-1).values == rows_b.long().sort(-1).values).all(-1)
        lines.append(f"DSA select call {layer}: rows with a different set {1 - float(same.float().mean()):.4f}")
    return lines


def selection_agreement(rows: torch.Tensor, expected: torch.Tensor, index_q: torch.Tensor,
                        head_weights: torch.Tensor, pooled: torch.Tensor, topk: int, kpool: int,
                        softmax_scale: float) -> tuple[float, float]:
    """``(share of index rows selecting the reference's set, worst score gap)``: the gap is the largest difference
    between the fp32 scores of the pools each side chose (both sorted), relative to the row's best score; inf when
    a row selects a different number of pools. Sets may differ only between (near-)tied pools, so the gap stays
    at rounding level for a correct selector however many rows differ."""
    rows, expected = rows.long(), expected.long()
    identical = (rows.sort(-1).values == expected.sort(-1).values).all(-1)
    with torch.autocast(index_q.device.type, enabled=False):
        index_q, head_weights, pooled = index_q.float(), head_weights.float(), pooled.float()
        batch_ids = torch.arange(pooled.shape[0], device=pooled.device)[:, None, None]
        scores = []
        for chosen in (rows, expected):
            pools = indexer_layout.selected_pools(chosen, topk, kpool)
            row_scores = indexer_reference.pool_scores(index_q, head_weights, pooled[batch_ids, pools.clamp_min(0)],
                                                       softmax_scale)
            scores.append(row_scores.masked_fill(pools < 0, float("-inf")).sort(-1, descending=True).values)
    finite = torch.isfinite(scores[1])
    if not torch.equal(finite, torch.isfinite(scores[0])):
        return float(identical.float().mean()), float("inf")
    top = scores[1][..., :1].abs().clamp_min(1e-30)
    gap = ((scores[0] - scores[1]).abs() / top).masked_fill(~finite, 0.0)
    return float(identical.float().mean()), float(gap.max())


def set_ops(model, *, kda_op, sparse_op, experts_op) -> None:
    for module in model.modules():
        if isinstance(module, KimiDeltaAttention):
            module.kda_op = kda_op
        if isinstance(module, DSAAttention):
            module.sparse_attention_op = sparse_op
    moe_layer.routed_experts = experts_op


def reference_select(*args, out_dtype=None, **kwargs):
    return indexer_reference.select_indices(*args, **kwargs)


def set_reference_ops(model) -> None:
    set_ops(model, kda_op=kda_reference.chunk_kda, sparse_op=dsa_reference.sparse_latent_attention,
            experts_op=moe_reference.routed_experts)


def set_exact_ops(model) -> None:
    """The reference ops as an exact kernel would compute them under autocast: inputs cast as the fast op's
    ``prepare_inputs`` casts them (bf16), the op itself in fp32 without autocast, the result in the fast op's dtype."""
    from genolc.model.ops.dsa import triton as dsa_triton
    from genolc.model.ops.kda import fla as kda_fla

    def kda_op(q, k, v, g, beta, scale=None, initial_state=None, **kwargs):
        q, k, v, g, beta, initial_state = kda_fla.prepare_inputs(q, k, v, g, beta, initial_state)
        with torch.autocast(q.device.type, enabled=False):
            out, state = kda_reference.chunk_kda(q.float(), k.float(), v.float(), g.float(), beta.float(),
                                                 scale=scale, initial_state=initial_state, **kwargs)
        return out.to(q.dtype), state

    def sparse_op(q_lat, latent, indices, softmax_scale, **kwargs):
        q_lat, latent, indices = dsa_triton.prepare_inputs(q_lat, latent, indices)
        with torch.autocast(q_lat.device.type, enabled=False):
            out = dsa_reference.sparse_latent_attention(q_lat.float(), latent.float(), indices, softmax_scale)
        return out.to(q_lat.dtype)

    set_ops(model, kda_op=kda_op, sparse_op=sparse_op, experts_op=moe_reference.routed_experts)


def loss_and_grads(model, ids, autocast: contextlib.AbstractContextManager):
    params = [p for p in model.parameters() if p.requires_grad]
    with autocast:
        logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return logits.float().detach(), loss.detach(), grads


def build(length: int):
    torch.manual_seed(length)
    model = build_model(model_config())
    ids = torch.randint(4, 8, (1, length + 1))
    return model, ids


def compare(run_a, run_b, names: list[str]) -> dict[str, float]:
    """Rel errors of run_a against run_b: logits, loss and every parameter gradient; printed worst first."""
    (logits_a, loss_a, grads_a), (logits_b, loss_b, grads_b) = run_a, run_b
    errors = {"logits": rel_err(logits_a, logits_b),
              "loss": abs(float(loss_a) - float(loss_b)) / abs(float(loss_b))}
    no_grad = []
    for name, mine, theirs in zip(names, grads_a, grads_b):
        if mine is None or theirs is None:
            no_grad.append(name)
            continue
        errors[name] = rel_err(mine, theirs)
    print(f"  loss {float(loss_a):.6f} vs {float(loss_b):.6f}; no gradient in either run: {len(no_grad)} "
          f"({', '.join(sorted({n.split('.')[-2] for n in no_grad}))})")
    width = max(len(n) for n in errors)
    for name, value in sorted(errors.items(), key=lambda item: -item[1]):
        print(f"  {name:<{width}} {value:.3e}")
    return errors


def cuda_autocast_policy():
    """tests/model/test_fast_path_inputs.py, for ``CudaAutocastPolicy`` (CUDA autocast's fp32 ops on CPU)."""
    path = Path(__file__).resolve().parents[1] / "model" / "test_fast_path_inputs.py"
    spec = importlib.util.spec_from_file_location("fast_path_inputs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def precision(length: int) -> int:
    policy = cuda_autocast_policy()
    # Checkpointed chunks (the DSA reference) recompute in backward, outside the torch-function mode.
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    def with_policy(function):
        def run(*args, **kwargs):
            with policy.CudaAutocastPolicy():
                return function(*args, **kwargs)
        return run
    dsa_reference.checkpoint = lambda fn, *a, **k: torch_checkpoint(with_policy(fn), *a, **k)

    def checkpoint_kda(model) -> None:
        # The KDA reference keeps [B, H, C, C, Dk] per chunk for backward (~8 GiB a layer at T=4096); recomputing
        # it in backward changes no number and keeps T=4096 within this machine's memory.
        for module in model.modules():
            if isinstance(module, KimiDeltaAttention):
                op = module.kda_op
                module.kda_op = lambda *args, _op=op, **kwargs: torch_checkpoint(
                    with_policy(functools.partial(_op, **kwargs)), *args, use_reentrant=False)

    model, ids = build(length)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    bf16_choices, free_choices = Decisions(), Decisions()
    runs = {}
    for label, choices, replay, autocast in (("bf16", bf16_choices, False, True),
                                             ("fp32 own choices", free_choices, False, False),
                                             ("fp32 bf16's choices", bf16_choices, True, False),
                                             ("bf16, fp32 ops", bf16_choices, True, True),
                                             ("bf16, fp32 ops, own choices", Decisions(), False, True)):
        if label.startswith("bf16, fp32 ops"):
            set_exact_ops(model)
        else:
            set_reference_ops(model)
        checkpoint_kda(model)
        choices.attach(model, reference_select)
        choices.start(replay=replay)
        context = contextlib.ExitStack()
        if autocast:
            context.enter_context(policy.CudaAutocastPolicy())
            context.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        start = time.time()
        runs[label] = loss_and_grads(model, ids, context)
        print(f"reference {label}: {time.time() - start:.1f}s")
    print(f"T={length}: reference under bf16 autocast vs reference in fp32, each with its own discrete choices")
    print("  " + "\n  ".join(discrete_differences(bf16_choices, free_choices)))
    compare(runs["bf16"], runs["fp32 own choices"], names)
    print(f"T={length}: the same, the fp32 run replaying the bf16 run's experts and index rows")
    compare(runs["bf16"], runs["fp32 bf16's choices"], names)
    print(f"T={length}: bf16 autocast with the ops computed in fp32 on the inputs the fast ops get (an exact kernel), "
          "vs fp32, same choices")
    compare(runs["bf16, fp32 ops"], runs["fp32 bf16's choices"], names)
    print(f"T={length}: the old GPU test's comparison, two bf16 runs whose ops differ (reference ops vs exact ops), "
          "each with its own discrete choices")
    compare(runs["bf16, fp32 ops, own choices"], runs["bf16"], names)
    return 0


def compose(length: int) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("compose needs TRITON_INTERPRET=1 (see this file's docstring)")
    from genolc.model.ops.dsa import triton as dsa_triton
    from genolc.model.ops.indexer import triton as indexer_triton
    from genolc.model.ops.kda import fla as kda_fla
    from genolc.model.ops.moe import grouped_mm as moe_grouped_mm

    segment_len = length // 3 + 5

    def fast_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, chunk_size=64, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                 lower_bound=None):
        # fast.chunk_kda after its CUDA check, with the reference kernel in place of fla's.
        q, k, v, g, beta, initial_state = kda_fla.prepare_inputs(q, k, v, g, beta, initial_state)
        gate = kda_fla.Gate(A_log, dt_bias, lower_bound) if use_gate_in_kernel else None
        kda_fla.check_kernel_inputs(q, k, v, g, beta, initial_state, gate)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return kda_fla.segmented_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
                                      use_qk_l2norm_in_kernel, segment_len, kernel=kda_fla.reference_segment_kernel, gate=gate)

    selections = []

    def fast_select(index_q, head_weights, pooled, *, kpool, topk, select_tail, softmax_scale, out_dtype=None):
        # fast.select_indices after its CUDA check; int32 rows as the layer requests on CUDA. The reference's
        # choice on the same inputs is kept to compare the two selections.
        kwargs = dict(kpool=kpool, topk=topk, select_tail=select_tail, softmax_scale=softmax_scale)
        indexer_reference.check_selection_inputs(index_q, head_weights, pooled, kpool=kpool, topk=topk)
        rows = indexer_triton.streamed_select(index_q, head_weights, pooled, query_chunk=None, out_dtype=torch.int32,
                                            **kwargs)
        selections.append(selection_agreement(rows, indexer_reference.select_indices(
            index_q, head_weights, pooled, **kwargs), index_q, head_weights, pooled, topk, kpool, softmax_scale))
        return rows

    def fast_sparse(q_lat, latent, indices, softmax_scale, **unused):
        q_lat, latent, indices = dsa_triton.prepare_inputs(q_lat, latent, indices)
        dsa_triton.check_kernel_inputs(q_lat, latent, indices)
        return dsa_triton.SparseLatentAttention.apply(q_lat, latent, indices, softmax_scale)

    def fast_experts(x, expert_ids, weights, gate_up_proj, down_proj, swiglu_limit):
        return moe_grouped_mm.grouped_experts(x, expert_ids, weights, gate_up_proj, down_proj, swiglu_limit,
                                        chunk_tokens=length // 2 + 3)

    model, ids = build(length)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    fast_choices, reference_choices = Decisions(), Decisions()
    runs = {}
    for label in ("fast", "reference", "reference, fast choices"):
        if label == "fast":
            set_ops(model, kda_op=fast_kda, sparse_op=fast_sparse, experts_op=fast_experts)
            fast_choices.attach(model, fast_select)
            fast_choices.start(replay=False)
        else:
            set_reference_ops(model)
            choices = reference_choices if label == "reference" else fast_choices
            choices.attach(model, reference_select)
            choices.start(replay=label != "reference")
        start = time.time()
        runs[label] = loss_and_grads(model, ids, contextlib.nullcontext())
        print(f"{label} fp32: {time.time() - start:.1f}s")
    rows = fast_choices.rows[0]
    print(f"fast rows: {rows.dtype} {tuple(rows.shape)}")
    assert rows.dtype == torch.int32 and rows.shape[-1] == 259, "the DSA layer did not select with int32 rows"
    print("fast selection vs the reference's on the same inputs: identical rows {:.4f}, worst score gap "
          "{:.2e}".format(*selections[0]))
    print(f"T={length}: simulated fast path (fp32) vs reference (fp32), each with its own discrete choices")
    print("  " + "\n  ".join(discrete_differences(fast_choices, reference_choices)))
    compare(runs["fast"], runs["reference"], names)
    print(f"T={length}: the same, the reference replaying the fast run's experts and index rows")
    errors = compare(runs["fast"], runs["reference, fast choices"], names)
    bad = {name: value for name, value in errors.items() if not value < COMPOSE_TOLERANCE}
    print("all within" if not bad else f"{len(bad)} above", COMPOSE_TOLERANCE)
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("precision", "compose"))
    parser.add_argument("--length", type=int, default=None, help="T (default 2111 precision, 600 compose)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    if args.mode == "precision":
        return precision(args.length or 2111)
    return compose(args.length or 600)


if __name__ == "__main__":
    sys.exit(main())
