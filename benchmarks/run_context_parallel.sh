#!/usr/bin/env bash
# bash benchmarks/run_context_parallel.sh ARGS...   (on nvidia-h200-x2, from the repository root; carry: [".gpu", ".gpudata"])
# Unpacks the GPU packages and the carried caches (fla/Triton autotune results, TileLang's compiled kernels), runs
# bench_context_parallel.py with ARGS, and packs the caches back into $OUT so the next call compiles nothing.
# GENOLC_GIT_SHA must be set by the caller (the device copy has no .git).
set -uo pipefail
OUT="${OUT:-/tmp/genolc-gpu-out}"
mkdir -p "$OUT" /tmp/site /tmp/triton-cache
tar -xJf .gpu/site.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache OUT
# NVLink multicast stays off (the device's KINDS.md: it can take the host's shared GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f .gpu/triton-autotune.tar.gz ] && tar -xzf .gpu/triton-autotune.tar.gz -C "$TRITON_CACHE_DIR"
[ -f .gpu/tilelang-cache.tar.gz ] && tar -xzf .gpu/tilelang-cache.tar.gz -C "$HOME"
python3 benchmarks/bench_context_parallel.py "$@" 2>&1 | tee -a "$OUT/bench.log" | grep -v '^ '
rc=${PIPESTATUS[0]}
(cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | tar -czf "$OUT/triton-autotune.tar.gz" -T -)
tar -czf "$OUT/tilelang-cache.tar.gz" -C "$HOME" .tilelang 2>/dev/null
exit $rc
