#!/usr/bin/env bash
# Session 33 call 3: bare-step profiles of base and small at 512k with the last chunk's fill skipped; small's curve.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s33_call3_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
OUT=$W timeout 170 python3 benchmarks/profile_chunked_step.py --model base --seq 512k --chunks 32k --profile-chunk 32k \
  --warmup-seq 32k --top 40 --compile --profile-kernels-only --kept-attention host > $W/profile_base.log 2>&1
echo "base profile rc=$?"; grep -i "step\|seconds" $W/profile_base.log | tail -4
OUT=$W timeout 130 python3 benchmarks/profile_chunked_step.py --model small --seq 512k --chunks 64k --profile-chunk 64k \
  --warmup-seq 64k --top 40 --compile --profile-kernels-only --kept-attention host --kda-intermediates keep > $W/profile_small.log 2>&1
echo "small profile rc=$?"; grep -i "step\|seconds" $W/profile_small.log | tail -4
CURVE_TIMEOUT=140 CURVE_TAG=_s33_last_chunk OUT=$W bash benchmarks/run_finetune_curve.sh .gpudata/GRCh37_chrX_1-24000000.fa.gz small 512k 8 2>&1 | tail -3
for f in $W/finetune_curve_*/metrics.jsonl; do echo $f; python3 -c "
import json,sys
for l in open(sys.argv[1]):
  d=json.loads(l); print(d['step'], round(d['loss'],4), round(d['step_seconds'],2), round(d.get('mfu',0),4), d.get('memory_gib'))" $f; done
ls $W
tar -czf $ROOT/s33_call3.tar.gz -C /tmp $(basename $W)
