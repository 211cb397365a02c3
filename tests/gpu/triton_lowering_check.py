"""PYTHONPATH=. /tmp/tri/bin/python tests/gpu/triton_lowering_check.py

Compiles genolc's routed-experts glue kernels (genolc/model/ops/moe/triton.py) and mHC mixing kernels
(genolc/model/ops/mhc/triton.py) for sm_90 on a machine without a GPU, with the dtypes and block sizes the ops
launch them with, through Triton's own pipeline and its bundled ``ptxas -v``: it catches what fails to build
before a device call is spent on it, prints each kernel's registers and spill bytes, and checks that the SwiGLU
kernels' clamps compile to NaN-propagating min/max (``.NaN`` in the PTX), as torch's clamp propagates NaN.

It also reads each kernel's pipelined loop in the TTGIR for a shared-memory buffer that an asynchronous wgmma
reads and that the loop refills while that wgmma may still be running (:func:`refill_races`): the mHC forward at
three stages had one (its streams' tile had two buffers, refilled two steps ahead, with one wgmma left in flight),
and its logits differed between identical calls on the H200. The check must find that race in the three-stage
build, or it is not looking.

Exit status 0 when all build, the clamps keep NaN and no launched kernel has such a race; spills are printed,
not failed. (2026-12-02, Triton 3.6.0, ptxas 12.8: the SwiGLU forward 96 registers and 8 bytes spilled, its
backward 190, the combine 191, the gather's backward 99, the combine's backward 192; the mHC forward 232 with one
stage (156 with three), its backward 232; bf16 streams 224 and 216; no other spill.)

Not part of the CI suite (pytest collects ``test_*.py`` only); the throwaway venv of triton_interpreter_check.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from genolc.model.ops.mhc import triton as mhc
from genolc.model.ops.moe import triton as moe

ARCH = 90
BLOCKS = {"ROWS": moe.ROWS, "COLUMNS": moe.COLUMNS}
INTS = ("n_rows", "inter", "n_tokens", "hidden", "n_slots", "n_cols", "n_logits")


def _signature(kernel, pointers: dict[str, str], constexprs: dict) -> dict[str, str]:
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        elif name in ("limit", "eps"):
            signature[name] = "fp32"
        elif name.startswith("stride") or name in INTS:
            signature[name] = "i32"
        else:
            raise ValueError(f"{kernel.fn.__name__}: no type for argument {name}")
    return signature


def kernels() -> dict[str, tuple]:
    bf16 = "*bf16"
    return {
        "swiglu": (moe.swiglu_kernel, {"hidden_ptr": bf16, "out_ptr": bf16}, BLOCKS, True),
        "swiglu backward": (moe.swiglu_backward_kernel,
                            {"grad_ptr": bf16, "hidden_ptr": bf16, "d_hidden_ptr": bf16}, BLOCKS, True),
        "combine (base, K 4)": (moe.combine_kernel,
                                {"rows_ptr": bf16, "position_ptr": "*i64", "weights_ptr": "*fp32", "out_ptr": bf16},
                                {"TOP_K": 4, "WEIGHTED": True, **BLOCKS}, False),
        "gather backward (small, K 2)": (moe.combine_kernel,
                                         {"rows_ptr": bf16, "position_ptr": "*i64", "weights_ptr": bf16,
                                          "out_ptr": bf16}, {"TOP_K": 2, "WEIGHTED": False, **BLOCKS}, False),
        "combine backward (base, K 4)": (moe.combine_backward_kernel,
                                         {"grad_ptr": bf16, "rows_ptr": bf16, "position_ptr": "*i64",
                                          "weights_ptr": "*fp32", "d_rows_ptr": bf16, "d_weights_ptr": "*fp32"},
                                         {"TOP_K": 4, **BLOCKS}, False),
    }


def mhc_kernels() -> dict[str, tuple]:
    """The mHC kernels as the ops launch them (TF32 products, as under autocast): (kernel, pointers, constexprs,
    num_warps, num_stages, whether a refill race is expected)."""
    forward, backward = mhc._kernel(), mhc._backward_kernel()
    config, back = mhc.DEFAULT_CONFIG, mhc.DEFAULT_BACKWARD_CONFIG
    logits = 32      # BLOCK_W for the 24 logits of hc_mult 4
    found = {}
    for dtype in ("fp32", "bf16"):
        pointers = {"x_ptr": f"*{dtype}", "w_ptr": "*fp32", "out_ptr": "*fp32", "rstd_ptr": "*fp32"}
        constexprs = {"BLOCK_ROWS": config.block_rows, "BLOCK_K": config.block_k, "BLOCK_W": logits,
                      "PRECISION": "tf32"}
        found[f"mHC forward ({dtype} streams)"] = (forward, pointers, constexprs, config.num_warps,
                                                   mhc.FORWARD_STAGES, False)
        back_pointers = {"scaled_ptr": "*fp32", "coef_ptr": "*fp32", "x_ptr": f"*{dtype}", "w_ptr": "*fp32",
                         "dx_ptr": f"*{dtype}", "dw_ptr": "*fp32"}
        found[f"mHC backward ({dtype} streams)"] = (
            backward, back_pointers, {"ROWS_PER_PROGRAM": back.rows_per_program, "BLOCK_ROWS": back.block_rows,
                                      "BLOCK_K": back.block_k, "BLOCK_W": logits, "PRECISION": "tf32"},
            back.num_warps, back.num_stages, False)
    three_stages = found["mHC forward (fp32 streams)"]
    found["mHC forward, three stages (the race, expected)"] = three_stages[:4] + (3, True)
    return found


_NAME = r"(%[\w#.]+)"


def refill_races(ttgir: str) -> list[str]:
    """Shared-memory buffers that an asynchronous ``warp_group_dot`` in the kernel's pipelined loop reads and
    that the loop refills (``async_copy_global_to_local``) while that dot may still run.

    A buffer of ``N`` slots filled ``D`` steps ahead (``D`` copies before the loop) is read at slot ``i mod N``
    in step ``i`` and refilled at slot ``(i + D) mod N`` later in the same step. The dots still running then are
    the newest ``P`` (the pendings of the loop's last ``warp_group_dot_wait``), which span the last
    ``ceil(P / G)`` steps for ``G`` dots a step; step ``i - j`` read slot ``(i - j) mod N``. A race is a ``j`` in
    that span with ``(D + j) mod N = 0``."""
    lines = ttgir.splitlines()
    loop = next((n for n, line in enumerate(lines) if "scf.for" in line), None)
    if loop is None:
        return []
    slots = {m.group(1): int(m.group(2)) for m in (re.search(_NAME + r" = ttg\.local_alloc : \(\) -> "
                                                                r"!ttg\.memdesc<(\d+)x\d+x", line)
                                                    for line in lines) if m}
    parent: dict[str, str] = {}
    for line in lines:
        m = re.search(_NAME + r" = ttg\.memdesc_\w+ " + _NAME, line)
        if m:
            parent[m.group(1)] = m.group(2)

    def buffer_of(name: str) -> str | None:
        while name not in slots and name in parent:
            name = parent[name]
        return name if name in slots else None

    def copies(part: list[str]) -> dict[str, int]:
        counted: dict[str, int] = {}
        for line in part:
            m = re.search(r"ttg\.async_copy_global_to_local " + _NAME + ", " + _NAME, line)
            if m and buffer_of(m.group(2)):
                counted[buffer_of(m.group(2))] = counted.get(buffer_of(m.group(2)), 0) + 1
        return counted

    end = next((n for n in range(loop, len(lines)) if "scf.yield" in lines[n]), len(lines))
    body = lines[loop:end + 1]
    ahead, refilled = copies(lines[:loop]), copies(body)
    dots = [re.search(r"ttng\.warp_group_dot " + _NAME + ", " + _NAME, line) for line in body
            if "ttng.warp_group_dot " in line and "isAsync = true" in line]
    waits = [int(m.group(1)) for m in (re.search(r"warp_group_dot_wait .*pendings = (\d+)", line) for line in body)
             if m]
    if not dots or not waits:
        return []
    pending, per_step = waits[-1], len(dots)
    span = range(-(-pending // per_step)) if pending else range(0)
    read = {buffer_of(name) for m in dots for name in m.groups()} - {None}
    races = []
    for buffer in sorted(read & set(refilled)):
        n, d = slots[buffer], ahead.get(buffer, 0)
        clashing = [j for j in span if (d + j) % n == 0]
        if clashing:
            races.append(f"{buffer}: {n} slots filled {d} ahead, refilled while the dot of step i-{clashing[0]} "
                         f"may still read it ({pending} dots pending, {per_step} a step)")
    return races


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
    builds = {name: (kernel, pointers, constexprs, 4, 3, clamps, False)
              for name, (kernel, pointers, constexprs, clamps) in kernels().items()}
    builds |= {name: (kernel, pointers, constexprs, warps, stages, False, race)
               for name, (kernel, pointers, constexprs, warps, stages, race) in mhc_kernels().items()}
    for name, (kernel, pointers, constexprs, warps, stages, clamps, race_expected) in builds.items():
        # The mHC kernels' pointers, row strides and widths are multiples of 16 in every launch (K = 4 x hidden):
        # Triton specializes on that, and without it their loads compile unvectorized and spill.
        divisible = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(kernel.arg_names)
                     if name.startswith("mHC") and (arg.endswith("_ptr") or arg.startswith("stride")
                                                    or arg == "n_cols")}
        compiled = triton.compile(ASTSource(kernel, _signature(kernel, pointers, constexprs), constexprs, divisible),
                                  target=GPUTarget("cuda", ARCH, 32),
                                  options={"num_warps": warps, "num_stages": stages})
        ptx = compiled.asm["ptx"]
        returncode, registers, spills, log = _ptxas(ptx)
        races = refill_races(compiled.asm["ttgir"])
        problems = []
        if returncode or registers is None:
            problems.append(f"ptxas failed: {log.strip()[-300:]}")
        if clamps and ".NaN" not in ptx:
            problems.append("the clamps' min/max drop NaN")
        if race_expected and not races:
            problems.append("the known refill race was not found: the check is not reading the loop")
        if races and not race_expected:
            problems.append("refill race: " + "; ".join(races))
        failures += bool(problems)
        seen = f", race found as expected ({races[0]})" if race_expected and races else ""
        print(f"{name}: {registers or '?'} registers, {spills} bytes spilled{seen}"
              f"{': FAIL ' + '; '.join(problems) if problems else ''}")
    print("all ok" if failures == 0 else f"{failures} kernel(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
