#!/usr/bin/env bash
# bash benchmarks/run_long_context.sh ARGS...   (on the H200, from the repository root; carry: [".gpu", ".gpudata"])
# Unpacks the GPU packages and the carried caches (fla/Triton autotune results, TileLang's compiled kernels), runs
# bench_long_context.py with ARGS, and packs the caches back into $OUT so the next call compiles nothing.
# GENOLC_GIT_SHA must be set by the caller (the device copy has no .git).
set -uo pipefail
source benchmarks/gpu_env.sh
gpu_env_run benchmarks/bench_long_context.py "$@"
