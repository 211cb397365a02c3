"""PYTHONPATH=. /tmp/tri/bin/python tests/gpu/triton_lowering_check.py

Compiles genolc's routed-experts glue kernels (genolc/model/ops/moe/triton.py) for sm_90 on a machine without a
GPU, with the dtypes and block sizes the ops launch them with, through Triton's own pipeline and its bundled
``ptxas -v``: it catches what fails to build before a device call is spent on it, prints each kernel's registers
and spill bytes, and checks that the SwiGLU kernels' clamps compile to NaN-propagating min/max (``.NaN`` in the
PTX), as torch's clamp propagates NaN. Exit status 0 when all build and the clamps keep NaN; spills are printed,
not failed. (2026-12-02, Triton 3.6.0, ptxas 12.8: the SwiGLU forward 96 registers and 8 bytes spilled, its
backward 190, the combine 191, the gather's backward 99, the combine's backward 192; no other spill.)

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

from genolc.model.ops.moe import triton as moe

ARCH = 90
BLOCKS = {"ROWS": moe.ROWS, "COLUMNS": moe.COLUMNS}
INTS = ("n_rows", "inter", "n_tokens", "hidden", "n_slots")


def _signature(kernel, pointers: dict[str, str], constexprs: dict) -> dict[str, str]:
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        elif name == "limit":
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


def main() -> int:
    ptxas = get_ptxas(ARCH).path
    failures = 0
    for name, (kernel, pointers, constexprs, clamps) in kernels().items():
        compiled = triton.compile(ASTSource(kernel, _signature(kernel, pointers, constexprs), constexprs),
                                  target=GPUTarget("cuda", ARCH, 32))
        ptx = compiled.asm["ptx"]
        with tempfile.TemporaryDirectory() as folder:
            source = Path(folder) / "kernel.ptx"
            source.write_text(ptx)
            log = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{ARCH}a", str(source), "-o", str(source) + ".o"],
                                 capture_output=True, text=True)
        registers = re.search(r"Used (\d+) registers", log.stderr)
        spills = max((int(n) for n in re.findall(r"(\d+) bytes spill stores", log.stderr)), default=0)
        problems = []
        if log.returncode or registers is None:
            problems.append(f"ptxas failed: {log.stderr.strip()[-300:]}")
        if clamps and ".NaN" not in ptx:
            problems.append("the clamps' min/max drop NaN")
        failures += bool(problems)
        used = registers.group(1) if registers else "?"
        print(f"{name}: {used} registers, {spills} bytes spilled{': FAIL ' + '; '.join(problems) if problems else ''}")
    print("all ok" if failures == 0 else f"{failures} kernel(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
