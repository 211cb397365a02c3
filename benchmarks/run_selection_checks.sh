#!/usr/bin/env bash
# bash benchmarks/run_selection_checks.sh SECTION...   (on the H200, from the repository root; carry: [".gpu"];
#   GENOLC_GIT_SHA set by the caller; base's bare 512k step peaks at about 107 GiB, so it needs the H200)
# The indexer selection's changes that have run only in Triton's interpreter and through sm_90 lowering, and whether
# to keep them:
#   - SCORE_GROUP_TOPS (genolc/model/ops/indexer/triton.py, off): the scoring kernel that also writes the top-k's
#     first read (score_group_tops_kernel);
#   - LaunchShape.prefetch (genolc/model/ops/indexer/triton_topk.py, off): the top-k's second read loads each
#     step's next block before it takes its own block's candidate slots.
# Sections, in the order given:
#   tests  - the GPU tests of both (tests/gpu/test_indexer_triton.py), with the indexer KL's
#            (tests/gpu/test_indexer_kl_triton.py: its TF32 case on TF32-exact keys) and the pool mass's (64 slots a
#            step), which have not run on a GPU since they changed either
#   bench  - benchmarks/bench_indexer_topk.py at 512k and 1M: the scoring and top-k, both pipelines, and top_pools
#            with and without the prefetch
#   small, base - that preset's bare 512k step (small in 64k chunks, base in 32k, as finetune plans them), two
#            steps with and two without SCORE_GROUP_TOPS, in one process each (a process's first 512k step may
#            compile)
# About 500 s for "tests bench small" and 330 s for "base": two device calls. A step section is skipped when this
# call's tests section failed the scoring kernel's tests. Everything comes back as one archive, packed again after
# each section (a call cut short keeps what it finished): $OUT/selection_checks.tar.gz, with summary.txt (also
# printed), which ends with the two verdicts: turn each on only if its tests passed and it was faster everywhere it
# was timed (SCORE_GROUP_TOPS: every preset's best step; the prefetch: the candidates read at every window).
set -uo pipefail
[ $# -gt 0 ] || { echo "give one or more sections: tests, bench, small, base (see the head of $0)" >&2; exit 2; }
for section in "$@"; do
  case "$section" in
    tests|bench|small|base) ;;
    *) echo "unknown section '$section': use tests, bench, small or base" >&2; exit 2 ;;
  esac
done
: "${GENOLC_GIT_SHA:?set GENOLC_GIT_SHA to the commit under test (the device copy has no .git)}"
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
results=$(mktemp -d /tmp/selection-checks.XXXX)
pack() { tar -czf "$OUT/selection_checks.tar.gz" -C "$results" .; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$results/device.txt" 2>&1
cp "$0" "$results/call.sh"
summary=$results/summary.txt
echo "git $GENOLC_GIT_SHA, $(tail -1 "$results/device.txt")" > "$summary"
kernel_tests_failed=""
prefetch_tests_failed=""
tests_ran=0
for section in "$@"; do
  start=$SECONDS
  case "$section" in
    tests)
      timeout 180 python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu/test_indexer_triton.py \
        tests/gpu/test_indexer_kl_triton.py "tests/gpu/test_dsa_triton.py::test_pool_mass_matches_reference" \
        > "$results/gpu_tests.log" 2>&1
      rc=$?
      tests_ran=1
      echo "tests rc=$rc: $(grep -E '^=+ .*(passed|failed|error)' "$results/gpu_tests.log" | tail -1)" \
        | tee -a "$summary"
      scoring_tests="test_scoring_kernel_writes_the_top_ks_first_read|test_fused_topk_selects_as_torch_topk\[True\]"
      if grep -Eq "($scoring_tests).*(FAILED|ERROR)" "$results/gpu_tests.log"; then
        kernel_tests_failed=1
        echo "the scoring kernel with the tops failed its tests" | tee -a "$summary"
      elif ! grep -q "test_scoring_kernel_writes_the_top_ks_first_read.*PASSED" "$results/gpu_tests.log"; then
        kernel_tests_failed=1
        echo "the scoring kernel's tests did not run to the end (gpu_tests.log)" | tee -a "$summary"
      fi
      if grep -Eq "test_top_pools_kernel\[.*-True\].*(FAILED|ERROR)" "$results/gpu_tests.log" \
          || ! grep -Eq "test_top_pools_kernel\[.*-True\].*PASSED" "$results/gpu_tests.log"; then
        prefetch_tests_failed=1
        echo "the top-k with the prefetch failed its tests or did not run them" | tee -a "$summary"
      fi
      ;;
    bench)
      (cd benchmarks && OUT=$results timeout 120 python3 bench_indexer_topk.py --windows 512k,1M) \
        > "$results/bench_indexer_topk.log" 2>&1
      echo "bench rc=$?" | tee -a "$summary"
      grep -E "score \+ top_pools|torch.topk" "$results/bench_indexer_topk.log" | cut -c1-200 | tee -a "$summary"
      ;;
    small|base)
      if [ -n "$kernel_tests_failed" ]; then
        echo "$section: not timed (the kernel's tests failed above)" | tee -a "$summary"
        continue
      fi
      chunk=32k
      [ "$section" = small ] && chunk=64k
      for flag in "" --score-group-tops; do
        OUT=$results timeout 170 python3 benchmarks/profile_chunked_step.py --model "$section" --seq 512k \
          --profile-chunk '' --rows "512k:$chunk,512k:$chunk" --warmup-seq "$chunk" --compile --kept-attention host \
          --kda-intermediates keep $flag > "$results/step_${section}${flag:+_score_group_tops}.log" 2>&1
        echo "$section step ${flag:-(default)} rc=$?" | tee -a "$summary"
      done
      ;;
  esac
  echo "section $section took $((SECONDS - start)) s" | tee -a "$summary"
  pack
done
python3 - "$results" "${kernel_tests_failed:-0}" "${prefetch_tests_failed:-0}" "$tests_ran" <<'EOF' | tee -a "$summary"
import json, pathlib, sys
out, failed, prefetch_failed = pathlib.Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
tests = "its tests passed in this call" if sys.argv[4] == "1" else "its tests did not run in this call"
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
                print(f"{model} {tag}: steps {seconds} s")
    if len(best) == 2:
        timed.append(model)
        faster.append(best["on"] < best["off"])
        print(f"{model}: best step {best['off']:.2f} s without, {best['on']:.2f} s with SCORE_GROUP_TOPS")
if failed:
    print("verdict: keep SCORE_GROUP_TOPS off (its tests failed)")
elif not timed:
    print("verdict: no preset was timed both ways in this call")
elif all(faster):
    print(f"verdict: faster for {', '.join(timed)}; turn SCORE_GROUP_TOPS on if the tests passed (this call's or an "
          "earlier call's at the same commit)")
else:
    print(f"verdict: keep SCORE_GROUP_TOPS off (not faster for every timed preset: {', '.join(timed)})")
candidates = {}
for path in sorted(out.glob("indexer_topk_*.json")):
    for row in json.loads(path.read_text())["rows"]:
        if row.get("variant") == "top_pools" and row.get("shape") in ("default", {"prefetch": True}):
            tag = "off" if row["shape"] == "default" else "on"
            candidates.setdefault(row["window"], {})[tag] = row["stage_ms"]["candidates"]
for window, ms in candidates.items():
    print(f"candidates read at {window}: " + ", ".join(f"prefetch {tag} {value:.3f} ms" for tag, value in ms.items()))
compared = [ms for ms in candidates.values() if len(ms) == 2]
if prefetch_failed:
    print("verdict: keep the prefetch off: the top-k's tests with it failed or did not finish in this call")
elif not compared:
    print("verdict: the prefetch was not timed in this call (run the bench section)")
elif all(ms["on"] < ms["off"] for ms in compared):
    print(f"verdict: faster at every window timed; turn it on (LaunchShape.prefetch = True) if its tests passed "
          f"({tests})")
else:
    print("verdict: keep the prefetch off (not faster at every window timed)")
EOF
pack
