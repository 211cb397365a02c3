#!/usr/bin/env bash
# bash benchmarks/run_gpu_checks.sh [tests|kda1m|all]   (on the H200, from the repository root; carry: [".gpu"])
#
# The GPU checks still owed by the kernels issue, packed into one device call of <= 9 minutes:
#   tests  - tests/gpu (every fast op vs its reference, and the whole model fast vs reference), fla warmed up first
#   kda1m  - the base-shape segment-wise KDA at 1M tokens, fwd+bwd: the < 20 GiB target
# Triton's compile/autotune cache goes to $OUT/triton-cache.tar.gz; carry it back as .gpu/triton-cache.tar.gz in the
# next call (it is unpacked here when present) so fla does not re-tune every shape on a fresh machine.
# GENOLC_GIT_SHA must be set by the caller (the device copy has no .git).
set -uo pipefail
what="${1:-all}"
OUT="${OUT:-/tmp/genolc-gpu-out}"
mkdir -p "$OUT" /tmp/site
tar -xJf .gpu/site.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
mkdir -p "$TRITON_CACHE_DIR"
[ -f .gpu/triton-cache.tar.gz ] && tar -xzf .gpu/triton-cache.tar.gz -C "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout 330 python3 -m pytest tests/gpu -m gpu -p no:cacheprovider -q -x --timeout 300 2>&1 | tee "$OUT/gpu-tests.log"
  rc=$((rc | ${PIPESTATUS[0]}))
fi
if [ "$what" = kda1m ] || [ "$what" = all ]; then
  (cd benchmarks && timeout 200 python3 bench_kda.py --sizes 1M --presets base 2>&1 | tee "$OUT/kda-1m.log")
  rc=$((rc | ${PIPESTATUS[0]}))
  cp benchmarks/results/kda_*.json "$OUT/" 2>/dev/null
fi
tar -czf "$OUT/triton-cache.tar.gz" -C "$TRITON_CACHE_DIR" . 2>/dev/null
exit $rc
