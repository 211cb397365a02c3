#!/usr/bin/env bash
# Session 38 call 3: `small`'s 512k step profiled with --indexer sparse (where the sparse mode's time goes after the
# fused KL and the lse-fed target), then `base`'s bare 512k step profiled at this commit. Takes the full git SHA as $1.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s38_call3_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
cp .gpujob/s38_call3.sh $W/call.sh
start=$SECONDS
mkdir -p $W/small_sparse
OUT=$W/small_sparse timeout 290 python3 benchmarks/profile_chunked_step.py --model small --seq 512k --chunks 64k \
  --profile-chunk 64k --warmup-seq 64k --top 150 --compile --profile-kernels-only --kept-attention host \
  --kda-intermediates keep --indexer sparse > $W/profile_small_sparse.log 2>&1
echo "small sparse profile rc=$? ($((SECONDS - start)) s)"; grep "phase" $W/profile_small_sparse.log | tail -3
start=$SECONDS
mkdir -p $W/base
OUT=$W/base timeout $((555 - SECONDS)) python3 benchmarks/profile_chunked_step.py --model base --seq 512k --chunks 32k \
  --profile-chunk 32k --warmup-seq 32k --top 150 --compile --profile-kernels-only --kept-attention host \
  --kda-intermediates keep > $W/profile_base.log 2>&1
echo "base profile rc=$? ($((SECONDS - start)) s)"; grep "phase" $W/profile_base.log | tail -3
OUT=$W gpu_env_pack_caches
ls -R $W | head -30
tar -czf $ROOT/s38_call3.tar.gz -C /tmp $(basename $W)
