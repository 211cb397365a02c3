"""PYTHONPATH=. /tmp/tri/bin/python tests/gpu/tilelang_lowering_check.py [--nvcc PATH]

Lowers genolc's TileLang kernels (the DSA sparse-attention forward, its one-block-per-query backward and the
slab-ordered backward) to CUDA source for sm_90a at the shapes of `small` and `base`, on a machine without a GPU:
TileLang's layout inference, pipelining and CUDA code generation run. It catches what fails to build before a
device call is spent on it, and checks that the slab-ordered kernel's tail after the peeled loop is guarded for a
(query, slab) pair with no slot. With ``--nvcc``, each source is also compiled to a cubin (``-Xptxas -v``) and its
registers and spill bytes are printed; a compile error fails the check, a spill is reported. Exit status 0 when all
builds. (2026-12-02, nvcc 13.0: the forward 123 registers at `small`, 255 and 8 bytes spilled at `base`; the
one-block-per-query backward 182 and 254, as backward.py says; the slab-ordered backward 162 and 219; no other
spills.)

Not part of the CI suite (pytest collects ``test_*.py`` only). Use a throwaway venv, never the project's:

    python3 -m venv /tmp/tri && /tmp/tri/bin/pip install torch==2.13.0 tilelang==0.1.15 \\
        "apache-tvm-ffi>=0.1.11,<0.1.13" "z3-solver>=4.13.0,<4.15.5"

and, for ``--nvcc``, CUDA 13's compiler from PyPI unpacked in one folder (nvcc, cicc, the crt and runtime headers):

    /tmp/tri/bin/pip download --no-deps -d /tmp/nvwheels "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" \\
        "nvidia-cuda-crt==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"
    for w in /tmp/nvwheels/*.whl; do unzip -q -o "$w" -d /tmp/nv13; done     # --nvcc /tmp/nv13/nvidia/cu13/bin/nvcc
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import tilelang
from tvm.target import Target

from genolc.model.ops.dsa.tilelang import backward, backward_slabs, forward
from genolc.model.presets import base, small

TARGET = Target({"kind": "cuda", "arch": "sm_90a"})


def lower(name: str, func) -> str:
    start = time.monotonic()
    with TARGET:
        artifact = tilelang.lower(func, target=TARGET)
    source = str(getattr(artifact, "kernel_source", artifact))
    print(f"{name}: lowered in {time.monotonic() - start:.1f} s, {len(source)} characters of CUDA")
    return source


def compile_cubin(nvcc: str, name: str, source: str) -> str | None:
    """Compiles ``source`` for sm_90a and prints its registers and spills; None when it compiles, else the error."""
    tilelang_dir = os.path.dirname(tilelang.__file__)
    cuda_include = os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cu")
        with open(path, "w") as handle:
            handle.write(source)
        result = subprocess.run(
            [nvcc, "-std=c++17", "-arch=sm_90a", "-cubin", "-O3", "-Xptxas", "-v", "--use_fast_math", "-w",
             f"-I{tilelang_dir}/src", f"-I{tilelang_dir}/3rdparty/cutlass/include", f"-I{cuda_include}",
             f"-I{cuda_include}/cccl", "-DENABLE_BF16", "-o", os.path.join(folder, "kernel.cubin"), path],
            capture_output=True, text=True)
    if result.returncode != 0:
        return "nvcc: " + result.stderr.strip().splitlines()[-1][:300] if result.stderr.strip() else "nvcc failed"
    registers = re.findall(r"Used (\d+) registers", result.stderr)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", result.stderr)]
    print(f"{name}: {', '.join(registers)} registers, {sum(spills)} bytes spilled")
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvcc", help="CUDA 13 nvcc: also compile each kernel and report registers and spills")
    args = parser.parse_args()
    failures = []
    for preset, config in (("small", small()), ("base", base())):
        heads, rank = config.num_attention_heads, config.kv_lora_rank
        width = config.index_topk + config.index_kpool - 1
        scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
        builds = {
            "forward": lambda: forward.build_prim_func(heads, rank, width, "bfloat16", scale,
                                                       forward.default_config(rank)),
            "backward": lambda: backward.build_backward_prim_func(heads, rank, width, "bfloat16", scale,
                                                                  backward.default_backward_config(rank)),
            "backward_slabs": lambda: backward_slabs.build_slabbed_backward_prim_func(
                heads, rank, width, "bfloat16", scale, backward_slabs.default_slabbed_config(rank)),
        }
        for kernel, build in builds.items():
            try:
                source = lower(f"{preset} {kernel}", build())
            except Exception as error:  # noqa: BLE001 - every kernel is reported, then the exit status says
                last_line = (str(error).strip().splitlines() or [""])[-1]
                failures.append(f"{preset} {kernel}: {type(error).__name__}: {last_line[:300]}")
                continue
            if kernel == "backward_slabs" and "if (1 <= count)" not in source:
                failures.append(f"{preset} {kernel}: no guard on the loop's tail for a slab with no slot")
            if args.nvcc:
                problem = compile_cubin(args.nvcc, f"{preset} {kernel}", source)
                if problem:
                    failures.append(f"{preset} {kernel}: {problem}")
    for failure in failures:
        print("FAILED", failure)
    print("all ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
