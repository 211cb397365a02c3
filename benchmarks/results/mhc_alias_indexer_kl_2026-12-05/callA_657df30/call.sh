#!/usr/bin/env bash
# Session 37 device call A: the GPU tests of the kernels sessions 34-37 added, the block-input bench (three ways) and
# the indexer-KL bench (fused against the torch form, slot steps 16/32/64). Takes the git SHA as $1.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s37_devA_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $W/device.txt 2>&1
cp .gpujob/s37_devA.sh $W/call.sh
start=$SECONDS
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_mhc_triton.py tests/gpu/test_indexer_kl_triton.py \
  tests/gpu/test_compile_fast.py tests/gpu/test_mhc_merge_triton.py tests/gpu/test_model_fast_path.py \
  tests/gpu/test_chunked_step_fast.py tests/gpu/test_dsa_slab_inputs_triton.py tests/gpu/test_routing_no_sync.py \
  > $W/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - start)) s)"; grep -E "passed|failed|Error|FAILED" $W/gpu_tests.log | tail -12
start=$SECONDS
(cd benchmarks && OUT=$W timeout 100 python3 bench_mhc_block_input.py > $W/bench_mhc_block_input.log 2>&1)
echo "block input bench rc=$? ($((SECONDS - start)) s)"; grep -v '^ ' $W/bench_mhc_block_input.log | cut -c1-260 | tail -7
start=$SECONDS
(cd benchmarks && OUT=$W timeout $((560 - SECONDS)) python3 bench_indexer_kl.py --sizes 512k --presets small,base \
  --chunk 65536 --block-p 16,32,64 --repeats 3 > $W/bench_indexer_kl.log 2>&1)
echo "indexer kl bench rc=$? ($((SECONDS - start)) s)"; cut -c1-260 $W/bench_indexer_kl.log | tail -9
OUT=$W gpu_env_pack_caches
ls $W
tar -czf $ROOT/s37_devA.tar.gz -C /tmp $(basename $W)
