"""Memory estimate and the option suggested on out-of-memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genolc.model.presets import parameter_counts, preset
from genolc.units import parse_length
from genolc.train.plan import (EXPERT_CHUNK_TOKENS, GIB, PLAN_MARGIN, activation_bytes_per_token,
                               estimate_chunked_memory, estimate_context_parallel_memory, estimate_memory,
                               estimate_step_seconds, fast_activation_bytes_per_token, fitting_context_parallel,
                               fitting_option, kda_intermediates_device_bytes, kept_attention_bytes,
                               largest_fitting_context_parallel_chunk, oom_error, required_seq_multiple,
                               routed_expert_bytes_per_token)


def test_memory_components_add_up_and_scale():
    cfg = preset("small")
    p = estimate_memory(cfg, seq_len=4096)
    assert p.parameters == parameter_counts(cfg).total
    # fp32 master weights and, under bf16 autocast (the default), the bf16 copies its matmuls save for backward
    assert p.weights == 6 * p.parameters and p.optimizer == 8 * p.parameters
    assert estimate_memory(cfg, seq_len=4096, bf16=False).weights == 4 * p.parameters
    assert p.total == int((p.weights + p.gradients + p.optimizer + p.activations + p.logits) * 1.10)
    double = estimate_memory(cfg, seq_len=8192)
    assert 1.9 < double.activations / p.activations < 2.2       # ~linear in T (sparse attention, pooled indexer)
    rc = estimate_memory(cfg, seq_len=8192, recompute=True)
    assert rc.activations < double.activations / 3
    assert set(p.per_token_per_layer) == {"linear_attention", "indexed_attention"}


def test_fitting_option_names_something_that_fits():
    cfg = preset("small")
    budget = 140 * GIB
    big = estimate_memory(cfg, seq_len=4 * 1024 * 1024, windows=2)
    assert big.total > budget
    option = fitting_option(cfg, seq_len=4 * 1024 * 1024, micro_batch=2, grad_accum=1, recompute=False, bf16=True,
                            budget_bytes=budget)
    assert option is not None and option.startswith("--")
    err = oom_error(cfg, seq_len=4 * 1024 * 1024, micro_batch=2, grad_accum=1, recompute=False, bf16=True,
                    budget_bytes=budget, where="step 1")
    assert "estimated" in err.message and option in err.message


def test_a_shorter_window_is_offered_at_the_longest_length_the_chunked_step_fits():
    """base at 8M fits no chunk on an H200; at 4M the chunked step with recompute does (genolc plan), so the advice
    is 4M (whole windows with recompute fit only up to 128k) and context parallelism for the asked length."""
    cfg = preset("base")
    budget = int(139.8 * GIB)
    assert fitting_option(cfg, seq_len=8 << 20, micro_batch=1, grad_accum=1, recompute=False, bf16=True,
                          budget_bytes=budget, fast_kernels=True, chunk_multiple=64) == "--seq 4M --recompute"
    err = oom_error(cfg, seq_len=8 << 20, micro_batch=1, grad_accum=1, recompute=False, bf16=True,
                    budget_bytes=budget, where="plan", fast_kernels=True, chunk_multiple=64)
    assert "try --seq 4M --recompute (estimated to fit)" in err.message
    assert "split each window over 128 GPUs with --cp 128 --recompute" in err.message
    # --chunk off: only a window that fits whole is offered in place of 8M.
    err = oom_error(cfg, seq_len=8 << 20, micro_batch=1, grad_accum=1, recompute=False, bf16=True,
                    budget_bytes=budget, where="plan", fast_kernels=True, chunk_multiple=64, whole_only=True)
    assert "try --seq 128k --recompute (estimated to fit)" in err.message
    # A run that fixed its chunk length keeps it: only whole-window lengths are offered then.
    assert fitting_option(cfg, seq_len=8 << 20, micro_batch=1, grad_accum=1, recompute=True, bf16=True,
                          budget_bytes=budget, fast_kernels=True, chunk=8 << 20) == "--seq 128k"


def test_context_parallel_advice_is_the_fewest_ranks_that_fit():
    """The --cp an out-of-memory message names is the smallest power of two at which each rank is estimated to fit
    (what genolc plan --cp checks): half as many ranks do not, whole or in any chunk."""
    cfg = preset("base")
    budget = int(139.8 * GIB)
    args = dict(seq_len=8 << 20, windows=1, bf16=True, budget_bytes=budget, fast_kernels=True)
    cp, option = fitting_context_parallel(cfg, chunk_multiple=64, **args)
    assert (cp, option) == (128, "--cp 128 --recompute")
    fit = {k: v for k, v in args.items() if k != "budget_bytes"}
    assert estimate_context_parallel_memory(cfg, cp=cp, recompute=True, **fit).total <= budget
    for rc in (False, True):
        assert estimate_context_parallel_memory(cfg, cp=cp // 2, recompute=rc, **fit).total > budget
        assert largest_fitting_context_parallel_chunk(cfg, cp=cp // 2, recompute=rc, multiple=64, smallest=64,
                                                      **args) is None
    assert fitting_context_parallel(cfg, chunk_multiple=64, **{**args, "budget_bytes": 8 * GIB}) is None


def test_option_order_and_nothing_fits():
    cfg = preset("small")
    # batch split first when it suffices
    one = estimate_memory(cfg, seq_len=65536, windows=1).total
    opt = fitting_option(cfg, seq_len=65536, micro_batch=4, grad_accum=1, recompute=False, bf16=True,
                         budget_bytes=one + 1)
    assert opt == "--micro-batch 1 --grad-accum 4"
    assert fitting_option(cfg, seq_len=1024, micro_batch=1, grad_accum=1, recompute=True, bf16=True,
                          budget_bytes=GIB) is None     # the optimizer state alone exceeds 1 GiB


def test_time_and_multiple():
    cfg = preset("small")
    assert estimate_step_seconds(cfg, seq_len=1 << 19, tokens_per_step=1 << 19) > 0
    assert required_seq_multiple("cpu") == 1 and required_seq_multiple("cuda") == 64


def test_activation_estimate_matches_what_autograd_saves_on_the_tiny_model():
    import torch

    from genolc.model.model import build_model

    cfg = preset("tiny")
    model = build_model(cfg)
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_storages:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    seq = 128
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.randint(0, 16, (1, seq)))
    finally:
        torch.set_num_threads(threads)
    measured = sum(saved.values()) / seq
    estimated = sum(activation_bytes_per_token(cfg, seq, bf16=False))
    assert 0.8 < estimated / measured < 1.2, (estimated, measured)


def _fast_path_saved_bytes_per_token(cfg, seq: int, fp32_streams: bool) -> list[float]:
    """Bytes autograd saves per token in each decoder layer under bf16 autocast as on CUDA: the fast ops' autograd
    Functions (SegmentedKDA, SparseLatentAttention, the grouped experts, whole below 64k tokens) around CPU stand-ins,
    mHC's fused-kernel ops, and bf16 residual streams unless ``fp32_streams``: what is saved depends on the Functions
    and ops, not on the kernels inside them."""
    import torch

    import genolc.model.layers.moe as moe_layer
    from genolc.model.model import build_model
    from genolc.model.ops.moe import grouped_mm as moe_grouped_mm
    from genolc.train.apply import apply_stream_dtype
    from tensor_memory import (grouped_mm_saving_as_on_cuda, saved_bytes_per_module, use_cuda_mhc_ops,
                               use_fast_kernel_stand_ins)

    torch.manual_seed(0)
    model = build_model(cfg)
    use_fast_kernel_stand_ins(model)
    use_cuda_mhc_ops(model)
    if not fp32_streams:
        apply_stream_dtype(model, torch.bfloat16)
    original_experts = moe_layer.routed_experts
    # The grouped-GEMM path CUDA takes (the CPU dispatch runs the per-expert loop): whole up to one expert chunk.
    moe_layer.routed_experts = moe_grouped_mm.grouped_experts
    try:
        with grouped_mm_saving_as_on_cuda():
            per_layer = saved_bytes_per_module(model, model.layers,
                                               lambda: model(torch.randint(0, cfg.vocab_size, (1, seq))), bf16=True)
    finally:
        moe_layer.routed_experts = original_experts
    return [saved / seq for saved in per_layer]


@pytest.mark.parametrize("fp32_streams", [False, True], ids=["bf16-streams", "fp32-streams"])
@pytest.mark.parametrize("dims", [{}, {"hidden_size": 96, "hc_mult": 2, "linear_num_heads": 6, "num_attention_heads": 4,
                                        "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 3}],
                         ids=["tiny", "reshaped"])
def test_fast_path_activation_estimate_matches_what_autograd_saves(fp32_streams, dims):
    cfg = preset("tiny").replace(num_hidden_layers=3,
                                 layer_types=("linear_attention", "indexed_attention", "linear_attention"),
                                 mlp_layer_types=("sparse", "sparse", "dense"), indexer_types=("full", "full", "full"),
                                 **dims)
    short, long = 256, 384                                  # both above index_topk: the sparse DSA path
    # Per-token growth between two lengths: per-layer constants (bf16 copies of the expert weights) cancel.
    measured = [(b * long - a * short) / (long - short)
                for a, b in zip(_fast_path_saved_bytes_per_token(cfg, short, fp32_streams),
                                _fast_path_saved_bytes_per_token(cfg, long, fp32_streams))]
    estimated = fast_activation_bytes_per_token(cfg, long, fp32_streams=fp32_streams)
    # Exact with bf16 streams; with fp32 ones the last layer's merge keeps less than the table's (never more).
    low, high = (1.0, 1.03) if fp32_streams else (0.999, 1.001)
    for layer, (mine, actual) in enumerate(zip(estimated, measured)):
        assert low <= mine / actual < high, (layer, mine, actual)
    assert sum(estimated) < sum(activation_bytes_per_token(cfg, long))


def test_routed_experts_are_counted_whole_up_to_one_expert_chunk():
    """grouped_experts keeps its routed experts' values for a forward of at most 64k tokens (windows x window) and
    checkpoints them per 64k above that: the plan counts them in every MoE layer, then one chunk's recompute."""
    cfg = preset("small")
    routed = routed_expert_bytes_per_token(cfg)
    two = fast_activation_bytes_per_token(cfg, 32 * 1024, windows=2)        # 64k tokens: saved
    three = fast_activation_bytes_per_token(cfg, 32 * 1024, windows=3)      # 96k: checkpointed
    for mlp, whole, checkpointed in zip(cfg.mlp_layer_types, two, three):
        assert whole - checkpointed == (routed if mlp == "sparse" else 0)
    one_chunk = EXPERT_CHUNK_TOKENS * routed
    tokens = 96 * 1024
    plan = estimate_memory(cfg, seq_len=32 * 1024, windows=3, fast_kernels=True)
    assert plan.activations == tokens * sum(three) + one_chunk
    # The fp32 per-expert loop (CUDA without autocast) never checkpoints.
    assert fast_activation_bytes_per_token(cfg, 32 * 1024, bf16=False, windows=3) == \
        fast_activation_bytes_per_token(cfg, 32 * 1024, bf16=False, windows=2)


def test_recompute_keeps_each_layers_streams_at_their_width():
    """Per-layer recompute keeps every layer's input streams: 2 bytes a value with bf16 streams, 4 with fp32 ones;
    the fast path adds the largest layer twice (its saved values and its backward's)."""
    cfg = preset("base")
    seq = 16 * 1024
    plans = {fp32: estimate_memory(cfg, seq_len=seq, recompute=True, fast_kernels=True, fp32_streams=fp32)
             for fp32 in (False, True)}
    widest = {fp32: max(fast_activation_bytes_per_token(cfg, seq, fp32_streams=fp32)) for fp32 in (False, True)}
    streams = cfg.num_hidden_layers * cfg.hc_mult * cfg.hidden_size
    wider = 2 * streams + 2 * (widest[True] - widest[False])
    assert plans[True].activations - plans[False].activations == seq * wider


def _kept_on_device(model: str, chunk: int, chunks: int = 1) -> int:
    """What a chunked step that keeps its DSA forwards plans on the device beside its chunk: one chunk's forwards (two
    under per-layer recompute)."""
    return int(chunks * kept_attention_bytes(preset(model), chunk) * PLAN_MARGIN)


def _kda_kept_on_device(model: str, chunk: int, recompute: bool = False) -> int:
    """What a chunked step that keeps fla's KDA intermediates plans on the device beside its chunk."""
    return int(kda_intermediates_device_bytes(preset(model), chunk=chunk, recompute=recompute) * PLAN_MARGIN)


def test_plan_command_plans_the_stream_dtype_asked_for():
    from click.testing import CliRunner

    from genolc.cli import main

    fp32 = CliRunner().invoke(main, ["plan", "--model", "base", "--seq", "1M", "--stream-dtype", "float32"])
    planned = (estimate_chunked_memory(preset("base"), seq_len=1 << 20, chunk=16 * 1024, fast_kernels=True,
                                       fp32_streams=True).total + _kept_on_device("base", 16 * 1024)
               + _kda_kept_on_device("base", 16 * 1024)) / GIB
    assert fp32.exit_code == 0 and "(bf16, fp32 streams, fast kernels)" in fp32.output, fp32.output
    assert f"--seq 1M: chunked step, --chunk 16k, estimated peak {planned:.1f} GiB" in fp32.output, fp32.output
    refused = CliRunner().invoke(main, ["plan", "--seq", "64k", "--device", "cpu", "--stream-dtype", "bfloat16"])
    assert refused.exit_code == 2 and refused.output.count("genolc: error:") == 1, refused.output
    assert "--stream-dtype bfloat16 needs bf16 autocast, but --device cpu plans the fp32 reference path" \
        in refused.output and "--device cuda" in refused.output


def test_oom_advice_on_cuda_uses_the_fast_path_table():
    cfg = preset("small")
    seq = 512 * 1024
    fast = estimate_memory(cfg, seq_len=seq, recompute=True, fast_kernels=True)
    reference = estimate_memory(cfg, seq_len=seq, recompute=True)
    assert fast.total < reference.total
    err = oom_error(cfg, seq_len=2 * seq, micro_batch=1, grad_accum=1, recompute=False, bf16=True,
                    budget_bytes=140 * GIB, where="step 1", fast_kernels=True)
    assert f"{estimate_memory(cfg, seq_len=2 * seq, fast_kernels=True).gib():.1f} GiB" in err.message


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _h200_chunked_rows(recompute: bool) -> list[dict]:
    """The chunked `genolc finetune` steps measured on the H200 (benchmarks/results/long_context_2026-11-30.json)."""
    record = json.loads((RESULTS / "long_context_2026-11-30.json").read_text())
    return [row for call in record["device_calls"] for row in call["rows"]
            if row.get("ok") and row.get("strategy") == "chunked" and row.get("recompute", False) == recompute
            and "superseded_by" not in row]


def _adamw_state_gib(model: str) -> float:
    return 8 * parameter_counts(preset(model)).total / GIB


def _steady_peak_gib(row: dict) -> float:
    """A run's peak once AdamW's state exists: a one-step run's peak lacks it (the optimizer allocates its 8 bytes
    per parameter at the end of the first step, after that step's peak), so it is added."""
    if len(row["step_seconds"]) >= 2:
        return row["peak_gpu_gib"]
    return row["peak_gpu_gib"] + _adamw_state_gib(row["model"])


def test_a_first_step_peak_plus_adamw_state_is_the_second_steps_peak():
    """`base` at 1M in 32k chunks with recompute on one H200: the first step's peak (2026-11-30) plus AdamW's state
    is the peak the same run reached in its second step (the one-GPU run of 2026-12-01's context-parallel benchmark).
    A check of the premise _steady_peak_gib rests on, in the records; only parameter_counts is code here."""
    first = next(row for row in _h200_chunked_rows(recompute=True) if row["model"] == "base" and row["seq"] == "1M")
    assert len(first["step_seconds"]) == 1
    record = json.loads((RESULTS / "context_parallel_2026-12-01_base.json").read_text())
    second = record["rows"][0]["one_gpu"]
    assert second["chunk"] == first["chunk"] and "recompute(16 layers" in second["transforms"][0]
    assert len(second["step_seconds"]) == 2
    assert _steady_peak_gib(first) == pytest.approx(second["peak_gpu_gib"], abs=0.1)


def _current_h200_peaks() -> list[dict]:
    """The chunked steps measured on the H200 with what the plan's fast-path table counts (bf16 streams, the fused
    mHC mixing and comb ops: 282dc94 and later; compiled, one eager, one with recompute), each with its steady-state
    peak: `finetune`'s (AdamW's state in) or profile_chunked_step.py's bare step plus AdamW's state."""
    rows = []
    for summary_path in sorted((RESULTS / "finetune_512k_2026-12-02_s18").glob("*/summary.json")):
        summary = json.loads(summary_path.read_text())
        last_step = json.loads((summary_path.parent / "metrics.jsonl").read_text().splitlines()[-1])
        rows.append(dict(model=summary["config"]["model"], seq_len=summary["config"]["seq_len"],
                         chunk=last_step["chunk"], recompute=summary["config"]["recompute"],
                         steady_gib=summary["peak_memory_gib"], source=str(summary_path.relative_to(RESULTS))))
    # `finetune --compile off` (eager): the second step's peak, the run's largest (the third was cut by its time limit).
    eager = RESULTS / "plan_peaks_2026-12-03" / "finetune_curve_base_512k_eager"
    steps = [json.loads(line) for line in (eager / "metrics.jsonl").read_text().splitlines()]
    rows.append(dict(model="base", seq_len=steps[-1]["seq_len"], chunk=steps[-1]["chunk"], recompute=False,
                     steady_gib=max(step["memory_gib"] for step in steps[1:]), source=str(eager.relative_to(RESULTS))))
    bare = sorted((RESULTS / "chunk_length_bf16_streams_2026-12-02").glob("*_282dc94.json"))
    bare += sorted((RESULTS / "plan_peaks_2026-12-03").glob("*.json"))
    for record_path in bare:
        record = json.loads(record_path.read_text())
        for step in record["steps"]:
            if step["phase"] != "timed" or "peak_gpu_gib" not in step:
                continue
            steady = step["peak_gpu_gib"] + _adamw_state_gib(record["model"])
            rows.append(dict(model=record["model"], seq_len=parse_length(step["seq"]),
                             chunk=parse_length(step["chunk"]), recompute=record["recompute"], steady_gib=steady,
                             source=str(record_path.relative_to(RESULTS))))
    return rows


def test_chunked_plan_above_the_h200_peaks_of_the_current_kernels():
    """The chunked step's estimate (the pools kept, as the step keeps them where they fit) against the steady-state
    peaks measured on the H200. Never below: a plan under a real peak sends a run into the out-of-memory error it
    exists to prevent. At most 22 % above (1.14-1.18 compiled, 3-7 % before the 10 % margin, where the compiled step
    keeps less than the eager autograd the table was measured with). These peaks were measured before the router
    read its bf16 input as it is, so they hold 2 d bytes a token per MoE layer more than today's step, which the
    plan no longer counts (at measurement time 1.15-1.19, 4-9 %). The margin is not spare room: the eager `base`
    run at 512k in 32k chunks peaks 1.5 % under today's plan and 8 % over it before the margin, the recomputed
    `base` at 1M 7.1 % under and 2 % over."""
    rows = _current_h200_peaks()
    assert {(row["model"], row["chunk"]) for row in rows} >= {("small", 32 * 1024), ("small", 64 * 1024),
                                                              ("base", 16 * 1024), ("base", 32 * 1024)}
    assert any(row["recompute"] for row in rows) and any("eager" in row["source"] for row in rows)
    for row in rows:
        planned = estimate_chunked_memory(preset(row["model"]), seq_len=row["seq_len"], chunk=row["chunk"],
                                          recompute=row["recompute"], fast_kernels=True).gib()
        assert 1.0 <= planned / row["steady_gib"] <= 1.22, (row, planned)


# `genolc finetune` runs on one H200 with every default whose steps the step-time estimate is held to (the
# utilisations of genolc/train/measured.py were fitted to the first and the third; each folder's README or
# record.json gives its command).
CURRENT_FINETUNE_RUNS = [("base", "finetune_sync_slab_2026-12-04/finetune_curve_base_512k_new"),
                         ("base", "finetune_sync_slab_2026-12-04/finetune_curve_base_512k_expandable"),
                         ("small", "finetune_sync_slab_2026-12-04/finetune_curve_small_512k_cold")]


def test_step_time_estimate_within_10_percent_of_the_current_h200_finetune_steps():
    """estimate_step_seconds at the measured utilisation of each preset (genolc/train/measured.py) against the steps
    after the first (which compiles) of today's `finetune` runs at 512k: a chunked step that keeps its pools."""
    from genolc.train.measured import measured_utilisation

    for model, run in CURRENT_FINETUNE_RUNS:
        rows = [json.loads(line) for line in (RESULTS / run / "metrics.jsonl").read_text().splitlines()]
        steps = sorted(row["step_seconds"] for row in rows if row["step"] > 1)
        assert rows[0]["step_strategy"] == "chunked" and len(steps) >= 2, run
        config = preset(model)
        tokens = rows[0]["seq_len"] * rows[0]["windows_per_micro"]
        predicted = estimate_step_seconds(config, seq_len=rows[0]["seq_len"], tokens_per_step=tokens,
                                          mfu=measured_utilisation(config), forwards=2, indexer_passes=1)
        assert abs(predicted / steps[len(steps) // 2] - 1) <= 0.10, (run, predicted, steps)


def test_step_time_estimate_within_10_percent_of_base_at_1m():
    """The same estimate at twice the length it was fitted at: `base`'s bare chunked step at 1M (16k chunks, no
    optimizer step) as the strategy runs it there (KDA's intermediates kept), the last of four (the first compiles
    the later chunks' variants)."""
    from genolc.train.measured import measured_utilisation

    record = json.loads((RESULTS / "kda_intermediates_2026-12-03" / "base_1M_16k_e825408.json").read_text())
    timed = [row for row in record["steps"] if row["phase"] == "timed"]
    assert record["model"] == "base" and [row["seq"] for row in timed] == ["1M"] * 4
    assert timed[-1]["kda_intermediates"] == "keep"
    config = preset("base")
    predicted = estimate_step_seconds(config, seq_len=1 << 20, tokens_per_step=1 << 20,
                                      mfu=measured_utilisation(config), forwards=2, indexer_passes=1)
    assert abs(predicted / timed[-1]["seconds"] - 1) <= 0.10, (predicted, timed[-1]["seconds"])


def test_measured_utilisation_interpolates_between_the_measured_presets():
    from genolc.train.measured import MEASURED_UTILISATION, measured_utilisation

    values = {name: value for name, _, value in MEASURED_UTILISATION}
    for name, active, _ in MEASURED_UTILISATION:
        counts = parameter_counts(preset(name))
        assert active == counts.active - counts.embedding, name
    assert measured_utilisation(preset("small", vocab_size=32000)) == pytest.approx(values["small"])
    assert measured_utilisation(preset("small")) == pytest.approx(values["small"])
    assert measured_utilisation(preset("base")) == pytest.approx(values["base"])
    assert measured_utilisation(preset("tiny")) == pytest.approx(values["small"])
    assert measured_utilisation(preset("glm-5.3-flash")) == pytest.approx(values["base"])
    narrower = preset("base").replace(moe_intermediate_size=384)       # active parameters between the two
    assert values["small"] < measured_utilisation(narrower) < values["base"]


def test_plan_command_says_what_finetune_would_choose():
    from click.testing import CliRunner

    from genolc.cli import main

    result = CliRunner().invoke(main, ["plan", "--model", "base", "--seq", "1M", "--chunk", "8k"])
    assert result.exit_code == 0, result.output
    planned = (estimate_chunked_memory(preset("base"), seq_len=1 << 20, chunk=8192, fast_kernels=True).total
               + _kept_on_device("base", 8192) + _kda_kept_on_device("base", 8192)) / GIB
    assert f"--seq 1M: chunked step, --chunk 8k, estimated peak {planned:.1f} GiB" in result.output
    kept = kept_attention_bytes(preset("base"), 1 << 20)
    assert f"the first pass's DSA forwards wait in host memory for the second ({kept / GIB:.1f} GiB)" in result.output
    assert "peak host memory" in result.output and "step time" in result.output
    result = CliRunner().invoke(main, ["plan", "--model", "base", "--seq", "1M", "--chunk", "off"])
    assert result.exit_code == 0 and "does not fit" in result.output, result.output
    # 16k chunks fit without recompute, with the pools kept as measured at 512k: no recompute is suggested.
    assert "try --chunk 16k (estimated to fit)." in result.output, result.output
    result = CliRunner().invoke(main, ["plan", "--model", "base", "--seq", "512k", "--chunk", "off"])
    assert "try --chunk 32k (estimated to fit)." in result.output, result.output
    # At 4M the pools kept from the first pass (24 GiB in `small`) leave room for 32k chunks without recompute;
    # at 8M (48 GiB of them) only a step that chooses them again fits 32k chunks.
    result = CliRunner().invoke(main, ["plan", "--model", "small", "--seq", "4M"])
    assert "--seq 4M: chunked step, --chunk 32k, estimated" in result.output, result.output
    assert "chosen again" not in result.output
    result = CliRunner().invoke(main, ["plan", "--model", "small", "--seq", "8M"])
    planned = estimate_chunked_memory(preset("small"), seq_len=8 << 20, chunk=32768, fast_kernels=True,
                                      keep_selections=False).gib()
    assert f"--seq 8M: chunked step, --chunk 32k, estimated peak {planned:.1f} GiB" in result.output, result.output
    assert "the DSA pools are chosen again in the second pass" in result.output, result.output
    result = CliRunner().invoke(main, ["plan", "--model", "small", "--seq", "64k", "--device", "cpu",
                                       "--gpu-memory", "20"])
    assert "--seq 64k: chunked step, --chunk 1k, estimated" in result.output, result.output
    assert "step time: estimated only for the H200" in result.output, result.output


def test_plan_step_time_line_gives_the_trainers_mfu_at_the_measured_utilisation():
    from click.testing import CliRunner

    from genolc.cli import main
    from genolc.train.flops import token_flops
    from genolc.train.measured import measured_utilisation

    config = preset("base")
    seconds = estimate_step_seconds(config, seq_len=1 << 19, tokens_per_step=1 << 19,
                                    mfu=measured_utilisation(config), forwards=2, indexer_passes=1)
    mfu = token_flops(config, 1 << 19).model * (1 << 19) / seconds / 989e12
    result = CliRunner().invoke(main, ["plan", "--model", "base", "--seq", "512k"])
    assert result.exit_code == 0, result.output
    assert (f"step time {seconds:.0f} s ({(1 << 19) / seconds:,.0f} tokens/s, MFU {mfu:.1%}) at "
            f"{measured_utilisation(config):.1%} utilisation") in result.output, result.output
    result = CliRunner().invoke(main, ["plan", "--model", "base", "--seq", "512k", "--mfu", "0.3"])
    assert "at 30.0% utilisation" in result.output, result.output


def test_a_chunk_covering_a_window_that_does_not_fit_is_refused():
    """--chunk at least --seq means the whole window, which must fit like --chunk off (it once ran and hit the OOM)."""
    from click.testing import CliRunner

    from genolc.cli import main

    result = CliRunner().invoke(main, ["plan", "--model", "small", "--seq", "256k", "--chunk", "256k"])
    assert result.exit_code == 0 and "does not fit" in result.output and "try --recompute" in result.output, \
        result.output


def test_auto_chunk_adds_recompute_on_a_gpu_rather_than_run_short_chunks():
    """`base` on an 80 GB GPU (79.2 GiB): at 512k only 8k chunks fit without recompute, the pools kept; 32k chunks
    with recompute were measured faster than 8k without (153 s a step at 1M on the H200, against > 390 s), so --chunk
    auto takes them, keeping the pools, and says why; at 1M keeping them would cut the chunks to 4k, so they are
    chosen again. On the H200 32k chunks fit at 512k and 16k at 1M without recompute, the pools kept: auto adds none
    (16k without recompute measured faster than 32k with it)."""
    from genolc.model import preset
    from genolc.train.plan import GIB
    from genolc.train.strategy import choose_strategy

    common = dict(windows=1, grad_accum=1, chunk=None, bf16=True, fast_kernels=True, multiple=64, where="test")
    h100, h200 = int(79.2 * GIB), int(139.8 * GIB)
    plain = choose_strategy(preset("base"), seq_len=1 << 19, recompute=False, budget_bytes=h100, **common)
    assert (plain.chunk, plain.recompute, plain.keep_selections) == (8 * 1024, False, True)
    chosen = choose_strategy(preset("base"), seq_len=1 << 19, recompute=False, auto_recompute=True,
                             budget_bytes=h100, **common)
    assert (chosen.chunk, chosen.recompute, chosen.keep_selections) == (32 * 1024, True, True)
    assert ("recompute added because without it the longest chunk that fits is 8k, and chunks under 16k"
            in chosen.describe())
    at_1m = choose_strategy(preset("base"), seq_len=1 << 20, recompute=False, auto_recompute=True,
                            budget_bytes=h100, **common)
    assert (at_1m.chunk, at_1m.recompute, at_1m.keep_selections) == (32 * 1024, True, False)
    assert "keeping the first pass's would cut the chunks to 4k" in at_1m.describe()
    for seq_len, chunk in ((1 << 19, 32 * 1024), (1 << 20, 16 * 1024)):
        on_h200 = choose_strategy(preset("base"), seq_len=seq_len, recompute=False, auto_recompute=True,
                                  budget_bytes=h200, **common)
        assert (on_h200.chunk, on_h200.recompute, on_h200.keep_selections) == (chunk, False, True)
    small = choose_strategy(preset("small"), seq_len=1 << 20, recompute=False, auto_recompute=True, budget_bytes=h200,
                            **common)
    assert (small.chunk, small.recompute) == (64 * 1024, False)


def test_pools_are_kept_unless_that_costs_short_chunks_or_more_time():
    """`base` at 3M on the H200: keeping the pools leaves room only for 24k chunks with recompute (12k without),
    choosing them again for 32k chunks with it, which win (recomputed chunks under 32k run slower). `small` at 4M on
    a 112 GiB device: keeping them costs 16k chunks instead of 32k, both without recompute; 16k is not under
    FAST_UNRECOMPUTED_CHUNK and one indexer pass is estimated to cost less than two, so the pools are kept."""
    from genolc.model import preset
    from genolc.train.strategy import choose_strategy

    common = dict(windows=1, grad_accum=1, chunk=None, recompute=False, bf16=True, fast_kernels=True,
                  budget_bytes=int(139.8 * GIB), multiple=64, where="test", auto_recompute=True)
    base_3m = choose_strategy(preset("base"), seq_len=3 << 20, **common)
    assert (base_3m.chunk, base_3m.recompute, base_3m.keep_selections) == (32 * 1024, True, False)
    assert "would cut the chunks to 24k, and chunks under 32k run slower" in base_3m.describe()
    assert "with the DSA pools chosen again, chunks under 32k run slower than a recomputed" in base_3m.describe()
    # A kept chunk that needs recompute anyway is short under 32k, not 16k: `base` at 2M on a 108 GiB device keeps
    # 32k chunks with recompute rather than 16k ones with it and the pools kept.
    base_2m = choose_strategy(preset("base"), seq_len=2 << 20, **{**common, "budget_bytes": int(108 * GIB)})
    assert (base_2m.chunk, base_2m.recompute, base_2m.keep_selections) == (32 * 1024, True, False)
    assert "keeping the first pass's would cut the chunks to 16k, and chunks under 32k run slower" in base_2m.describe()
    small_4m = choose_strategy(preset("small"), seq_len=4 << 20, **{**common, "budget_bytes": int(112 * GIB)})
    assert (small_4m.chunk, small_4m.recompute, small_4m.keep_selections) == (16 * 1024, False, True)


def test_auto_chunk_takes_the_longest_recomputed_chunk_when_nothing_else_fits():
    """`base` at 4M on a device with 136 GiB: no chunk fits without recompute and 32k chunks with it need more than
    the device, so --chunk auto takes 16k chunks with recompute (it used to refuse and suggest them)."""
    from genolc.model import preset
    from genolc.train.strategy import choose_strategy

    common = dict(seq_len=1 << 22, windows=1, grad_accum=1, chunk=None, bf16=True, fast_kernels=True,
                  budget_bytes=int(136 * GIB), multiple=64, where="test")
    chosen = choose_strategy(preset("base"), recompute=False, auto_recompute=True, **common)
    assert (chosen.chunk, chosen.recompute, chosen.keep_selections) == (16 * 1024, True, False)
    assert "recompute added because no chunk fits without it" in chosen.describe()
    assert "keeping the first pass's does not fit" in chosen.describe()


def test_context_parallel_auto_chunk_takes_the_longest_recomputed_chunk_when_nothing_else_fits():
    """`small` at 4M over 2 GPUs of 66 GiB: no chunk fits a rank without recompute and 32k chunks with it do not
    either (67.3 GiB planned; 16k chunks 65.2)."""
    from genolc.model import preset
    from genolc.train.strategy import choose_context_parallel_strategy

    chosen = choose_context_parallel_strategy(
        preset("small"), seq_len=1 << 22, cp=2, pieces=4, windows=1, chunk=None, recompute=False, bf16=True,
        fast_kernels=True, budget_bytes=int(66 * GIB), multiple=64, where="test", auto_recompute=True)
    assert (chosen.chunk, chosen.recompute) == (16 * 1024, True)
    assert "recompute added because no chunk fits without it" in chosen.describe()


def test_an_asked_chunk_runs_inside_the_plans_margin_with_a_warning():
    """`base` at 2M over 2 H200s in 32k chunks: 139.9 GiB planned, inside the plan's 10 % margin. Asked for, it runs
    and says it may run out of memory; auto does not choose it; 64k chunks, beyond the margin, are refused."""
    from genolc.model import preset
    from genolc.train.plan import OutOfMemoryPlanError
    from genolc.train.strategy import choose_context_parallel_strategy, choose_strategy

    common = dict(seq_len=2 << 20, cp=2, pieces=4, windows=1, recompute=False, bf16=True, fast_kernels=True,
                  budget_bytes=int(139.8 * GIB), multiple=64, where="test")
    asked = choose_context_parallel_strategy(preset("base"), chunk=32 * 1024, **common)
    assert asked.chunk == 32 * 1024 and not asked.recompute
    assert "estimated peak 139.9 GiB" in asked.describe()
    assert "as asked, though over the 139.8 GiB device once the plan's 10% margin is added" in asked.describe()
    assert choose_context_parallel_strategy(preset("base"), chunk=None, **common).chunk == 16 * 1024
    with pytest.raises(OutOfMemoryPlanError):
        choose_context_parallel_strategy(preset("base"), chunk=64 * 1024, **common)
    one = dict(seq_len=1 << 20, windows=1, grad_accum=1, recompute=False, bf16=True, fast_kernels=True,
               budget_bytes=int(139.8 * GIB), multiple=64, where="test")
    # One process at 1M: 32k chunks fit only inside the margin, and keeping the pools does not fit at all then.
    asked_alone = choose_strategy(preset("base"), chunk=32 * 1024, **one)
    assert "as asked, though over the 139.8 GiB device" in asked_alone.reason and not asked_alone.keep_selections


def test_context_parallel_auto_chunk_adds_recompute_on_a_gpu_rather_than_run_short_chunks():
    """`base` at 1M over 2 GPUs of 80 GB: without recompute only 8k chunks (4k tokens a rank) fit the plan, so --chunk
    auto takes 32k chunks with recompute; `small` keeps its 64k chunks."""
    from genolc.model import preset
    from genolc.train.strategy import choose_context_parallel_strategy

    common = dict(seq_len=1 << 20, cp=2, pieces=4, windows=1, chunk=None, recompute=False, bf16=True,
                  fast_kernels=True, budget_bytes=int(79.2 * GIB), multiple=64, where="test")
    plain = choose_context_parallel_strategy(preset("base"), **common)
    assert (plain.chunk, plain.recompute) == (8 * 1024, False)
    chosen = choose_context_parallel_strategy(preset("base"), auto_recompute=True, **common)
    assert (chosen.chunk, chosen.recompute) == (32 * 1024, True)
    assert "recompute added because without it the longest chunk that fits is 8k" in chosen.describe()
    small = choose_context_parallel_strategy(preset("small"), auto_recompute=True, **common)
    assert (small.chunk, small.recompute) == (64 * 1024, False)


def test_plan_refuses_a_window_the_cuda_kernels_cannot_run_as_finetune_does():
    from click.testing import CliRunner

    from genolc.cli import main

    result = CliRunner().invoke(main, ["plan", "--model", "small", "--seq", "100"])
    assert result.exit_code == 2, result.output
    assert "window length 100 is not a multiple of 64" in result.output and "use 128 or 64" in result.output
    result = CliRunner().invoke(main, ["plan", "--model", "small", "--seq", "1000", "--cp", "2"])
    assert result.exit_code == 2 and "window length 1000 is not a multiple of 256" in result.output, result.output


def test_the_dsa_forwards_are_kept_in_host_memory_where_it_has_room():
    """A chunked step on the GPU that keeps its pools keeps its DSA forwards in host memory, where they take at most
    half of what is free (`base` at 512k: 4 layers x 12 heads x (384 bf16 + 1 fp32) bytes a token, 18.1 GiB), and
    plans one chunk's more on the device. Not kept: on the CPU path, for the whole window, with too little host
    memory."""
    from genolc.train.strategy import HOST_SHARE, choose_strategy

    common = dict(windows=1, grad_accum=1, chunk=None, recompute=False, bf16=True, budget_bytes=int(139.8 * GIB),
                  multiple=64, where="test", auto_recompute=True)
    host = kept_attention_bytes(preset("base"), 1 << 19)
    assert host == (1 << 19) * 4 * 12 * (384 * 2 + 4)
    unknown = choose_strategy(preset("base"), seq_len=1 << 19, fast_kernels=True, **common)
    roomy = choose_strategy(preset("base"), seq_len=1 << 19, fast_kernels=True, host_free_bytes=4 * host, **common)
    assert unknown == roomy and roomy.keep_attention and roomy.kept_attention_bytes == host
    chunked = estimate_chunked_memory(preset("base"), seq_len=1 << 19, chunk=roomy.chunk, fast_kernels=True).total
    assert roomy.estimate_bytes == chunked + _kept_on_device("base", roomy.chunk)
    assert f"wait in host memory for the second ({host / GIB:.1f} GiB)" in roomy.describe()
    tight = choose_strategy(preset("base"), seq_len=1 << 19, fast_kernels=True,
                            host_free_bytes=int(host / HOST_SHARE) - 1, **common)
    assert not tight.keep_attention and tight.chunk == roomy.chunk and tight.estimate_bytes == chunked
    assert "the DSA forwards are computed again in the second pass" in tight.describe()
    on_cpu = choose_strategy(preset("tiny"), seq_len=1 << 14, fast_kernels=False, **{**common, "multiple": 1,
                                                                                     "budget_bytes": int(2 * GIB)})
    assert on_cpu.chunk is not None and not on_cpu.keep_attention
    whole = choose_strategy(preset("small"), seq_len=1 << 14, fast_kernels=True, **common)
    assert whole.chunk is None and not whole.keep_attention
    # With per-layer recompute the chunk's cache holds the current chunk's forwards too: two chunks' more.
    on_80gb = choose_strategy(preset("base"), seq_len=1 << 19, fast_kernels=True,
                              **{**common, "budget_bytes": int(79.2 * GIB)})
    assert (on_80gb.chunk, on_80gb.recompute, on_80gb.keep_attention) == (32 * 1024, True, True)
    recomputed = estimate_chunked_memory(preset("base"), seq_len=1 << 19, chunk=32 * 1024, fast_kernels=True,
                                         recompute=True).total
    assert on_80gb.estimate_bytes == (recomputed + _kept_on_device("base", 32 * 1024, chunks=2)
                                      + _kda_kept_on_device("base", 32 * 1024, recompute=True))
    # A chunk that fits, but not with one chunk's forwards more: they are computed again, and the step says why.
    tight_device = choose_strategy(preset("base"), seq_len=1 << 19, fast_kernels=True,
                                   **{**common, "chunk": 32 * 1024, "budget_bytes": chunked + 1})
    assert tight_device.chunk == 32 * 1024 and not tight_device.keep_attention
    assert "keeping them would need 1.2 GiB more of the device" in tight_device.describe()


def test_kda_keeps_its_intermediates_where_the_device_has_room():
    """A chunked step on the GPU keeps fla's KDA intermediates for the backward where its plan has room for them:
    per KDA layer and token (5 a + 4) W + a H Dk Dv / 64 bytes, (128 a + 8) H more in chunks over a KDA segment
    (32k), every KDA layer of a chunk (one under per-layer recompute); the H200 measured +11.28 GiB at `small`'s 64k
    chunks, +10.12 at `base`'s 32k and +5.07 at its 16k (benchmarks/results/kda_intermediates_2026-12-03/). `small`
    at 512k keeps them; `base` at 512k (planned 135.3 GiB of 139.8 with its DSA forwards kept) has no room for
    11.1 GiB more and says so; never on the CPU path, for the whole window or for chunks over 64k."""
    from genolc.train.strategy import choose_strategy

    common = dict(windows=1, grad_accum=1, chunk=None, recompute=False, bf16=True, budget_bytes=int(139.8 * GIB),
                  multiple=64, where="test", auto_recompute=True)
    small = preset("small")
    # Against the peaks the H200 measured with and without them, step by step in one process.
    for name in ("small_512k_64k_profiled_e825408", "base_512k_32k_e825408", "base_1M_16k_e825408"):
        record = json.loads((RESULTS / "kda_intermediates_2026-12-03" / f"{name}.json").read_text())
        peaks = {mode: {row["peak_gpu_gib"] for row in record["steps"]
                        if row["phase"] == "timed" and row["kda_intermediates"] == mode}
                 for mode in ("recompute", "keep")}
        timed = next(row for row in record["steps"] if row["phase"] == "timed")
        measured = max(peaks["keep"]) - min(peaks["recompute"])
        planned = kda_intermediates_device_bytes(preset(record["model"]), chunk=parse_length(timed["chunk"])) / GIB
        # Within 2 % (and the records' 0.01 GiB rounding) before the plan's 10 % margin.
        assert abs(planned - measured) <= 0.02 * measured + 0.02, (name, planned, measured)
    per_token = kda_intermediates_device_bytes(small, chunk=1000) // (1000 * 9)
    assert kda_intermediates_device_bytes(small, chunk=1000, windows=2) == 2000 * 9 * per_token
    assert kda_intermediates_device_bytes(small, chunk=1000, recompute=True) == 1000 * per_token
    # fp32 compute: fla keeps them in q's dtype, all but the fp32 decay sum twice as wide.
    width = small.linear_num_heads * small.linear_head_dim
    assert kda_intermediates_device_bytes(small, chunk=1000, bf16=False) // (1000 * 9) == 2 * per_token - 4 * width
    assert kda_intermediates_device_bytes(small.replace(layer_types=("indexed_attention",) * 12), chunk=1000) == 0
    kept = choose_strategy(preset("small"), seq_len=1 << 19, fast_kernels=True, **common)
    assert kept.chunk == 64 * 1024 and kept.keep_attention and kept.keep_kda_intermediates
    chunked = estimate_chunked_memory(small, seq_len=1 << 19, chunk=kept.chunk, fast_kernels=True).total
    extra = _kda_kept_on_device("small", kept.chunk)
    assert kept.estimate_bytes == chunked + _kept_on_device("small", kept.chunk) + extra
    assert f"KDA keeps its intermediates for the backward ({extra / GIB:.1f} GiB)" in kept.describe()
    base = choose_strategy(preset("base"), seq_len=1 << 19, fast_kernels=True, **common)
    assert base.chunk == 32 * 1024 and base.keep_attention and not base.keep_kda_intermediates
    assert (f"KDA's backward computes its intermediates again: keeping them would need "
            f"{_kda_kept_on_device('base', base.chunk) / GIB:.1f} GiB more of the device") in base.describe()
    on_cpu = choose_strategy(preset("tiny"), seq_len=1 << 14, fast_kernels=False, **{**common, "multiple": 1,
                                                                                     "budget_bytes": int(2 * GIB)})
    assert on_cpu.chunk is not None and not on_cpu.keep_kda_intermediates
    whole = choose_strategy(small, seq_len=1 << 14, fast_kernels=True, **common)
    assert whole.chunk is None and not whole.keep_kda_intermediates
    # Chunks past the longest measured (64k) stay in fla's 32k segments, which bound its backward's workspace.
    longer = choose_strategy(small, seq_len=1 << 19, fast_kernels=True, **{**common, "recompute": True})
    assert longer.chunk == 256 * 1024 and not longer.keep_kda_intermediates
    assert "kept only in chunks of up to 64k" in longer.describe()
    asked = choose_strategy(small, seq_len=1 << 19, fast_kernels=True, **{**common, "chunk": 32 * 1024})
    assert asked.keep_kda_intermediates and asked.estimate_bytes == (
        estimate_chunked_memory(small, seq_len=1 << 19, chunk=32 * 1024, fast_kernels=True).total
        + _kept_on_device("small", 32 * 1024) + _kda_kept_on_device("small", 32 * 1024))


def test_the_host_memory_a_process_may_page_lock(tmp_path, monkeypatch):
    """MemAvailable, no more than a cgroup's limit leaves, shared by the host's training processes."""
    from genolc.train import strategy

    monkeypatch.setattr(strategy, "host_available_bytes", lambda: 100 * GIB)
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    monkeypatch.setattr(strategy, "CGROUP_MEMORY_FILES", ((str(limit), str(usage)),))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert strategy.host_free_bytes_per_process() == 100 * GIB, "no cgroup files: MemAvailable"
    limit.write_text("max\n")
    usage.write_text(f"{3 * GIB}\n")
    assert strategy.host_free_bytes_per_process() == 100 * GIB, "no limit"
    limit.write_text(f"{64 * GIB}\n")
    assert strategy.host_free_bytes_per_process() == 61 * GIB
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert strategy.host_free_bytes_per_process() == 61 * GIB // 4
