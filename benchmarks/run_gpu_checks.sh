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
# $BENCH_ARGS go to the kda/dsa/indexer/moe benchmarks (e.g. "--presets base"). SECONDS caps a section (default 300); keep the sum under the device call's 600 s with room for the cache tarball.
# Results land in $OUT (the benchmarks' JSON and logs; sections.txt: nvidia-smi, then each section's time). Triton's cache goes to $OUT/triton-cache.tar.gz;
# carry it back as .gpu/triton-cache.tar.gz in the next call (it is unpacked here when present) so fla does not
# re-tune every shape on a fresh machine. GENOLC_GIT_SHA must be set by the caller (the device copy has no .git).
set -uo pipefail
OUT="${OUT:-/tmp/genolc-gpu-out}"
mkdir -p "$OUT" /tmp/site
tar -xJf .gpu/site.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache OUT
mkdir -p "$TRITON_CACHE_DIR"
[ -f .gpu/triton-cache.tar.gz ] && tar -xzf .gpu/triton-cache.tar.gz -C "$TRITON_CACHE_DIR"
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
      timeout "$limit" python3 -m pytest ${GPU_TESTS:-tests/gpu} -m gpu -p no:cacheprovider -v --durations=0 --timeout 200 2>&1 \
        | tee "$OUT/gpu-tests.log"
      status=${PIPESTATUS[0]} ;;
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
done
tar -czf "$OUT/triton-cache.tar.gz" -C "$TRITON_CACHE_DIR" . 2>/dev/null
exit $rc
