#!/usr/bin/env bash
# Session 38 call 5: the fused sparse indexer KL at 512k (64k queries, the target reading the forward's lse) at
# 64 and 128 slots a step, 4 and 8 warps, ieee and tf32 products, `small` and `base`. Takes the full git SHA as $1.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s38_call5_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
cp .gpujob/s38_call5.sh $W/call.sh
start=$SECONDS
(cd benchmarks && OUT=$W BENCH_TAG=_sweep timeout 400 python3 bench_indexer_kl.py --sizes 512k --presets small,base \
  --chunk 65536 --sides fused --target-lse forward --block-p 64,128 --warps 4,8 --precision ieee,tf32 --repeats 3) \
  > $W/bench_indexer_kl.log 2>&1
echo "bench rc=$? ($((SECONDS - start)) s)"
python3 - $W/indexer_kl_*_sweep.json <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    fb = r.get("forward_backward", {}).get("ms")
    print(r["preset"], r.get("block_p"), r.get("warps"), r.get("precision"), "fwd", round(r["forward"]["ms"], 2) if "forward" in r else None,
          "fwd+bwd", round(fb, 2) if fb else r.get("error"), "loss", r.get("loss"), "grads", r.get("grad_norms"))
EOF
tail -3 $W/bench_indexer_kl.log
tar -czf $ROOT/s38_call5.tar.gz -C /tmp $(basename $W)
