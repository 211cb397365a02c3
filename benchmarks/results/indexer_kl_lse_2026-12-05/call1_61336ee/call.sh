#!/usr/bin/env bash
# Session 38 call 1: GPU tests (the pool mass given the forward's lse, the block-input op's scale limit, the indexer
# KL, the chunked step and model fast paths), then the sparse indexer KL at 512k with the target's own normaliser
# against the forward's. Takes the full git SHA as $1.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s38_call1_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $W/device.txt 2>&1
cp .gpujob/s38_call1.sh $W/call.sh
start=$SECONDS
timeout 250 python3 -m pytest -v -m gpu -p no:cacheprovider --durations=0 \
  "tests/gpu/test_dsa_triton.py::test_pool_mass_matches_reference" tests/gpu/test_indexer_kl_triton.py \
  tests/gpu/test_mhc_triton.py::test_block_input_op_matches_fp64_autograd tests/gpu/test_chunked_step_fast.py \
  tests/gpu/test_model_fast_path.py > $W/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - start)) s)"; grep -E "PASSED|FAILED|ERROR|passed|failed" $W/gpu_tests.log | cut -c1-150 | tail -30
start=$SECONDS
(cd benchmarks && OUT=$W timeout 200 python3 bench_indexer_kl.py --sizes 512k --presets small,base --chunk 65536 \
  --sides fused --target-lse own,forward --repeats 3) > $W/bench_indexer_kl.log 2>&1
echo "bench rc=$? ($((SECONDS - start)) s)"; grep "^{" $W/bench_indexer_kl.log | cut -c1-400
ls $W; ls benchmarks/results/ | grep indexer_kl_ ; cp benchmarks/results/indexer_kl_*.json $W/ 2>/dev/null
gpu_env_pack_caches
tar -czf $ROOT/s38_call1.tar.gz -C /tmp $(basename $W)
