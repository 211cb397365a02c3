#!/usr/bin/env bash
# bash benchmarks/run_tune_fla.sh [PRESET ...]   (on the GPU, from the repository root; carry: [".gpu"];
#   GENOLC_GIT_SHA set by the caller)
# Tunes fla's KDA kernels for the presets (default: base mini glm-5.3-flash; small's H200 configs are shipped) with
# benchmarks/tune_fla_configs.py and returns the whole tuned folder as one archive, $OUT/tuned.tar.gz (a call returns
# a limited number of files: the first H200 run lost 10 of 13). Here: tar -xzf tuned.tar.gz -C genolc/model/ops/kda,
# then commit the folder with $OUT/fla_tuning_<date>.json under benchmarks/results/. Autotuning runs in a new, empty
# Triton cache folder, so results cached by an earlier call on a warm machine cannot stand in for timing;
# $TUNE_TIMEOUT (seconds, default 540) stops it, keeping the presets finished (the script writes after each).
set -uo pipefail
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(base mini glm-5.3-flash)
record="$OUT/fla_tuning_$(date -u +%F).json"
TRITON_CACHE_DIR=$(mktemp -d /tmp/tune-triton.XXXXXX) timeout -s KILL "${TUNE_TIMEOUT:-540}" \
  python3 benchmarks/tune_fla_configs.py --presets "${presets[@]}" --record "$record" 2>&1 | grep -v '^ \|TileLang'
rc=${PIPESTATUS[0]}
tar -czf "$OUT/tuned.tar.gz" -C genolc/model/ops/kda tuned
exit "$rc"
