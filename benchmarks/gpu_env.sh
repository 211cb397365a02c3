# Sourced by the benchmarks' run_*.sh on the device machine, from the repository root (carry: [".gpu", ...]).
# gpu_env_setup: unpacks the GPU packages (.gpu/site.tar.xz, made by ../shared/gpu/pack.sh) and the carried caches
# (fla/Triton autotune results, TileLang's compiled kernels, torch.compile's cache when carried), and exports
# PYTHONPATH, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and OUT.
# gpu_env_pack_caches: packs the caches into $OUT; copy them to .gpu/ so the next call compiles nothing.
# NVLink multicast stays off on every kind (the device's KINDS.md: it can take a host's shared GPUs out of service).
gpu_env_setup() {
  OUT="${OUT:-/tmp/genolc-gpu-out}"
  mkdir -p "$OUT" /tmp/site /tmp/triton-cache /tmp/inductor-cache
  tar -xJf .gpu/site.tar.xz -C /tmp/site || return 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache OUT
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  # GPU_EMPTY_CACHES=1: start as a new user's machine does (issue 14's first step with every cache empty).
  [ -n "${GPU_EMPTY_CACHES:-}" ] && return 0
  [ -f .gpu/triton-autotune.tar.gz ] && tar -xzf .gpu/triton-autotune.tar.gz -C "$TRITON_CACHE_DIR"
  [ -f .gpu/tilelang-cache.tar.gz ] && tar -xzf .gpu/tilelang-cache.tar.gz -C "$HOME"
  [ -f .gpu/inductor-cache.tar.gz ] && tar -xzf .gpu/inductor-cache.tar.gz -C /tmp/inductor-cache
  return 0
}

gpu_env_pack_caches() {
  (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | tar -czf "$OUT/triton-autotune.tar.gz" -T -)
  tar -czf "$OUT/tilelang-cache.tar.gz" -C "$HOME" .tilelang 2>/dev/null
  # torch.compile's cache (16 MB packed for small and base) does not fit beside .gpu/ in a call's carry: on request.
  [ -n "${GPU_PACK_INDUCTOR:-}" ] && tar -czf "$OUT/inductor-cache.tar.gz" -C /tmp/inductor-cache . 2>/dev/null
  return 0
}

# gpu_env_run SCRIPT ARGS...: the whole call of a run_*.sh: setup, SCRIPT with ARGS (its output also in
# $OUT/bench.log, indented lines left out of the call's reply), the caches packed; returns SCRIPT's exit code.
gpu_env_run() {
  gpu_env_setup || return 1
  local script="$1"
  shift
  python3 "$script" "$@" 2>&1 | tee -a "$OUT/bench.log" | grep -v '^ '
  local rc=${PIPESTATUS[0]}
  gpu_env_pack_caches
  return "$rc"
}
