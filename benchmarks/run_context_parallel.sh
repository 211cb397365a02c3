#!/usr/bin/env bash
# bash benchmarks/run_context_parallel.sh ARGS...   (on nvidia-h200-x2, from the repository root; carry: [".gpu", ".gpudata"])
# Unpacks the GPU packages and the carried caches (fla/Triton autotune results, TileLang's compiled kernels), runs
# bench_context_parallel.py with ARGS, and packs the caches back into $OUT so the next call compiles nothing.
# GENOLC_GIT_SHA must be set by the caller (the device copy has no .git). On nvidia-h200-x4 / -x8 (issue 21) the same
# script takes --cp 4 or 8, --dp 2 (data-parallel groups, against as many processes without CP) and --reference-cp 2
# (against two GPUs per window where one cannot finish the window's steps in a call); a reference too long to share
# a call with its CP runs goes first with --runs one, then --runs cp --one-gpu-from <its record>.
set -uo pipefail
source benchmarks/gpu_env.sh
gpu_env_run benchmarks/bench_context_parallel.py "$@"
