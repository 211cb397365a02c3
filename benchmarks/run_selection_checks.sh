#!/usr/bin/env bash
# bash benchmarks/run_selection_checks.sh SECTION...   (on the H200, from the repository root; carry: [".gpu"];
#   GENOLC_GIT_SHA set by the caller; base's bare 512k step peaks at about 107 GiB, so it needs the H200)
# The indexer selection's changes that have run only in Triton's interpreter and through sm_90 lowering, and whether
# to turn them on (each is off until then):
#   - SCORE_GROUP_TOPS (genolc/model/ops/indexer/triton.py): the scoring kernel that also writes the top-k's first
#     read (score_group_tops_kernel);
#   - the top-k's second read at other launches (genolc/model/ops/indexer/triton_topk.py's docstring, step 2):
#     loading each step's next block ahead (LaunchShape.prefetch) and 512-score blocks (launch_shape(block=512)).
# Sections, in the order given:
#   tests  - the GPU tests of both (tests/gpu/test_indexer_triton.py), with the indexer KL's
#            (tests/gpu/test_indexer_kl_triton.py: its TF32 case on TF32-exact keys) and the pool mass's (64 slots a
#            step), which have not run on a GPU since they changed either
#   bench  - benchmarks/bench_indexer_topk.py at 512k and 1M: the scoring and top-k, both pipelines, and top_pools
#            at the default launch and at each of its CANDIDATE_LAUNCHES
#   small, base - that preset's bare 512k step (small in 64k chunks, base in 32k, as finetune plans them), two
#            steps with and two without SCORE_GROUP_TOPS, in one process each (a process's first 512k step may
#            compile)
# Run "tests bench small" in one device call and "base" in another. Each section's time limit is cut to what is
# left of $SELECTION_CHECKS_BUDGET seconds (default 560, under the device's 600 s a command), and a section that
# would get under 30 s is skipped, so that the verdicts are always written. A step section is skipped when this
# call's tests of the scoring kernel did not all pass. Everything comes back as one archive, packed again after each
# section (a call cut short keeps what it finished): $OUT/selection_checks.tar.gz, with summary.txt (also printed),
# which ends with the verdicts: turn a change on only if all its tests passed and it was more than 3 % faster
# everywhere it was timed (SCORE_GROUP_TOPS: every timed preset's best step; a launch, the prefetch and 512-score
# blocks together included: the candidates read at every window). SCORE_GROUP_TOPS timed for small alone says so:
# time base too before turning it on.
set -uo pipefail
[ $# -gt 0 ] || { echo "give one or more sections: tests, bench, small, base (see the head of $0)" >&2; exit 2; }
for section in "$@"; do
  case "$section" in
    tests|bench|small|base) ;;
    *) echo "unknown section '$section': use tests, bench, small or base" >&2; exit 2 ;;
  esac
done
: "${GENOLC_GIT_SHA:?set GENOLC_GIT_SHA to the commit under test (the device copy has no .git)}"
budget=${SELECTION_CHECKS_BUDGET:-560}
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "SELECTION_CHECKS_BUDGET=$budget: give whole seconds, e.g. 560" >&2; exit 2; }
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
results=$(mktemp -d /tmp/selection-checks.XXXX)
pack() { tar -czf "$OUT/selection_checks.tar.gz" -C "$results" .; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$results/device.txt" 2>&1
cp "$0" "$results/call.sh"
summary=$results/summary.txt
echo "git $GENOLC_GIT_SHA, $(tail -1 "$results/device.txt")" > "$summary"
# limit WANTED: WANTED seconds, or what the budget has left if that is less.
limit() { local left=$((budget - SECONDS)); echo $(( $1 < left ? $1 : left )); }
# all_passed PATTERN: every test of this call's log whose id matches PATTERN passed, and there was at least one.
all_passed() {
  local passed failed
  passed=$(grep -Ec "($1).* PASSED" "$results/gpu_tests.log")
  failed=$(grep -Ec "($1).* (FAILED|ERROR)" "$results/gpu_tests.log")
  [ "$passed" -gt 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -eq "$(grep -Ec "$1" "$results/collected.txt")" ]
}
tests_ran=0
scoring_ok=0
declare -A launch_ok=([default]=0 [prefetch]=0 [block512]=0 [block512_prefetch]=0)
for section in "$@"; do
  start=$SECONDS
  case "$section" in
    tests) wanted=150 ;;
    bench) wanted=90 ;;
    *) wanted=300 ;;          # two processes, one 512k step each way after a warm-up step
  esac
  seconds=$(limit $wanted)
  if [ "$seconds" -lt 30 ]; then
    echo "section $section skipped: $seconds s left of the $budget s budget" | tee -a "$summary"
    continue
  fi
  case "$section" in
    tests)
      files=(tests/gpu/test_indexer_triton.py tests/gpu/test_indexer_kl_triton.py
             "tests/gpu/test_dsa_triton.py::test_pool_mass_matches_reference")
      python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider "${files[@]}" > "$results/collected.txt" 2>&1
      timeout "$seconds" python3 -m pytest -v -m gpu -p no:cacheprovider "${files[@]}" > "$results/gpu_tests.log" 2>&1
      rc=$?
      tests_ran=1
      echo "tests rc=$rc: $(grep -E '^=+ .*(passed|failed|error)' "$results/gpu_tests.log" | tail -1)" \
        | tee -a "$summary"
      all_passed "test_scoring_kernel_writes_the_top_ks_first_read|test_fused_topk_selects_as_torch_topk" \
        && scoring_ok=1
      for launch in default prefetch block512 block512_prefetch; do
        all_passed "test_top_pools_kernel\[.*-$launch\]" && launch_ok[$launch]=1
      done
      echo "all passed: the scoring kernel's $scoring_ok; top_pools default ${launch_ok[default]}, prefetch" \
        "${launch_ok[prefetch]}, block512 ${launch_ok[block512]}, both ${launch_ok[block512_prefetch]} (1 = yes)" \
        | tee -a "$summary"
      ;;
    bench)
      (cd benchmarks && OUT=$results timeout "$seconds" python3 bench_indexer_topk.py --windows 512k,1M) \
        > "$results/bench_indexer_topk.log" 2>&1
      echo "bench rc=$?" | tee -a "$summary"
      grep -E "'variant': '(torch\.topk|score \+ top_pools[^']*)'" "$results/bench_indexer_topk.log" \
        | grep -oE "'window': '[^']*'|'variant': '[^']*'|'ms': [0-9.]+" | paste -d' ' - - - | tee -a "$summary"
      ;;
    small|base)
      if [ "$tests_ran" = 1 ] && [ "$scoring_ok" = 0 ]; then
        echo "$section: not timed (the scoring kernel's tests did not all pass above)" | tee -a "$summary"
        continue
      fi
      chunk=32k
      [ "$section" = small ] && chunk=64k
      for flag in "" --score-group-tops; do
        OUT=$results timeout "$(limit $((seconds / 2)))" python3 benchmarks/profile_chunked_step.py \
          --model "$section" --seq 512k --profile-chunk '' --rows "512k:$chunk,512k:$chunk" --warmup-seq "$chunk" \
          --compile --kept-attention host --kda-intermediates keep $flag \
          > "$results/step_${section}${flag:+_score_group_tops}.log" 2>&1
        echo "$section step ${flag:-(default)} rc=$?" | tee -a "$summary"
      done
      ;;
  esac
  echo "section $section took $((SECONDS - start)) s" | tee -a "$summary"
  pack
done
python3 - "$results" "$tests_ran" "$scoring_ok" "${launch_ok[prefetch]}" "${launch_ok[block512]}" \
  "${launch_ok[block512_prefetch]}" <<'EOF' \
  | tee -a "$summary"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
tests_ran, scoring_ok = sys.argv[2] == "1", sys.argv[3] == "1"
launch_ok = {"prefetch": sys.argv[4] == "1", "block512": sys.argv[5] == "1", "block512 + prefetch": sys.argv[6] == "1"}
# Faster means by more than this share: one call's steps and bench rows vary by a few per cent.
MARGIN = 0.03


def decide(change: str, faster_where: str, ok: bool) -> str:
    """The verdict for a change that was faster (``faster_where``), given whether its tests all passed."""
    if not tests_ran:
        return f"{change}: faster {faster_where}; run the tests section at this commit before turning it on"
    if not ok:
        return f"{change}: keep it off (faster {faster_where}, but its tests did not all pass in this call)"
    return f"{change}: turn it on (faster {faster_where}; its tests passed in this call)"


faster, timed = [], []
for model in ("small", "base"):
    best = {}
    for tag, name in (("off", f"peaks_{model}_compiled.json"), ("on", f"peaks_{model}_compiled_score_group_tops.json")):
        path = out / name
        if path.exists():
            # The timed 512k steps only: the warm-up step (a shorter window, compiling) has seconds too.
            seconds = [step["seconds"] for step in json.loads(path.read_text())["steps"]
                       if step.get("phase") == "timed" and step.get("seq") == "512k" and "seconds" in step]
            if seconds:
                best[tag] = min(seconds)
                print(f"{model} SCORE_GROUP_TOPS {tag}: steps {seconds} s")
    if len(best) == 2:
        timed.append(model)
        faster.append(best["on"] < (1 - MARGIN) * best["off"])
        print(f"{model}: best step {best['off']:.2f} s without, {best['on']:.2f} s with SCORE_GROUP_TOPS")
if not timed:
    print("verdict SCORE_GROUP_TOPS: no preset was timed both ways in this call")
elif all(faster) and "base" not in timed:
    print("verdict SCORE_GROUP_TOPS: faster for small; time base (the base section) before turning it on")
elif all(faster):
    print("verdict " + decide("SCORE_GROUP_TOPS", f"for {', '.join(timed)}", scoring_ok))
else:
    print(f"verdict SCORE_GROUP_TOPS: keep it off (not {MARGIN:.0%} faster for every timed preset: "
          f"{', '.join(timed)})")

names = {"default": "default", **{json.dumps(shape, sort_keys=True): name for shape, name in (
    ({"prefetch": True}, "prefetch"), ({"block": 512}, "block512"), ({"block": 512, "prefetch": True},
                                                                     "block512 + prefetch"))}}
candidates: dict[str, dict[str, float]] = {}
for path in sorted(out.glob("indexer_topk_*.json")):
    for row in json.loads(path.read_text())["rows"]:
        shape = row.get("shape")
        name = names.get(shape if shape == "default" else json.dumps(shape, sort_keys=True))
        if row.get("variant") == "top_pools" and name:
            candidates.setdefault(name, {})[row["window"]] = row["stage_ms"]["candidates"]
for name, by_window in candidates.items():
    print(f"candidates read, {name}: " + ", ".join(f"{w} {ms:.3f} ms" for w, ms in by_window.items()))
default = candidates.get("default", {})
for name, by_window in candidates.items():
    if name == "default":
        continue
    ok = launch_ok.get(name, False)
    windows = [w for w in by_window if w in default]
    if not windows:
        print(f"verdict {name}: not timed beside the default in this call")
    elif all(by_window[w] < (1 - MARGIN) * default[w] for w in windows):
        print("verdict " + decide(f"the {name} launch (as launch_shape's default)",
                                  f"than the default at {', '.join(windows)}", ok))
    else:
        print(f"verdict {name}: keep the default launch (not {MARGIN:.0%} faster at every window)")
if not candidates:
    print("verdict launches (prefetch, block512, both): not timed in this call (the bench wrote no record)")
EOF
pack
