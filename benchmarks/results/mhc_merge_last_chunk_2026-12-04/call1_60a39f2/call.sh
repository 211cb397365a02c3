#!/usr/bin/env bash
# Session 33 call 1: mHC merge kernels: GPU tests, the merge bench, bare-step profiles of base and small at 512k.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s33_call1_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_mhc_merge_triton.py tests/gpu/test_mhc_triton.py \
  tests/gpu/test_model_fast_path.py > $W/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; tail -4 $W/gpu_tests.log
OUT=$W timeout 90 python3 benchmarks/bench_mhc_merge.py --stream-dtype bfloat16 > $W/bench_mhc_merge.log 2>&1
echo "bench rc=$?"; tail -6 $W/bench_mhc_merge.log
OUT=$W timeout 170 python3 benchmarks/profile_chunked_step.py --model base --seq 512k --chunks 32k --profile-chunk 32k \
  --warmup-seq 32k --top 40 --compile --profile-kernels-only --kept-attention host > $W/profile_base.log 2>&1
echo "base profile rc=$?"; tail -4 $W/profile_base.log
OUT=$W timeout 130 python3 benchmarks/profile_chunked_step.py --model small --seq 512k --chunks 64k --profile-chunk 64k \
  --warmup-seq 64k --top 40 --compile --profile-kernels-only --kept-attention host --kda-intermediates keep > $W/profile_small.log 2>&1
echo "small profile rc=$?"; tail -4 $W/profile_small.log
ls $W
tar -czf $ROOT/s33_call1.tar.gz -C /tmp $(basename $W)
