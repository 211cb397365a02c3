#!/usr/bin/env bash
# bash benchmarks/run_plan_peaks.sh SPEC...   (on the H200, from the repository root; carry: [".gpu"];
#   GENOLC_GIT_SHA set by the caller)
# The chunked step's peak memory at several windows and chunk lengths, the measurements genolc/train/plan.py is
# fitted to: one benchmarks/profile_chunked_step.py process per SPEC, ``MODEL[+recompute][+eager]=SEQ:CHUNK,...``
# (e.g. ``base=512k:16k,512k:32k`` or ``base+recompute=1M:32k``), compiled as finetune runs unless +eager, bf16
# streams, each row's peak beside AdamW's state and the plan's estimate. A row that runs out of memory is recorded
# as such. Results: $OUT/peaks_<model>[_recompute][_compiled].json and peaks.log. $PEAKS_TIMEOUT (seconds, default
# 300) bounds each process. GPU_CACHES_FROM=DIR takes the kernel caches from DIR/{triton,inductor,tilelang} (the
# folders a run_finetune_curve.sh run with GPU_EMPTY_CACHES=1 and the same GPU_CACHES_FROM left) instead of the
# carried ones.
set -uo pipefail
usage="usage: bash benchmarks/run_plan_peaks.sh MODEL[+recompute][+eager]=SEQ:CHUNK,... ..."
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
if [ -n "${GPU_CACHES_FROM:-}" ]; then
  export TRITON_CACHE_DIR=$GPU_CACHES_FROM/triton TORCHINDUCTOR_CACHE_DIR=$GPU_CACHES_FROM/inductor
  export TILELANG_CACHE_DIR=$GPU_CACHES_FROM/tilelang
fi
status=0
for spec in "$@"; do
  [[ $spec == *=* ]] || { echo "$spec: not MODEL[+recompute][+eager]=SEQ:CHUNK,..." >&2; status=2; continue; }
  name=${spec%%=*} rows=${spec#*=}
  model=${name%%+*}
  flags=()
  [[ $name == *+eager* ]] || flags+=(--compile)
  [[ $name == *+recompute* ]] && flags+=(--recompute)
  echo "== $spec" | tee -a "$OUT/peaks.log"
  timeout "${PEAKS_TIMEOUT:-300}" python3 benchmarks/profile_chunked_step.py --model "$model" --rows "$rows" \
    --profile-chunk '' ${flags[@]+"${flags[@]}"} 2>&1 | grep -v 'TileLang\|softmax\|^$' | tee -a "$OUT/peaks.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "$spec: exit $rc" | tee -a "$OUT/peaks.log"; status=$rc; }
done
exit "$status"
