#!/usr/bin/env bash
# Session 37 device call B: small's bare 512k step profiled (the MFU after sessions 35-37; session 33: 5.87 s,
# 9.40 %), then the GPU tests call A's 250 s did not reach, verbose. Takes the git SHA as $1.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s37_devB_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
cp .gpujob/s37_devB.sh $W/call.sh
start=$SECONDS
OUT=$W timeout 340 python3 benchmarks/profile_chunked_step.py --model small --seq 512k --chunks 64k \
  --profile-chunk 64k --warmup-seq 64k --top 150 --compile --profile-kernels-only --kept-attention host \
  --kda-intermediates keep > $W/profile_small.log 2>&1
echo "small profile rc=$? ($((SECONDS - start)) s)"; grep -v "^ " $W/profile_small.log | cut -c1-200 | tail -16
start=$SECONDS
timeout $((565 - SECONDS)) bash -c 'python3 -m pytest -v -m gpu -p no:cacheprovider --durations=0 \
  tests/gpu/test_indexer_kl_triton.py tests/gpu/test_compile_fast.py tests/gpu/test_dsa_slab_inputs_triton.py;
  python3 -m pytest -v -m gpu -p no:cacheprovider --durations=0 tests/gpu/test_mhc_triton.py -k block_input' \
  > $W/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - start)) s)"; grep -E "PASSED|FAILED|ERROR|passed|failed" $W/gpu_tests.log | cut -c1-150 | tail -25
OUT=$W gpu_env_pack_caches
tar -czf $ROOT/s37_devB.tar.gz -C /tmp $(basename $W)
