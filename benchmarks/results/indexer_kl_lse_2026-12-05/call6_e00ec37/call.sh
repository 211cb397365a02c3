#!/usr/bin/env bash
# Session 38 call 6: the indexer KL's GPU tests at TF32 (the default now) and IEEE products, the loss at 512k with
# TF32 and the pool mass alone at four launches, then `small` at 512k
# through finetune with --indexer sparse, 5 steps (call 2: 6.69-6.93 s a step with IEEE products). Takes the full SHA.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s38_call6_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
cp .gpujob/s38_call6.sh $W/call.sh
start=$SECONDS
timeout 90 python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu/test_indexer_kl_triton.py "tests/gpu/test_dsa_triton.py::test_pool_mass_matches_reference" > $W/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - start)) s)"; grep -E "PASSED|FAILED|ERROR|passed|failed|assert" $W/gpu_tests.log | cut -c1-200 | tail -14
start=$SECONDS
(cd benchmarks && OUT=$W BENCH_TAG=_tf32 timeout 75 python3 bench_indexer_kl.py --sizes 512k --presets small,base \
  --chunk 65536 --sides fused --target-lse forward --pool-mass-launch 32x8,64x4,64x8,128x8 --repeats 3) \
  > $W/bench_indexer_kl.log 2>&1
echo "bench rc=$? ($((SECONDS - start)) s)"
python3 - $W/indexer_kl_*_tf32.json <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    fb = r.get("forward_backward", {}).get("ms")
    print(r["preset"], r["side"], r.get("block_p", r.get("block_w")), r.get("warps"), r.get("precision"),
          "fwd", round(r["forward"]["ms"], 2) if "forward" in r else r.get("error"), "fwd+bwd", fb and round(fb, 2),
          "loss", r.get("loss"), "mass", r.get("mass_sum"))
EOF
tar -czf $ROOT/s38_call6.tar.gz -C /tmp $(basename $W)
start=$SECONDS
CURVE_TIMEOUT=$((275 - SECONDS)) CURVE_TAG=_indexer_sparse_tf32 OUT=$W bash benchmarks/run_finetune_curve.sh \
  .gpudata/GRCh37_chrX_1-24000000.fa.gz small 512k 5 --indexer sparse 2>&1 | tail -2
echo "finetune sparse ($((SECONDS - start)) s)"
for f in $W/finetune_curve_*/metrics.jsonl; do echo $f; python3 -c "
import json,sys
for l in open(sys.argv[1]):
  d=json.loads(l); print(d['step'], round(d['loss'],4), round(d['step_seconds'],2), round(d.get('mfu',0),4), d.get('memory_gib'), d.get('aux_indexer_kl'), {k: round(v, 3) for k, v in d.items() if k.endswith('pass_seconds')})" $f; done
tar -czf $ROOT/s38_call6.tar.gz -C /tmp $(basename $W)
