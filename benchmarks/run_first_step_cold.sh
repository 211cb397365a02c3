#!/usr/bin/env bash
# bash benchmarks/run_first_step_cold.sh [MODEL:SEQ ...]   (on the H200, from the repository root; carry:
#   [".gpu", ".gpudata"]; GENOLC_GIT_SHA set by the caller; default: small:128k base:128k)
# Issue 14's first step on a machine whose caches are all empty, for each MODEL:SEQ: `finetune` with the kernel
# warm-up (genolc/train/kernel_warmup.py) and, if $COLD_CONTROL is set, again with GENOLC_KERNEL_WARMUP=0, each in
# new, empty cache folders; if $COLD_SECOND is set, a second run on the caches the first left (issue 14: the caches
# persist so that the second run starts at once). Each is benchmarks/run_finetune_curve.sh with GPU_EMPTY_CACHES=1
# and CURVE_SAMPLE=1: 2 steps, the main thread sampled. Everything comes back as one archive,
# $OUT/first_step_cold.tar.gz (a device call returns at most 8 files: the 2026-12-01 runs lost two of three
# folders). Here: mkdir -p DIR && tar -xzf first_step_cold.tar.gz -C DIR. $COLD_TIMEOUT (seconds a run, default
# 200) bounds each run.
set -uo pipefail
: "${OUT:?run it on the device machine, where \$OUT is set (or set OUT to a folder)}"
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(small:128k base:128k)
fasta=.gpudata/GRCh37_chrX_1-24000000.fa.gz
collected=$(mktemp -d /tmp/first-step-cold.XXXX)
for run in "${runs[@]}"; do
  model=${run%%:*} seq=${run##*:}
  for warmup in on ${COLD_CONTROL:+off} ${COLD_SECOND:+second}; do
    tag=_cold_warmup_$warmup
    env_warmup=()
    [ "$warmup" = off ] && env_warmup=(GENOLC_KERNEL_WARMUP=0)
    # The "on" run's cache folders are kept for the "second" run (a user's second run on the same machine).
    caches=/tmp/first-step-caches-$model-$seq-$warmup
    [ "$warmup" = second ] && tag=_second_run caches=/tmp/first-step-caches-$model-$seq-on
    [ "$warmup" = second ] || rm -rf "$caches"
    env "${env_warmup[@]}" GPU_EMPTY_CACHES=1 GPU_CACHES_FROM="$caches" CURVE_SAMPLE=1 \
      CURVE_TIMEOUT="${COLD_TIMEOUT:-200}" CURVE_TAG="$tag" \
      bash benchmarks/run_finetune_curve.sh "$fasta" "$model" "$seq" 2 \
      | grep -v 'TileLang\|softmax\|^$' | tail -4
    mv "$OUT/finetune_curve_${model}_${seq}${tag}" "$collected/"
    python3 - "$collected/finetune_curve_${model}_${seq}${tag}" <<'EOF'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
steps = [json.loads(line) for line in open(folder / "metrics.jsonl")] if (folder / "metrics.jsonl").exists() else []
sample = json.loads((folder / "wall_sample.json").read_text()) if (folder / "wall_sample.json").exists() else {}
print(folder.name, "step seconds:", [round(s["step_seconds"], 1) for s in steps],
      "main thread:", sample.get("seconds_by_kind"))
EOF
  done
  rm -rf /tmp/first-step-caches-"$model"-"$seq"-*
done
rm -f "$OUT"/*.tar.gz
tar -czf "$OUT/first_step_cold.tar.gz" -C "$collected" .
