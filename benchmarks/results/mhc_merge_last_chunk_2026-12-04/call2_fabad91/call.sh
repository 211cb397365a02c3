#!/usr/bin/env bash
# Session 33 call 2: the merge kernels' tile sweep; small's 20-step curve at 512k through finetune.
set -u
export GENOLC_GIT_SHA=$1
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
ROOT=$OUT; W=/tmp/s33_call2_${GENOLC_GIT_SHA:0:7}
mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/device.txt 2>&1
OUT=$W timeout 200 python3 benchmarks/bench_mhc_merge.py --stream-dtype bfloat16 --sweep > $W/bench_mhc_merge_sweep.log 2>&1
echo "bench rc=$?"; grep '"op"\|compiled_fp32' $W/bench_mhc_merge_sweep.log | cut -c1-200
python3 - $W/bench_mhc_merge_sweep.log <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"preset"') and '"kernels"' in l]
for preset in ("small", "base"):
    mine = sorted((r for r in rows if r["preset"] == preset), key=lambda r: r["forward_ms"] + r["backward_ms"])
    for r in mine[:4] + [r for r in mine if r["default"]]:
        print(preset, r["config"], r["forward_ms"], r["backward_ms"], "default" if r["default"] else "")
PY
CURVE_TIMEOUT=300 CURVE_TAG=_s33 OUT=$W bash benchmarks/run_finetune_curve.sh .gpudata/GRCh37_chrX_1-24000000.fa.gz small 512k 20 2>&1 | tail -8
for f in $W/finetune_curve_*/metrics.jsonl; do echo $f; python3 -c "
import json,sys
for l in open(sys.argv[1]):
  d=json.loads(l); print(d['step'], round(d['loss'],4), round(d['step_seconds'],2), round(d.get('mfu',0),4), d.get('memory_gib'))" $f; done
ls $W
tar -czf $ROOT/s33_call2.tar.gz -C /tmp $(basename $W)
