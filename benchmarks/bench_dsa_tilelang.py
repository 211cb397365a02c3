"""python bench_dsa_tilelang.py [--sizes 64k,256k,1M] [--presets small,base]   (from benchmarks/, on the H200)

The DSA sparse latent attention (absorbed MLA form) in TileLang (genolc.model.ops.dsa.tilelang.forward forward,
tilelang_backward backward) against the Triton one (genolc.model.ops.dsa.triton): the comparison behind issue 5's "TileLang,
or Triton if it serves better".

1. Correctness at an odd shape (T = S = 3001, W = 515, random index rows with -1 slots and one empty row) for each
   preset's (H, R): TileLang and Triton vs reference.sparse_latent_attention on fp32 copies (o_lat), vs an fp32
   log-sum-exp computed here (lse), and against each other; outputs NaN-poisoned first.
2. Forward timing at T = 64k, 256k, 1M (B = 1, bf16, W = 2051 = topk 2048 + kpool 4 - 1, int32 rows of distinct,
   sorted, random causal slots built on the GPU: query t draws from [0, t], -1 where t + 1 < W). At 64k a few TileLang
   launch configs are timed and the fastest is used above; its output is checked against Triton's.
   Counts: FLOPs 4*T*W*H*R (scores + weighted latent rows); gathered bytes T*W*R*2 (one latent row per slot,
   shared by all heads).
3. Backward: at the check shape, d_q_lat and d_latent of TileLang's autograd op (tilelang_backward.sparse_latent_attention)
   and of Triton's vs the fp32 reference's autograd gradients (same bf16 inputs upcast, a bf16 d_out), and against
   each other. Then forward+backward timing (torch.autograd.grad of the op's output) at the same sizes, Triton
   before any TileLang code, 1 timed repeat at 1M. Counts: FLOPs 14*T*W*H*R (forward 4, backward 10); bytes
   T*W*R*(2+2+4) (two gathers and the fp32 atomic row per slot).

Triton's check and timings all run before any TileLang code, so they are recorded even when TileLang fails; any
TileLang compile or runtime failure is caught and written into the JSON (error text; a sticky CUDA error stops the
TileLang phase) and the script still exits 0. Sizes and configs are skipped (and recorded as skipped) past the
*_BUDGET_S marks so the whole run stays under 4 minutes.
Writes $OUT or benchmarks/results/dsa_tilelang_<date>.json.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import astuple

import torch

from gpu_bench_common import SIZES, parse_bench_args, print_table, rel_err, try_measure, write_results
from genolc.model.ops.dsa import reference, triton as dsa_triton
from genolc.model.presets import PRESETS

RESULT_NAME = "dsa_tilelang"
CHECK_LENGTH, CHECK_WIDTH = 3001, 515
# Seconds since start after which a phase stops starting new sizes / new launch configs (the run must stay < 3 min).
TRITON_BUDGET_S = 60.0
TRITON_BWD_BUDGET_S = 95.0
SWEEP_BUDGET_S = 120.0
TIME_BUDGET_S = 145.0
BWD_BUDGET_S = 200.0
TILELANG_CONFIGS = [(64, 2, 128), (32, 3, 128), (32, 2, 128), (64, 2, 256)]
START = time.monotonic()


def preset_shape(name: str) -> dict:
    config = PRESETS[name]()
    return {"heads": config.num_attention_heads, "rank": config.kv_lora_rank,
            "width": config.index_topk + config.index_kpool - 1, "scale": config.qk_nope_head_dim ** -0.5}


def elapsed() -> float:
    return time.monotonic() - START


def error_text(error: BaseException) -> str:
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    return (f"{type(error).__name__}: {error}"[:600] + " | " + "".join(lines[-4:])[-1200:]).replace("\n", " ")


def poison(gib: float = 4.0) -> None:
    """NaN-fill fresh memory and free it to torch's cache so outputs an op leaves unwritten read NaN."""
    torch.cuda.synchronize()
    block = torch.full((int(gib * (1 << 30)) // 4,), float("nan"), device="cuda")
    del block
    torch.cuda.synchronize()


def causal_rows(length: int, width: int, seed: int) -> torch.Tensor:
    """``[1, T, W]`` int32: query t holds min(t + 1, W) distinct random slots from [0, t], the rest -1."""
    out = torch.full((1, length, width), -1, dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    slots = torch.arange(width, device="cuda")
    chunk = max(1, (1 << 27) // width)
    for q0 in range(0, length, chunk):
        positions = torch.arange(q0, min(length, q0 + chunk), device="cuda")
        spare = (positions + 2 - width).clamp_min(1)
        # Sorted draws from [0, t + 1 - W] plus the slot number: strictly increasing, hence distinct, and <= t.
        draws = (torch.rand(positions.numel(), width, generator=gen, device="cuda") * spare[:, None]).floor().long()
        rows = draws.sort(-1).values + slots
        short = positions[:, None] + 1 < width
        rows = torch.where(short, slots.expand_as(rows), rows)
        rows = rows.masked_fill(rows > positions[:, None], -1)
        out[0, q0:q0 + positions.numel()] = rows.int()
    return out


def check_rows(length: int, width: int, seed: int) -> torch.Tensor:
    """Random distinct rows over [0, length) with ~30% of slots -1 and row 7 entirely empty."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = torch.rand(1, length, length, generator=gen, device="cuda").topk(width, dim=-1).indices.int()
    rows = rows.masked_fill(torch.rand(rows.shape, generator=gen, device="cuda") < 0.3, -1)
    rows[0, 7] = -1
    return rows


def reference_lse(q_lat: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 natural-log log-sum-exp per (query, head), +inf for rows with no valid slot."""
    out = []
    for q0 in range(0, q_lat.shape[1], 256):
        idx = indices[0, q0:q0 + 256]
        rows = latent[0][idx.long().clamp_min(0)]                                    # [C, W, R]
        scores = torch.einsum("chr,cwr->chw", q_lat[0, q0:q0 + 256].float(), rows.float()) * scale
        scores = scores.masked_fill((idx < 0)[:, None, :], float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out.append(torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse))
    return torch.cat(out)[None]


def lse_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """rel_err over finite entries; inf unless the +inf (empty-row) entries match exactly."""
    finite = torch.isfinite(expected)
    if not torch.equal(torch.isposinf(actual), ~finite):
        return float("inf")
    return rel_err(actual[finite], expected[finite])


def tilelang_configs(rank: int) -> list:
    """The rank's default launch config first, then the other candidates timed at the first size."""
    from genolc.model.ops.dsa.tilelang import forward as tilelang_forward

    default = tilelang_forward.default_config(rank)
    others = [tilelang_forward.KernelConfig(*entry) for entry in TILELANG_CONFIGS]
    return [default] + [config for config in others if config != default]


def run_tilelang(q_lat, latent, indices, scale, config=None):
    from genolc.model.ops.dsa.tilelang import forward as tilelang_forward

    return tilelang_forward.sparse_latent_attention_forward(q_lat, latent, indices, scale, config=config)


def cuda_alive() -> bool:
    """False after a sticky CUDA error (e.g. an illegal address), when every later CUDA call fails."""
    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").sum()) == 1.0
    except Exception:  # noqa: BLE001
        return False


def check_inputs(preset: str, shape: dict):
    heads, rank = shape["heads"], shape["rank"]
    gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + rank)
    q_lat = torch.randn(1, CHECK_LENGTH, heads, rank, generator=gen, device="cuda").bfloat16()
    latent = torch.randn(1, CHECK_LENGTH, rank, generator=gen, device="cuda").bfloat16()
    indices = check_rows(CHECK_LENGTH, CHECK_WIDTH, seed=rank)
    return q_lat, latent, indices


def correctness(preset: str, shape: dict, variant: str, op, rows: list[dict], notes: dict,
                saved: dict) -> None:
    """One variant at the check shape against the fp32 reference (and the other variant when it already ran)."""
    q_lat, latent, indices = check_inputs(preset, shape)
    scale = shape["scale"]
    ref_o = reference.sparse_latent_attention(q_lat.float(), latent.float(), indices, scale)
    ref_lse = reference_lse(q_lat, latent, indices, scale)
    row = {"check": "correctness", "preset": preset, "T": CHECK_LENGTH, "W": CHECK_WIDTH, "heads": shape["heads"],
           "rank": shape["rank"], "variant": variant}
    try:
        poison()
        start = time.monotonic()
        out, lse = op(q_lat, latent, indices, scale)
        torch.cuda.synchronize()
        row["first_call_s"] = time.monotonic() - start                           # includes compilation
        row["rel_err_o_vs_ref"] = rel_err(out, ref_o)
        row["rel_err_lse_vs_ref"] = lse_err(lse, ref_lse)
        row["empty_row_ok"] = bool((out[0, 7] == 0).all() and torch.isposinf(lse[0, 7]).all())
        row["out_dtype"] = str(out.dtype)
        other = saved.get(("triton", preset))
        if other is not None:
            row["rel_err_o_vs_triton"] = rel_err(out, other[0].float())
            row["rel_err_lse_vs_triton"] = lse_err(lse, other[1])
        saved[(variant, preset)] = (out, lse)
    except Exception as error:  # noqa: BLE001 - any failure is the result to record
        row["error"] = error_text(error)
        notes.setdefault("errors", []).append(f"{variant} correctness {preset}: {row['error'][:300]}")
    rows.append(row)
    print(row, flush=True)


def timing_row(preset: str, shape: dict, size: str, variant: str, config, result: dict) -> dict:
    length, heads, rank, width = SIZES[size], shape["heads"], shape["rank"], shape["width"]
    row = {"check": "timing", "preset": preset, "T": size, "W": width, "heads": heads, "rank": rank,
           "variant": variant, "config": None if config is None else astuple(config),
           **{k: v for k, v in result.items() if k != "ms_all"}}
    if "ms" in result:
        row["TFLOP_s"] = 4 * length * width * heads * rank / result["ms"] / 1e9
        row["gather_GB_s"] = length * width * rank * 2 / result["ms"] / 1e6
    return row


def measure_safely(step, repeats: int) -> dict:
    try:
        return try_measure(step, repeats)
    except Exception as error:  # noqa: BLE001 - compile/launch failures are results too
        return {"error": error_text(error)}


def timing_inputs(size: str, shape: dict, cache: dict):
    """Seeded inputs for one (size, preset): the same tensors in the Triton and the TileLang phase."""
    length = SIZES[size]
    key = (length, shape["width"])
    if cache.get("key") != key:
        cache.clear()
        torch.cuda.empty_cache()
        cache["key"], cache["indices"] = key, causal_rows(length, shape["width"], seed=length)
    gen = torch.Generator(device="cuda").manual_seed(length + shape["heads"])
    q_lat = torch.randn(1, length, shape["heads"], shape["rank"], generator=gen, device="cuda").bfloat16()
    latent = torch.randn(1, length, shape["rank"], generator=gen, device="cuda").bfloat16()
    return q_lat, latent, cache["indices"]


def repeats_for(size: str) -> int:
    return 3 if SIZES[size] < SIZES["1M"] else 2


def triton_phase(sizes, presets, shapes, rows, notes, triton_outputs) -> None:
    cache: dict = {}
    for size in sizes:
        if elapsed() > TRITON_BUDGET_S:
            notes.setdefault("skipped", []).append(f"triton {size}: budget spent at {elapsed():.0f} s")
            continue
        for preset in presets:
            shape, scale = shapes[preset], shapes[preset]["scale"]
            q_lat, latent, indices = timing_inputs(size, shape, cache)
            try:
                triton_outputs[(size, preset)] = dsa_triton.sparse_latent_attention_forward(q_lat, latent, indices,
                                                                                      scale)[0]
            except Exception as error:  # noqa: BLE001
                notes.setdefault("errors", []).append(f"triton {preset} {size}: {error_text(error)[:300]}")
            result = measure_safely(lambda: dsa_triton.sparse_latent_attention_forward(q_lat, latent, indices, scale),
                                    repeats_for(size))
            rows.append(timing_row(preset, shape, size, "triton", None, result))
            print(rows[-1], flush=True)
            del q_lat, latent
        write_results(RESULT_NAME, rows, notes)


def tilelang_phase(sizes, presets, shapes, rows, notes, triton_outputs) -> None:
    cache: dict = {}
    chosen = {}
    for size in sizes:
        if elapsed() > TIME_BUDGET_S:
            notes.setdefault("skipped", []).append(f"tilelang {size}: budget spent at {elapsed():.0f} s")
            continue
        for preset in presets:
            shape, scale = shapes[preset], shapes[preset]["scale"]
            q_lat, latent, indices = timing_inputs(size, shape, cache)
            reference_out = triton_outputs.pop((size, preset), None)
            best = None
            for config in tilelang_configs(shape["rank"]) if size == sizes[0] else [chosen.get(preset)]:
                if best is not None and elapsed() > SWEEP_BUDGET_S:
                    notes.setdefault("skipped", []).append(f"tilelang config {config} {preset}: sweep budget")
                    continue
                row = {"check": "timing", "preset": preset, "T": size, "variant": "tilelang",
                       "config": None if config is None else astuple(config)}
                try:
                    start = time.monotonic()
                    out = run_tilelang(q_lat, latent, indices, scale, config)[0]
                    torch.cuda.synchronize()
                    first_call_s = time.monotonic() - start                          # includes compilation
                    check = rel_err(out, reference_out.float()) if reference_out is not None else None
                    del out
                except Exception as error:  # noqa: BLE001
                    rows.append({**row, "error": error_text(error)})
                    print(rows[-1], flush=True)
                    if not cuda_alive():
                        notes["tilelang_stopped"] = "sticky CUDA error; later TileLang runs skipped"
                        return
                    continue
                result = measure_safely(lambda: run_tilelang(q_lat, latent, indices, scale, config),
                                        repeats_for(size))
                rows.append({**timing_row(preset, shape, size, "tilelang", config, result),
                             "first_call_s": first_call_s, "rel_err_o_vs_triton": check})
                print(rows[-1], flush=True)
                if "ms" in result and (best is None or result["ms"] < best[1]):
                    best = (config, result["ms"])
                if not cuda_alive():
                    notes["tilelang_stopped"] = "sticky CUDA error; later TileLang runs skipped"
                    return
            if size == sizes[0] and best is not None:
                chosen[preset] = best[0]
                notes.setdefault("tilelang_config_chosen", {})[preset] = astuple(best[0])
            del q_lat, latent, reference_out
            write_results(RESULT_NAME, rows, notes)


def run_tilelang_autograd(q_lat, latent, indices, scale):
    from genolc.model.ops.dsa.tilelang import backward as tilelang_backward

    return tilelang_backward.sparse_latent_attention(q_lat, latent, indices, scale)


def fwd_bwd(op, q_lat, latent, indices, scale, d_out):
    """One forward+backward of ``op``: ``(o_lat, d_q_lat, d_latent)`` (fresh gradients, nothing accumulated)."""
    q_lat = q_lat.detach().requires_grad_(True)
    latent = latent.detach().requires_grad_(True)
    out = op(q_lat, latent, indices, scale)
    d_q, d_latent = torch.autograd.grad(out, (q_lat, latent), d_out)
    return out, d_q, d_latent


def reference_grads(q_lat, latent, indices, scale, d_out) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 autograd gradients of reference.sparse_latent_attention on fp32 copies of the bf16 inputs."""
    _, d_q, d_latent = fwd_bwd(reference.sparse_latent_attention, q_lat.float(), latent.float(), indices, scale,
                               d_out.float())
    return d_q, d_latent


def backward_correctness(preset: str, shape: dict, variant: str, op, rows: list[dict], notes: dict,
                         saved: dict) -> None:
    """Gradients of one variant's autograd op at the check shape vs the fp32 reference (and vs Triton's)."""
    q_lat, latent, indices = check_inputs(preset, shape)
    scale = shape["scale"]
    gen = torch.Generator(device="cuda").manual_seed(shape["rank"] + 7)
    d_out = torch.randn(q_lat.shape, generator=gen, device="cuda").bfloat16()
    if ("reference_grads", preset) not in saved:
        saved[("reference_grads", preset)] = reference_grads(q_lat, latent, indices, scale, d_out)
    ref_dq, ref_dc = saved[("reference_grads", preset)]
    row = {"check": "backward_correctness", "preset": preset, "T": CHECK_LENGTH, "W": CHECK_WIDTH,
           "heads": shape["heads"], "rank": shape["rank"], "variant": variant}
    try:
        poison()
        start = time.monotonic()
        _, d_q, d_latent = fwd_bwd(op, q_lat, latent, indices, scale, d_out)
        torch.cuda.synchronize()
        row["first_call_s"] = time.monotonic() - start                           # includes compilation
        row["rel_err_dq_vs_ref"] = rel_err(d_q, ref_dq)
        row["rel_err_dlatent_vs_ref"] = rel_err(d_latent, ref_dc)
        row["empty_row_dq_zero"] = bool((d_q[0, 7] == 0).all())
        row["dtypes"] = [str(d_q.dtype), str(d_latent.dtype)]
        other = saved.get(("triton_grads", preset))
        if other is not None:
            row["rel_err_dq_vs_triton"] = rel_err(d_q, other[0].float())
            row["rel_err_dlatent_vs_triton"] = rel_err(d_latent, other[1].float())
        saved[(variant + "_grads", preset)] = (d_q, d_latent)
    except Exception as error:  # noqa: BLE001 - any failure is the result to record
        row["error"] = error_text(error)
        notes.setdefault("errors", []).append(f"{variant} backward correctness {preset}: {row['error'][:300]}")
    rows.append(row)
    print(row, flush=True)


def fwd_bwd_phase(variant: str, op, sizes, presets, shapes, rows, notes, budget_s: float) -> bool:
    """Forward+backward timing of one variant's autograd op; False after a sticky CUDA error."""
    cache: dict = {}
    for size in sizes:
        if elapsed() > budget_s:
            notes.setdefault("skipped", []).append(f"{variant} fwd+bwd {size}: budget spent at {elapsed():.0f} s")
            continue
        for preset in presets:
            shape, scale = shapes[preset], shapes[preset]["scale"]
            length, heads, rank, width = SIZES[size], shape["heads"], shape["rank"], shape["width"]
            q_lat, latent, indices = timing_inputs(size, shape, cache)
            d_out = torch.randn_like(q_lat)
            row = {"check": "fwd_bwd_timing", "preset": preset, "T": size, "W": width, "heads": heads,
                   "rank": rank, "variant": variant}
            result = measure_safely(lambda: fwd_bwd(op, q_lat, latent, indices, scale, d_out),
                                    1 if length >= SIZES["1M"] else 2)
            row.update({k: v for k, v in result.items() if k != "ms_all"})
            if "ms" in result:
                row["TFLOP_s"] = 14 * length * width * heads * rank / result["ms"] / 1e9
                row["GB_s"] = length * width * rank * 8 / result["ms"] / 1e6
            rows.append(row)
            print(row, flush=True)
            del q_lat, latent, d_out
            if "error" in result and not cuda_alive():
                notes[f"{variant}_fwd_bwd_stopped"] = "sticky CUDA error; later runs skipped"
                return False
        write_results(RESULT_NAME, rows, notes)
    return True


def main() -> None:
    args = parse_bench_args(__doc__)
    sizes, presets = args.sizes.split(","), args.presets.split(",")
    shapes = {preset: preset_shape(preset) for preset in presets}
    rows: list[dict] = []
    notes = {"flops_fwd": "4*T*W*H*R", "gathered_bytes_fwd": "T*W*R*2", "flops_fwd_bwd": "14*T*W*H*R",
             "bytes_fwd_bwd": "T*W*R*(2+2+4)", "shapes": shapes,
             "check": f"T=S={CHECK_LENGTH}, W={CHECK_WIDTH}, rows with ~30% -1 and row 7 empty",
             "tilelang_configs_tried_at_first_size": TILELANG_CONFIGS, "time_budget_s": TIME_BUDGET_S,
             "bwd_budget_s": BWD_BUDGET_S}
    saved: dict = {}
    for preset in presets:
        correctness(preset, shapes[preset], "triton", dsa_triton.sparse_latent_attention_forward, rows, notes, saved)
    triton_outputs: dict = {}
    triton_phase(sizes, presets, shapes, rows, notes, triton_outputs)
    for preset in presets:
        backward_correctness(preset, shapes[preset], "triton", dsa_triton.sparse_latent_attention, rows, notes, saved)
    fwd_bwd_phase("triton", dsa_triton.sparse_latent_attention, sizes, presets, shapes, rows, notes, TRITON_BWD_BUDGET_S)
    try:
        import tilelang

        notes["tilelang"] = tilelang.__version__
        tilelang_ok = True
    except Exception as error:  # noqa: BLE001
        notes["tilelang_import_error"] = error_text(error)
        tilelang_ok = False
    if tilelang_ok:
        for preset in presets:
            correctness(preset, shapes[preset], "tilelang", run_tilelang, rows, notes, saved)
        if cuda_alive():
            tilelang_phase(sizes, presets, shapes, rows, notes, triton_outputs)
        else:
            notes["tilelang_stopped"] = "sticky CUDA error in the correctness check; timing skipped"
        if cuda_alive() and "tilelang_stopped" not in notes:
            for preset in presets:
                backward_correctness(preset, shapes[preset], "tilelang", run_tilelang_autograd, rows, notes, saved)
            saved.clear()
            if cuda_alive():
                fwd_bwd_phase("tilelang", run_tilelang_autograd, sizes, presets, shapes, rows, notes, BWD_BUDGET_S)
            else:
                notes["tilelang_bwd_stopped"] = "sticky CUDA error in the backward check; fwd+bwd timing skipped"
    notes["elapsed_s"] = elapsed()
    path = write_results(RESULT_NAME, rows, notes)
    rows = [{**row, "error": row["error"][:100]} if "error" in row else row for row in rows]
    print_table([r for r in rows if r["check"] == "correctness"],
                ["preset", "variant", "rel_err_o_vs_ref", "rel_err_lse_vs_ref", "rel_err_o_vs_triton",
                 "empty_row_ok", "first_call_s", "error"])
    print_table([r for r in rows if r["check"] == "backward_correctness"],
                ["preset", "variant", "rel_err_dq_vs_ref", "rel_err_dlatent_vs_ref", "rel_err_dq_vs_triton",
                 "rel_err_dlatent_vs_triton", "empty_row_dq_zero", "first_call_s", "error"])
    print_table([r for r in rows if r["check"] == "fwd_bwd_timing"],
                ["preset", "T", "variant", "ms", "TFLOP_s", "GB_s", "peak_above_inputs_gib", "error"])
    print_table([r for r in rows if r["check"] == "timing"],
                ["preset", "T", "variant", "config", "ms", "TFLOP_s", "gather_GB_s", "rel_err_o_vs_triton",
                 "first_call_s", "error"])
    print("wrote", path, f"in {elapsed():.0f} s")


if __name__ == "__main__":
    main()
