#!/usr/bin/env bash
# bash benchmarks/run_gpu_checks.sh SECTION[:SECONDS]...   (on the H200, from the repository root; carry: [".gpu"])
#
# The kernels issue's GPU checks, in sections that fit one device call of <= 9 minutes when combined sensibly:
#   tests    - tests/gpu, or the files in $GPU_TESTS (every fast op vs its reference; the whole model fast vs reference)
#   kda      - bench_kda.py: small/base at 64k/256k/1M (the base 1M row is the < 20 GiB target)
#   dsa      - bench_dsa.py: small/base at 64k/256k/1M
#   indexer  - bench_indexer.py: 64k/256k/1M
#   moe      - bench_moe.py: small/base at 64k/256k/1M
#   tilelang - bench_dsa_tilelang.py: the TileLang sparse-attention forward against the Triton one
# $BENCH_ARGS go to the kda/dsa/indexer/moe benchmarks (e.g. "--presets base"). SECONDS caps a section (default 300);
# keep the sum under the device call's 600 s.
# Results land in $OUT (the benchmarks' JSON and logs; sections.txt: nvidia-smi, then each section's time).
# fla autotunes every kernel afresh on a new machine, once per head count (~15-20 s a kernel, minutes in all:
# that cut two of 2026-11-29's calls short). Triton keeps the results as *.autotune.json in its cache; they go to
# $OUT/triton-autotune.tar.gz (small, unlike the compiled kernels) - copy it to .gpu/ and the next call unpacks it,
# so only the chosen configs are compiled. GENOLC_GIT_SHA must be set by the caller (the device copy has no .git).
# tests runs one pytest per file, so a time limit cuts one file, not the failure report of the others.
set -uo pipefail
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi >"$OUT/sections.txt"     # also shows whether anything else is on the GPU
rc=0
for spec in "$@"; do
  section="${spec%%:*}"
  limit=300
  [ "$section" != "$spec" ] && limit="${spec#*:}"
  start=$SECONDS
  echo "section $section (limit $limit s) starts at $(date +%T)" | tee -a "$OUT/sections.txt"
  case "$section" in
    tests)
      status=0
      deadline=$((SECONDS + limit))
      for file in ${GPU_TESTS:-tests/gpu/test_*.py}; do
        left=$((deadline - SECONDS))
        [ "$left" -le 5 ] && { echo "no time left for $file" | tee -a "$OUT/gpu-tests.log"; status=124; break; }
        timeout "$left" python3 -m pytest "$file" -m gpu -p no:cacheprovider -v --tb=short --durations=5 2>&1 \
          | tee -a "$OUT/gpu-tests.log"
        status=$((status | ${PIPESTATUS[0]}))
      done ;;
    kda|dsa|indexer|moe)
      (cd benchmarks && timeout "$limit" python3 "bench_$section.py" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/$section.log"; exit "${PIPESTATUS[0]}")
      status=$? ;;
    tilelang)
      (cd benchmarks && timeout "$limit" python3 bench_dsa_tilelang.py 2>&1 | tee "$OUT/tilelang.log"; exit "${PIPESTATUS[0]}")
      status=$? ;;
    *) echo "unknown section $section (use tests, kda, dsa, indexer, moe, tilelang)"; status=2 ;;
  esac
  echo "section $section: exit $status in $((SECONDS - start)) s" | tee -a "$OUT/sections.txt"
  rc=$((rc | status))
  # After every section: a call cut short by the device's limit still brings back what was tuned so far.
  gpu_env_pack_caches
done
exit $rc
