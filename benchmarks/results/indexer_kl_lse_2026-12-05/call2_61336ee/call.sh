#!/usr/bin/env bash
# Session 38 call 2: `small` at 512k through finetune with --indexer sparse, 6 steps (session 32: 10.36-10.66 s a
# step; since then the fused indexer KL and the target reading the forward's lse), then the default (--indexer off)
# for as long as the call allows, same commit. Takes the full git SHA as $1.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s38_call2_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
cp .gpujob/s38_call2.sh $W/call.sh
start=$SECONDS
CURVE_TIMEOUT=330 CURVE_TAG=_indexer_sparse OUT=$W bash benchmarks/run_finetune_curve.sh \
  .gpudata/GRCh37_chrX_1-24000000.fa.gz small 512k 6 --indexer sparse 2>&1 | tail -3
echo "finetune sparse ($((SECONDS - start)) s)"
start=$SECONDS
CURVE_TIMEOUT=$((545 - SECONDS)) CURVE_TAG=_default OUT=$W bash benchmarks/run_finetune_curve.sh \
  .gpudata/GRCh37_chrX_1-24000000.fa.gz small 512k 6 2>&1 | tail -3
echo "finetune default ($((SECONDS - start)) s)"
for f in $W/finetune_curve_*/metrics.jsonl; do echo $f; python3 -c "
import json,sys
for l in open(sys.argv[1]):
  d=json.loads(l); print(d['step'], round(d['loss'],4), round(d['step_seconds'],2), round(d.get('mfu',0),4), d.get('memory_gib'), d.get('aux_indexer_kl'), {k: round(v, 3) for k, v in d.items() if k.endswith('pass_seconds')})" $f; done
tar -czf $ROOT/s38_call2.tar.gz -C /tmp $(basename $W)
