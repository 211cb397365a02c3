"""PYTHONPATH=. /tmp/tri/bin/python tests/gpu/triton_lowering_check.py

Compiles genolc's routed-experts glue kernels (genolc/model/ops/moe/triton.py), mHC mixing and merge kernels
(genolc/model/ops/mhc/triton.py, merge_kernels.py), DSA Triton pair, pool-mass, slab-order and row-dot kernels
(genolc/model/ops/dsa/), the indexer's scoring and top-k kernels (genolc/model/ops/indexer/) and KDA's convolution
kernels (genolc/model/ops/kda/conv_kernels.py) for sm_90 on a machine without a GPU, with the dtypes, block sizes and
divisibility the ops launch them with, through Triton's own pipeline and its bundled ``ptxas -v``: it catches what
fails to build before a device call is spent on it, prints each kernel's registers and spill bytes, and checks that
the SwiGLU kernels' clamps compile to NaN-propagating min/max (``.NaN`` in the PTX), as torch's clamp propagates NaN.

It also reads each kernel's loops in the TTGIR for a shared-memory buffer that an asynchronous wgmma reads and
that the loop writes while that wgmma may still be running (:func:`refill_races`). The mHC forward with fp32
streams had one at three stages: its streams' tile had two buffers, refilled two steps ahead, with one wgmma left
in flight. Its logits differed between identical calls on the H200. The check must find that race in the
three-stage build, or it is not looking.

Exit status 0 when all build, the clamps keep NaN and no launched kernel has such a race; spills are printed,
not failed. (2026-12-02, Triton 3.6.0, ptxas 12.8: the SwiGLU forward 96 registers and 8 bytes spilled, its
backward 190, the combine 191, the gather's backward 99, the combine's backward 192; the mHC forward 246 with one
stage (190 at three, 255 at three or four with the tile in registers), its backward 255, with bf16 streams 221
and 202; the DSA Triton forward 128 and 28 bytes spilled, its backward 164; no other spill. 2026-12-03: the
indexer's scoring kernel 255 and 2,568 bytes spilled with its head loop unrolled, 255 and none rolled. KDA's
convolution kernels (genolc/model/ops/kda/conv_triton.py): forward 64, backward 128, no spill; the backward's first
form, which recomputed gm at four shifts of a 32 x 128 tile, 255 and 544 bytes spilled. 2026-12-04 (Triton 3.9.0
here): the merge forward 143, its backward 241; the pool mass 168 (`small`) and 100 (`base`); no spill. Later that
day: the slab order 72 registers (30 for 16-slot rows), 20 bytes spilled at 256 bins; the row dot 69 (`small`) and
107 (`base`), no spill. 2026-12-05, the fused block input: the mHC backward adding its share 238 registers with
bf16 streams (226 without), 255 and 80 bytes spilled with fp32 ones (244 without; 216 bytes when it gathered a
weight per column, as it still does when D is not a multiple of the 64-column tile: 255 and 284 bytes with bf16
streams, no preset's D); the block input's forward 48 and its backward's first pass 72 (bf16), no spill. Later, the
mHC backward adding the merge's share of x's gradient as well, with the product accumulated onto the other shares:
220 registers with bf16 streams, 212 with fp32 ones (210 and 240 with the block input's share alone, 218 and 200
with neither), 254 and 250 with D off the tiles; no spill. Adding the merge's share after the product instead:
254 with bf16, 255 and 148 bytes spilled with fp32. The sparse indexer KL at 32 slots a step: forward 56 registers,
backward 168 at 8 heads of 64 (250 at 64 slots, 80 at 16), 104 and 168 at 16 of 128; no spill. Session 39: the
pool mass at 64 slots a step 168 (`small`) and 162 (`base`; 166 given the lse), no spill; the indexer's scoring
kernel that writes the groups' tops 254 at 8 warps, no spill (255 and 1,300 bytes spilled at 4 warps; 1,408 when
one [rows, 4 runs] tile was reshaped for the groups' maxima). Session 40: the top-k's second read loading each step's
next block first 80 registers, no spill (48 without; 72 and a 4-byte spill when it carried the ordered patterns and
their mask into the next step instead of the stored scores); in 512-score blocks 32 without the prefetch, 48 with it.)

Not part of the CI suite (pytest collects ``test_*.py`` only); the throwaway venv of triton_interpreter_check.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from genolc.model.ops.dsa import triton as dsa
from genolc.model.ops.indexer_kl import triton as indexer_kl
from genolc.model.ops.mhc import triton as mhc
from genolc.model.ops.moe import triton as moe

ARCH = 90
BLOCKS = {"ROWS": moe.ROWS, "COLUMNS": moe.COLUMNS}
INTS = ("rows", "dim", "n_rows", "inter", "n_tokens", "hidden", "n_slots", "n_cols", "n_logits", "seq_len",
        "first_query", "kpool", "keep", "q0", "n_queries", "n_pools", "length", "padded_length", "channels",
        "part_width", "width", "slab_rows", "n_slabs")
FLOATS = ("limit", "eps", "softmax_scale")
BF16 = "*bf16"
SHORT_STRIDES = ("scb", "scs", "sib", "sit", "sgb", "sgs", "sgt", "sqb", "sqt", "sqh", "swb", "swt", "spb", "spp",
                 "smb", "smt", "sdpb", "sdpp")


@dataclass(frozen=True)
class Build:
    """One kernel as an op launches it."""

    kernel: object
    pointers: dict
    constexprs: dict
    warps: int = 4
    stages: int = 3
    clamps: bool = False                 # the SwiGLU clamps must keep NaN
    race_expected: bool = False          # a known-bad build the race check must flag
    divisible: tuple[str, ...] = ()      # integer and pointer arguments that are multiples of 16 in every launch


def _signature(kernel, pointers: dict[str, str], constexprs: dict) -> dict[str, str]:
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        elif name in FLOATS:
            signature[name] = "fp32"
        elif name.startswith("stride") or name in INTS or name in SHORT_STRIDES:
            signature[name] = "i32"
        else:
            raise ValueError(f"{kernel.fn.__name__}: no type for argument {name}")
    return signature


def moe_builds() -> dict[str, Build]:
    return {
        "swiglu": Build(moe.swiglu_kernel, {"hidden_ptr": BF16, "out_ptr": BF16}, BLOCKS, clamps=True),
        "swiglu backward": Build(moe.swiglu_backward_kernel,
                                 {"grad_ptr": BF16, "hidden_ptr": BF16, "d_hidden_ptr": BF16}, BLOCKS, clamps=True),
        "combine (base, K 4)": Build(moe.combine_kernel, {"rows_ptr": BF16, "position_ptr": "*i64",
                                                          "weights_ptr": "*fp32", "out_ptr": BF16},
                                     {"TOP_K": 4, "WEIGHTED": True, **BLOCKS}),
        "gather backward (small, K 2)": Build(moe.combine_kernel, {"rows_ptr": BF16, "position_ptr": "*i64",
                                                                   "weights_ptr": BF16, "out_ptr": BF16},
                                              {"TOP_K": 2, "WEIGHTED": False, **BLOCKS}),
        "combine backward (base, K 4)": Build(moe.combine_backward_kernel,
                                              {"grad_ptr": BF16, "rows_ptr": BF16, "position_ptr": "*i64",
                                               "weights_ptr": "*fp32", "d_rows_ptr": BF16,
                                               "d_weights_ptr": "*fp32"}, {"TOP_K": 4, **BLOCKS}),
    }


def mhc_builds() -> dict[str, Build]:
    """The mHC kernels as the trainer launches them: TF32 products (autocast), 24 logits (hc_mult 4), chunks of a
    power-of-two length; the streams' width K = 4 x hidden. The logits' and their gradient's row stride (24) is
    the one stride that is not a multiple of 16, so Triton does not specialize it."""
    forward, backward = mhc._kernel(), mhc._backward_kernel()
    config, back = mhc.DEFAULT_CONFIG, mhc.DEFAULT_BACKWARD_CONFIG
    logits = 32      # BLOCK_W for 24 logits
    found = {}
    for dtype in ("fp32", "bf16"):
        found[f"mHC forward ({dtype} streams)"] = Build(
            forward, {"x_ptr": f"*{dtype}", "w_ptr": "*fp32", "out_ptr": "*fp32", "rstd_ptr": "*fp32"},
            {"BLOCK_ROWS": config.block_rows, "BLOCK_K": config.block_k, "BLOCK_W": logits, "PRECISION": "tf32",
             "TILE_IN_REGISTERS": config.tile_in_registers},
            warps=config.num_warps, stages=config.stages,
            divisible=("x_ptr", "w_ptr", "out_ptr", "rstd_ptr", "n_rows", "n_cols", "stride_xm", "stride_wn"))
        for adds, merge_share, what in ((False, False, ""), (True, False, ", with the block input's share"),
                                        (True, True, ", with the block input's and the merge's shares")):
            found[f"mHC backward ({dtype} streams{what})"] = Build(
                backward, {"scaled_ptr": "*fp32", "coef_ptr": "*fp32", "x_ptr": f"*{dtype}", "w_ptr": "*fp32",
                           "dx_ptr": f"*{dtype}", "dw_ptr": "*fp32",
                           "pre_ptr": "*fp32" if adds else f"*{dtype}", "g_block_ptr": f"*{dtype}",
                           "g_x_ptr": f"*{dtype}"},
                {"ROWS_PER_PROGRAM": back.rows_per_program, "BLOCK_ROWS": back.block_rows, "BLOCK_K": back.block_k,
                 "BLOCK_W": logits, "PRECISION": "tf32", "ADD_BLOCK_INPUT": adds, "TILE_IN_ONE_STREAM": True,
                 "ADD_GRAD_X": merge_share},
                warps=back.num_warps, stages=back.num_stages,
                divisible=("scaled_ptr", "coef_ptr", "x_ptr", "w_ptr", "dx_ptr", "dw_ptr", "pre_ptr", "g_block_ptr",
                           "g_x_ptr", "n_rows", "n_cols", "dim", "stride_xm", "stride_wn", "stride_dxm",
                           "stride_dwg", "stride_dwn", "stride_gm", "stride_gxm"))
        # D not a multiple of the column tile (no preset's): a weight gathered per column.
        share = found[f"mHC backward ({dtype} streams, with the block input's and the merge's shares)"]
        found[f"mHC backward ({dtype} streams, with both shares, D off the tiles)"] = replace(
            share, constexprs={**share.constexprs, "TILE_IN_ONE_STREAM": False},
            divisible=tuple(name for name in share.divisible if name != "dim"))
        forward_kernel, backward_kernel = mhc._block_input_kernels()
        tiles = {"N": 4, "ROWS": mhc.BLOCK_INPUT_ROWS, "BLOCK_D": mhc.BLOCK_INPUT_BLOCK_D}
        found[f"mHC block input ({dtype} streams)"] = Build(
            forward_kernel, {"x_ptr": f"*{dtype}", "logits_ptr": "*fp32", "scale_ptr": "*fp32", "base_ptr": "*fp32",
                             "out_ptr": f"*{dtype}"}, tiles, warps=mhc.BLOCK_INPUT_WARPS,
            divisible=("x_ptr", "out_ptr", "n_rows", "dim", "stride_xm", "stride_om"))
        found[f"mHC block input backward ({dtype} streams)"] = Build(
            backward_kernel, {"x_ptr": f"*{dtype}", "g_ptr": f"*{dtype}", "grad_logits_ptr": "*fp32",
                              "logits_ptr": "*fp32", "rstd_ptr": "*fp32", "scale_ptr": "*fp32", "base_ptr": "*fp32",
                              "scaled_ptr": "*fp32", "coef_ptr": "*fp32", "pre_ptr": "*fp32", "partial_ptr": "*fp32"},
            {**tiles, "BLOCK_W": logits}, warps=mhc.BLOCK_INPUT_WARPS,
            divisible=("x_ptr", "g_ptr", "n_rows", "dim", "n_cols", "stride_xm", "stride_gm"))
    fp32_forward = found["mHC forward (fp32 streams)"]
    untouched = {**fp32_forward.constexprs, "TILE_IN_REGISTERS": False}
    found["mHC forward, fp32, three stages (the race, expected)"] = replace(
        fp32_forward, constexprs=untouched, stages=3, race_expected=True)
    for stages in (3, 4):
        found[f"mHC forward, fp32, {stages} stages, tile in registers"] = replace(
            fp32_forward, constexprs={**untouched, "TILE_IN_REGISTERS": True}, stages=stages)
    return found


def dsa_builds() -> dict[str, Build]:
    """The DSA Triton pair (the fallback where TileLang is missing) at `base`'s shape: 12 heads, latent 384."""
    forward, backward = dsa._kernels()
    tiles = dsa.tile_sizes(12, 384)
    pointers = {"q_ptr": BF16, "c_ptr": BF16, "idx_ptr": "*i32", "o_ptr": BF16, "lse_ptr": "*fp32", "do_ptr": BF16,
                "dq_ptr": BF16, "dc_ptr": "*fp32"}
    shared = {"HEADS": 12, "RANK": 384, "WIDTH": 2051, "BLOCK_H": tiles["BLOCK_H"], "BLOCK_R": tiles["BLOCK_R"],
              "PRECISION": "tf32"}
    return {"DSA Triton forward (base)": Build(forward, pointers, {**shared, "BLOCK_W": tiles["fwd_block_w"]},
                                               warps=tiles["fwd_warps"]),
            "DSA Triton backward (base)": Build(backward, pointers, {**shared, "BLOCK_W": tiles["bwd_block_w"]},
                                                warps=tiles["bwd_warps"])}


def pool_mass_builds() -> dict[str, Build]:
    """The indexer KL's target kernel (dsa.sparse_pool_mass) at `small`'s and `base`'s shapes, bf16, kpool 4, at the
    launch the op takes (dsa.pool_mass_launch)."""
    kernel = dsa._pool_mass_kernel()
    pointers = {"q_ptr": BF16, "c_ptr": BF16, "idx_ptr": "*i32", "lse_ptr": "*fp32", "out_ptr": "*fp32"}
    found = {}
    for preset, heads, rank in (("small", 8, 256), ("base", 12, 384)):
        tiles = dsa.tile_sizes(heads, rank)
        block_w, warps = dsa.pool_mass_launch(heads, rank)
        for has_lse in (False, True):
            found[f"DSA pool mass ({preset}{', given lse' if has_lse else ''})"] = Build(
                kernel, pointers, {"HEADS": heads, "RANK": rank, "WIDTH": 2051, "TOPK": 2048, "KPOOL": 4,
                                   "BLOCK_H": tiles["BLOCK_H"], "BLOCK_R": tiles["BLOCK_R"],
                                   "BLOCK_W": block_w, "PRECISION": "tf32", "HAS_LSE": has_lse},
                warps=warps)
    return found


def indexer_kl_builds() -> dict[str, Build]:
    """The sparse indexer KL's pair (genolc/model/ops/indexer_kl) as the trainer launches it: bf16 queries, fp32 head
    weights and pool keys (the key LayerNorm's output under autocast), int32 index rows, kpool 4, the presets' 8 heads
    of 64 and the kernels' largest, 16 of 128."""
    forward, backward = indexer_kl._kernels()
    operands = {"q_ptr": BF16, "w_ptr": "*fp32", "pooled_ptr": "*fp32", "idx_ptr": "*i32", "mass_ptr": "*fp32",
                "stats_ptr": "*fp32"}
    found = {}
    for heads, dim in ((8, 64), (16, 128)):
        tiles = {"HEADS": heads, "DIM": dim, "KPOOL": 4, "BLOCK_H": 16, "BLOCK_D": dim, "BLOCK_P": indexer_kl.BLOCK_P,
                 "PRECISION": indexer_kl.dot_precision(torch.bfloat16)}
        found[f"indexer KL forward ({heads} x {dim})"] = Build(
            forward, {**operands, "scores_ptr": "*fp32", "kl_ptr": "*fp32"}, tiles, warps=indexer_kl.NUM_WARPS)
        found[f"indexer KL backward ({heads} x {dim})"] = Build(
            backward, {**operands, "grad_ptr": "*fp32", "dq_ptr": BF16, "dw_ptr": "*fp32", "dpooled_ptr": "*fp32"},
            {**tiles, "POOLED_GRAD": True}, warps=indexer_kl.NUM_WARPS)
    return found


def slab_order_builds() -> dict[str, Build]:
    """The slab backward's preparations: the slab order of the index rows (dsa/slab_order.py) as slab_order_triton
    launches it for the Triton selector's int32 rows (2,051 slots) at 16 slabs (512k keys in 32k-row slabs) and at
    its 255-slab limit, and the row dot (dsa/row_dot.py) at both presets' heads x rank, bf16."""
    from genolc.model.ops.dsa import slab_order

    kernel = slab_order._kernel()
    pointers = {"idx_ptr": "*i32", "rows_ptr": "*i32", "offsets_ptr": "*i32"}
    found = {f"DSA slab order ({bins} bins)": Build(kernel, pointers, {"BLOCK": slab_order.BLOCK, "BINS": bins},
                                                   warps=slab_order.NUM_WARPS)
             for bins in (32, 256)}
    # Rows narrower than the block's threads (16 slots: each held by several threads), int64 rows.
    found["DSA slab order (16 slots, 16 bins)"] = Build(kernel, pointers, {"BLOCK": 16, "BINS": 16},
                                                        warps=slab_order.NUM_WARPS)
    found["DSA slab order (int64 rows)"] = Build(kernel, {**pointers, "idx_ptr": "*i64"},
                                                 {"BLOCK": slab_order.BLOCK, "BINS": 32}, warps=slab_order.NUM_WARPS)
    from genolc.model.ops.dsa import row_dot

    pointers = {"out_ptr": BF16, "d_out_ptr": BF16, "delta_ptr": "*fp32"}
    for preset, rank, block_r in (("small", 256, 256), ("base", 384, 512)):
        found[f"DSA row dot ({preset})"] = Build(row_dot._kernel(), pointers,
                                                 {"RANK": rank, "ROWS": row_dot.ROWS, "BLOCK_R": block_r},
                                                 warps=row_dot.NUM_WARPS)
    return found


def merge_builds() -> dict[str, Build]:
    """mHC's merge kernels (genolc/model/ops/mhc/merge_triton.py) as the trainer launches them: bf16 streams, fp32
    ``post`` and ``comb`` (hc_mult 4), the default tiles."""
    from genolc.model.ops.mhc import merge_triton

    forward, backward = merge_triton._kernels()
    constexprs = {"N": 4, "ROWS": merge_triton.ROWS, "BLOCK_D": merge_triton.BLOCK_D}
    return {
        "mHC merge forward": Build(forward, {"block_ptr": BF16, "post_ptr": "*fp32", "comb_ptr": "*fp32",
                                             "streams_ptr": BF16, "out_ptr": BF16}, constexprs,
                                   warps=merge_triton.NUM_WARPS),
        "mHC merge backward": Build(backward, {"grad_ptr": BF16, "block_ptr": BF16, "post_ptr": "*fp32",
                                               "comb_ptr": "*fp32", "streams_ptr": BF16, "d_block_ptr": BF16,
                                               "d_post_ptr": "*fp32", "d_comb_ptr": "*fp32",
                                               "d_streams_ptr": BF16}, constexprs, warps=merge_triton.NUM_WARPS),
    }


def topk_builds() -> dict[str, Build]:
    """The indexer's scoring kernel as triton.pool_score_block launches it for both presets' indexer (8 heads x 64
    dims, bf16), alone and writing the groups' tops, and its top-k kernels as triton_topk.top_pools launches them
    for 512 pools a row, into an int32 output."""
    from genolc.model.ops.indexer import triton as indexer
    from genolc.model.ops.indexer import triton_topk
    from genolc.model.ops.indexer import triton_topk_kernel as kernels

    shape = triton_topk.launch_shape(512)
    i32 = "*i32"
    common = {"floors_ptr": i32, "counts_ptr": i32}
    return {
        "indexer scores": Build(indexer._score_kernel(), {"q_ptr": BF16, "w_ptr": "*fp32", "pooled_ptr": BF16,
                                                          "out_ptr": "*fp32"},
                                {"HEADS": 8, "DIM": 64, "BLOCK_D": 64, "BLOCK_M": indexer.BLOCK_QUERIES,
                                 "BLOCK_N": indexer.BLOCK_POOLS, "IEEE": False}),
        "indexer scores with the groups' tops": Build(
            kernels.score_group_tops_kernel, {"q_ptr": BF16, "w_ptr": "*fp32", "pooled_ptr": BF16, "out_ptr": "*fp32",
                                              "tops_ptr": i32},
            {"HEADS": 8, "DIM": 64, "BLOCK_D": 64, "BLOCK_M": indexer.BLOCK_QUERIES, "GROUPS": shape.groups,
             "GROUP_BLOCK": indexer.GROUP_BLOCK, "SEGMENT": shape.segment, "IEEE": False},
            warps=indexer.SCORE_TOPS_WARPS),
        "top-k group tops": Build(kernels.group_tops_kernel, {"scores_ptr": "*fp32", "tops_ptr": i32},
                                  {"GROUPS": shape.groups, "GROUP_ROWS": shape.group_rows, "SEGMENT": shape.segment},
                                  warps=shape.warps),
        "top-k floors": Build(kernels.floors_kernel, {"tops_ptr": i32, **common},
                              {"GROUPS": shape.groups, "SEGMENT": shape.segment}),
        **{f"top-k candidates ({block}-score blocks{', prefetch' if prefetch else ''})": Build(
            kernels.candidates_kernel, {"scores_ptr": "*fp32", **common, "cand_vals_ptr": i32, "cand_ids_ptr": i32},
            {"BLOCK": block, "SEGMENT": shape.segment, "CAP": shape.cap, "PREFETCH": prefetch},
            warps=shape.warps) for block in (shape.block, 512) for prefetch in (False, True)},
        "top-k select": Build(kernels.select_kernel, {"scores_ptr": "*fp32", **common, "cand_vals_ptr": i32,
                                                      "cand_ids_ptr": i32, "pools_ptr": i32},
                              {"KEEP_BLOCK": shape.keep_block, "BLOCK": shape.block, "CAP": shape.cap},
                              warps=shape.select_warps),
    }


def kda_conv_builds() -> dict[str, Build]:
    """KDA's convolution kernels (genolc/model/ops/kda/conv_triton.py) as the layer launches them: bf16 activations,
    fp32 taps (K = 4), q, k, v as three parts, the default tiles."""
    from genolc.model.ops.kda import conv_triton

    config = conv_triton.DEFAULT_CONFIG
    forward, backward = conv_triton._kernels()
    constexprs = {"TAPS": 4, "SEGMENT_ROWS": config.segment_rows, "SEGMENTS": config.segments,
                  "BLOCK_C": config.block_channels}
    strides = ("channels", "part_width", "stride_pb", "stride_pt")
    return {
        "KDA conv forward": Build(
            forward, {"padded_ptr": BF16, "weight_ptr": "*fp32", "out0_ptr": BF16, "out1_ptr": BF16,
                      "out2_ptr": BF16}, constexprs, warps=config.num_warps,
            divisible=("padded_ptr", "weight_ptr", "out0_ptr", "out1_ptr", "out2_ptr", *strides, "stride_ob",
                       "stride_ot")),
        "KDA conv backward": Build(
            backward, {"grad0_ptr": BF16, "grad1_ptr": BF16, "grad2_ptr": BF16, "padded_ptr": BF16,
                       "weight_ptr": "*fp32", "d_padded_ptr": BF16, "d_weight_ptr": "*fp32"}, constexprs,
            warps=config.num_warps,
            divisible=("grad0_ptr", "grad1_ptr", "grad2_ptr", "padded_ptr", "weight_ptr", "d_padded_ptr",
                       "d_weight_ptr", *strides, "stride_gb", "stride_gt", "stride_db", "stride_dt")),
    }


_NAME = r"%[\w#.]+"


def _loops(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of each ``scf.for``, its closing brace included, by brace depth."""
    found = []
    for start, line in enumerate(lines):
        if "scf.for" not in line:
            continue
        depth = 0
        for end in range(start, len(lines)):
            depth += lines[end].count("{") - lines[end].count("}")
            if depth <= 0 and end > start:
                found.append((start, end))
                break
    return found


def refill_races(ttgir: str) -> list[str]:
    """Shared-memory buffers that an asynchronous ``warp_group_dot`` in a loop reads and that the loop writes
    (an async or TMA copy, a ``local_store``) while that dot may still run; and loops it cannot vouch for.

    A buffer of ``N`` slots written ``D`` times before the loop is read at slot ``i mod N`` in step ``i`` and
    written at slot ``(i + D) mod N``. The loop body is walked in order for three steps: each async dot joins the
    dots in flight, each ``warp_group_dot_wait {pendings = P}`` leaves the newest ``P``, and in the third step a
    write to a buffer that a dot of step ``i - j`` still reads is a race when ``(D + j) mod N = 0``. A loop with
    async dots and no wait, or with async dots of its own and a loop inside it, is reported rather than passed (a
    loop whose async dots are all in its inner loops leaves them to those loops' walks when each of those loops'
    last wait leaves no dot pending)."""
    lines = ttgir.splitlines()
    dims = {}
    for line in lines:
        m = re.search(rf"({_NAME}) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<((?:\d+x)+)[a-z]", line)
        if m:
            dims[m.group(1)] = [int(d) for d in m.group(2).rstrip("x").split("x")]
    parent: dict[str, str] = {}
    indexed = set()
    for line in lines:
        m = re.search(rf"({_NAME}) = ttg\.memdesc_(\w+) ({_NAME})", line)
        if m:
            parent[m.group(1)] = m.group(3)
            if m.group(2) == "index" and m.group(3) in dims:
                indexed.add(m.group(3))
    slots = {name: (shape[0] if name in indexed else 1) for name, shape in dims.items()}

    def buffers_in(text: str) -> set[str]:
        found = set()
        for name in re.findall(_NAME, text):
            while name not in dims and name in parent:
                name = parent[name]
            if name in dims:
                found.add(name)
        return found

    def writes(line: str) -> set[str]:
        if "copy_global_to_local" in line or "ttg.local_store" in line:
            return buffers_in(line.split("=", 1)[1] if " = " in line else line)
        return set()

    problems = []
    loops = _loops(lines)
    for start, end in loops:
        body = lines[start + 1:end]
        if not any("ttng.warp_group_dot " in line and "isAsync = true" in line for line in body):
            continue
        # Async dots only inside inner loops: those loops are walked on their own, and when each retires its dots
        # (its last wait leaves none pending) before it exits, none is in flight when the outer body writes.
        inner = [(s, e) for s, e in loops if start < s and e <= end]
        own = [line for i, line in enumerate(body, start + 1) if not any(s <= i <= e for s, e in inner)]
        if not any("ttng.warp_group_dot " in line and "isAsync = true" in line for line in own):
            waits = [[line for line in lines[s:e + 1] if "warp_group_dot_wait" in line] for s, e in inner
                     if any("ttng.warp_group_dot " in line for line in lines[s:e + 1])]
            if all(found and "pendings = 0" in found[-1] for found in waits):
                continue
            problems.append(f"loop at TTGIR line {start + 1}: an inner loop may exit with async dots in flight; "
                            "not analysed")
            continue
        if inner:
            problems.append(f"loop at TTGIR line {start + 1}: async dots and a loop inside it; not analysed")
            continue
        if not any("warp_group_dot_wait" in line for line in body):
            problems.append(f"loop at TTGIR line {start + 1}: async dots with no warp_group_dot_wait inside")
            continue
        ahead: dict[str, int] = {}
        for line in lines[:start]:
            for buffer in writes(line):
                ahead[buffer] = ahead.get(buffer, 0) + 1
        in_flight: list[tuple[set[str], int]] = []
        for step in range(3):
            for line in body:
                if "ttng.warp_group_dot " in line and "isAsync = true" in line:
                    in_flight.append((buffers_in(line.split("warp_group_dot", 1)[1]), step))
                elif "warp_group_dot_wait" in line:
                    pending = int(re.search(r"pendings = (\d+)", line).group(1))
                    in_flight = in_flight[len(in_flight) - pending:] if pending else []
                elif step == 2:
                    for buffer in writes(line):
                        n, d = slots[buffer], ahead.get(buffer, 0)
                        clashing = sorted({step - k for read, k in in_flight
                                           if buffer in read and (d + step - k) % n == 0})
                        if clashing:
                            problems.append(f"{buffer}: {n} slot(s) written {d} ahead, written again while the "
                                            f"async dot of step i-{clashing[0]} may still read it")
    return problems


def _ptxas(ptx: str) -> tuple[int, str | None, int, str]:
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        log = subprocess.run([get_ptxas(ARCH).path, "-v", f"--gpu-name=sm_{ARCH}a", str(source), "-o",
                              str(source) + ".o"], capture_output=True, text=True)
    registers = re.search(r"Used (\d+) registers", log.stderr)
    spills = max((int(n) for n in re.findall(r"(\d+) bytes spill stores", log.stderr)), default=0)
    return log.returncode, registers.group(1) if registers else None, spills, log.stderr


def main() -> int:
    failures = 0
    builds = (moe_builds() | mhc_builds() | merge_builds() | dsa_builds() | pool_mass_builds() | topk_builds()
              | slab_order_builds() | kda_conv_builds() | indexer_kl_builds())
    for name, build in builds.items():
        kernel = build.kernel
        divisible = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(kernel.arg_names)
                     if arg in build.divisible}
        compiled = triton.compile(ASTSource(kernel, _signature(kernel, build.pointers, build.constexprs),
                                            build.constexprs, divisible),
                                  target=GPUTarget("cuda", ARCH, 32),
                                  options={"num_warps": build.warps, "num_stages": build.stages})
        ptx = compiled.asm["ptx"]
        returncode, registers, spills, log = _ptxas(ptx)
        races = refill_races(compiled.asm["ttgir"])
        problems = []
        if returncode or registers is None:
            problems.append(f"ptxas failed: {log.strip()[-300:]}")
        if build.clamps and ".NaN" not in ptx:
            problems.append("the clamps' min/max drop NaN")
        if build.race_expected and not races:
            problems.append("the known refill race was not found: the check is not reading the loop")
        if races and not build.race_expected:
            problems.append("; ".join(races))
        failures += bool(problems)
        seen = f", race found as expected ({races[0]})" if build.race_expected and races else ""
        print(f"{name}: {registers or '?'} registers, {spills} bytes spilled{seen}"
              f"{': FAIL ' + '; '.join(problems) if problems else ''}")
    print("all ok" if failures == 0 else f"{failures} kernel(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
