#!/usr/bin/env bash
# GENOLC_GIT_SHA=<sha> bash benchmarks/run_score_routing.sh   (on the H200, from the repository root;
# carry: [".gpu", ".gpudata"]; one device call, under 8 minutes)
# Issue 16's and 19's GPU figures in one call: bench_score.py (`genolc score` variants/s and `genolc embed`
# regions/s for `small` at 8k and 64k windows, peak memory) then bench_routing.py (`genolc eval --routing` of
# `small` at 4k/64k/512k on held-out chrX). Unpacks the GPU packages and the carried caches like
# run_long_context.sh and packs the Triton autotune results back into $OUT. Each part has a hard time limit
# (SCORE_SECONDS, ROUTING_SECONDS: 255 + 170 s by default) and writes its JSON as it goes, so a slow part cannot
# take the other's time. GENOLC_GIT_SHA must be set by the caller (the device copy has no .git).
set -uo pipefail
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
score_seconds="${SCORE_SECONDS:-255}"
routing_seconds="${ROUTING_SECONDS:-170}"
start=$SECONDS
timeout -k 10 "$score_seconds" python3 benchmarks/bench_score.py \
    --genome .gpudata/GRCh37_chr22_20000001-21000000.fa.gz --model small --windows 8k,64k \
    --variants 8k:256,64k:32 --regions 8k:64,64k:16 --timeout 150 --budget $((score_seconds - 75)) \
    2>&1 | tee -a "$OUT/bench_score.log"
rc=${PIPESTATUS[0]}
echo "score/embed: ${rc} after $((SECONDS - start)) s"
start=$SECONDS
timeout -k 10 "$routing_seconds" python3 benchmarks/bench_routing.py \
    --fasta .gpudata/GRCh37_chrX_1-24000000.fa.gz --heldout X:1-8000000 --model small --lengths 4k,64k,512k \
    --max-tokens 512k --timeout $((routing_seconds - 30)) 2>&1 | tee -a "$OUT/bench_routing.log"
rc2=${PIPESTATUS[0]}
echo "routing: ${rc2} after $((SECONDS - start)) s"
gpu_env_pack_caches
[ "$rc" -eq 0 ] && exit "$rc2"
exit "$rc"
