#!/usr/bin/env bash
# bash benchmarks/run_finetune_curve.sh FASTA MODEL SEQ STEPS [FINETUNE OPTIONS...]
#   (on the H200, from the repository root; carry: [".gpu", ".gpudata"]; GENOLC_GIT_SHA set by the caller)
# A loss curve with finetune's default schedule (issue 14: the first steps of `small` at 512k in bf16 must not spike
# above the first loss): prepares FASTA (char tokenizer, every record trains), runs `genolc finetune --data ...
# --seq SEQ --model MODEL --steps STEPS` with every other setting at its default (extra options appended), and
# keeps metrics.jsonl, summary.json and the run's log in $OUT/finetune_curve_<model>_<seq>/ beside a record.json
# (command, git SHA, device, wall seconds, exit code). The run directory itself (checkpoints) is deleted, or moved to
# $CURVE_KEEP_RUN when that is set (on the device: for a later command of the same call to read its checkpoints).
# $CURVE_TIMEOUT (seconds, default 480) stops the run; the steps it finished are kept in metrics.jsonl.
# $CURVE_TAG is appended to the folder's name (e.g. _eager for a run with --compile off beside a compiled one);
# GPU_EMPTY_CACHES=1 leaves every kernel cache empty (gpu_env.sh), for the first step a new user's machine pays;
# record.json lists what the run autotuned (fla/Triton, with seconds) and which TileLang kernels it compiled.
# With GPU_EMPTY_CACHES=1 every cache folder (Triton, TileLang, torch.compile, genolc's, Python bytecode) is a new
# empty one for this run, so two cold runs in one call share nothing (unless GPU_CACHES_FROM names one folder for
# both: the second is then a warm second run). CURVE_SAMPLE=1 runs finetune under
# benchmarks/wall_sampler.py ($keep/wall_sample.json: where the main thread's time went, by kind); the kernel
# warm-up process's log and timings (genolc/train/kernel_warmup.py) are kept in $keep/kernel-warmup/.
# Next uses (issue 14): `base` 512k through finetune; `small` 512k with --compile off at the same commit.
set -uo pipefail
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
fasta="$1" model="$2" seq="$3" steps="$4"
shift 4
keep="$OUT/finetune_curve_${model}_${seq}${CURVE_TAG:-}"
mkdir -p "$keep"
if [ -n "${GPU_EMPTY_CACHES:-}" ]; then
  # GPU_CACHES_FROM=DIR keeps the run's cache folders in DIR: empty the first time, a second run with the same DIR
  # is a user's second run on the caches the first one left.
  caches=${GPU_CACHES_FROM:-$(mktemp -d /tmp/cold-caches.XXXX)}
  mkdir -p "$caches"/{triton,inductor,tilelang,xdg,pyc}
  export TRITON_CACHE_DIR=$caches/triton TORCHINDUCTOR_CACHE_DIR=$caches/inductor TILELANG_CACHE_DIR=$caches/tilelang
  export XDG_CACHE_HOME=$caches/xdg PYTHONPYCACHEPREFIX=$caches/pyc
fi
sampler=()
[ -n "${CURVE_SAMPLE:-}" ] && sampler=(benchmarks/wall_sampler.py --out "$keep/wall_sample.json")
rm -rf /tmp/curve-data
python3 -m genolc.cli prepare "$fasta" --out /tmp/curve-data --train all --heldout none --tokenizer char \
  >"$keep/prepare.log" 2>&1 || { cat "$keep/prepare.log"; exit 1; }
command=(python3 "${sampler[@]}" -m genolc.cli finetune --data /tmp/curve-data --seq "$seq" --model "$model" --steps "$steps"
         --out /tmp/curve-run --no-progress "$@")
start=$SECONDS
TRITON_PRINT_AUTOTUNING=1 timeout -k 15 "${CURVE_TIMEOUT:-480}" "${command[@]}" 2>&1 | tee "$keep/finetune.log" \
  | grep -v '^ \|^Triton autotuning\|^best config\|^with key\|^finished after\|^Autotuning kernel' | tail -40
rc=${PIPESTATUS[0]}
cp /tmp/curve-run/metrics.jsonl /tmp/curve-run/summary.json "$keep/" 2>/dev/null
warmups="${XDG_CACHE_HOME:-$HOME/.cache}/genolc/kernel-warmup"
[ -d "$warmups" ] && mkdir -p "$keep/kernel-warmup" && cp "$warmups"/*.log "$warmups"/*.json "$keep/kernel-warmup/" 2>/dev/null
if [ -n "${CURVE_KEEP_RUN:-}" ] && [ -d /tmp/curve-run ]; then
  rm -rf "$CURVE_KEEP_RUN"
  mv /tmp/curve-run "$CURVE_KEEP_RUN" || echo "run_finetune_curve.sh: could not keep the run directory in $CURVE_KEEP_RUN"
fi
rm -rf /tmp/curve-run
recorded="genolc prepare $fasta --train all --heldout none --tokenizer char; ${command[*]}"
python3 - "$keep/record.json" "$rc" "$((SECONDS - start))" "$recorded" "$keep/finetune.log" <<'EOF'
import datetime, json, os, re, sys, torch
path, rc, wall, command, log = sys.argv[1:6]
text = open(log, errors="replace").read()
# So that a run from empty caches says where its first step went: autotunings with seconds, TileLang compiles.
autotuned = re.findall(r"Triton autotuning for function (\w+),\n(?:.*\n){0,2}?finished after ([0-9.]+)s", text)
stamps = re.findall(r"^(\S+ \S+) .*TileLang (begins|completes) to compile kernel `(\w+)`", text, re.M)
tilelang, begun = [], {}
for stamp, what, kernel in stamps:
    moment = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
    if what == "begins":
        begun[kernel] = moment
    elif kernel in begun:
        tilelang.append([kernel, (moment - begun.pop(kernel)).total_seconds()])
json.dump({"command": command, "git_sha": os.environ.get("GENOLC_GIT_SHA", "unknown"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "exit_code": int(rc),
           "wall_seconds": int(wall), "empty_caches": bool(os.environ.get("GPU_EMPTY_CACHES")),
           "autotuned": [[kernel, float(seconds)] for kernel, seconds in autotuned],
           "tilelang_compiled": tilelang}, open(path, "w"), indent=1)
EOF
gpu_env_pack_caches
# A cold run's own cache folders go (GB over a few runs); those named by GPU_CACHES_FROM stay for a second run.
[ -n "${GPU_EMPTY_CACHES:-}" ] && [ -z "${GPU_CACHES_FROM:-}" ] && rm -rf "$caches"
exit "$rc"
