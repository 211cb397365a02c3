"""PYTHONPATH=. /tmp/tri/bin/python tests/gpu/tilelang_lowering_check.py

Lowers genolc's TileLang kernels (the DSA sparse-attention forward, its one-block-per-query backward and the
slab-ordered backward) to CUDA source for sm_90a at the shapes of `small` and `base`, on a machine without a GPU:
TileLang's layout inference, pipelining and CUDA code generation run; nvcc does not. It catches what fails to build
before a device call is spent on it, and checks that the slab-ordered kernel's tail after the peeled loop is guarded
for a (query, slab) pair with no slot. Exit status 0 when everything lowers.

Not part of the CI suite (pytest collects ``test_*.py`` only). Use a throwaway venv, never the project's:

    python3 -m venv /tmp/tri && /tmp/tri/bin/pip install torch==2.13.0 tilelang==0.1.15 \\
        "apache-tvm-ffi>=0.1.11,<0.1.13" "z3-solver>=4.13.0,<4.15.5"
"""

from __future__ import annotations

import sys
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


def main() -> int:
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
                failures.append(f"{preset} {kernel}: {type(error).__name__}: {str(error).splitlines()[-1][:300]}")
                continue
            if kernel == "backward_slabs" and "if (1 <= count)" not in source:
                failures.append(f"{preset} {kernel}: no guard on the loop's tail for a slab with no slot")
    for failure in failures:
        print("FAILED", failure)
    print("all ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
