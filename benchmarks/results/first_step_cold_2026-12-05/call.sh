#!/usr/bin/env bash
# Session 39 call B: issue 14's first step with every cache empty, at the current main, `small` and `base` at 512k
# (session 30: 55.1 s and 71.8 s; compile/autotune 40.1 s and 47.6 s in the main thread), then `base`'s second run
# on the caches its first left. Takes the full SHA.
set -u
export GENOLC_GIT_SHA=$1
ROOT=$OUT
cp .gpujob/s39_callB.sh $OUT/call.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.txt 2>&1
export COLD_TIMEOUT=${COLD_TIMEOUT:-170}
COLD_SECOND=${COLD_SECOND:-} bash benchmarks/run_first_step_cold.sh small:512k 2>&1 | tail -6
# run_first_step_cold.sh empties $OUT of archives before it packs its own.
mv $OUT/first_step_cold.tar.gz /tmp/first_step_cold_small.tar.gz
COLD_SECOND=1 bash benchmarks/run_first_step_cold.sh base:512k 2>&1 | tail -8
mv $OUT/first_step_cold.tar.gz $OUT/first_step_cold_base.tar.gz
mv /tmp/first_step_cold_small.tar.gz $OUT/
