"""Where a Python process's wall time goes: its main thread's stack sampled a few times a second, each sample put in
one kind (importing, tracing for torch.compile, inductor compiling, Triton compiling or autotuning, TileLang
compiling, anything else; while the main thread waits in a CUDA backward, the kind of what autograd's thread does,
marked "(backward)"), timed by the elapsed time between samples, written as JSON when the process ends.

    python benchmarks/wall_sampler.py --out sample.json [--interval 0.1] -m genolc.cli finetune ...

Why: a first step on a new machine takes minutes, and a profiler of GPU kernels (torch.profiler) does not see a
compiler's time on the host; cProfile slows the Python-heavy parts it measures. A sampling thread costs a stack walk
per sample. The samples say where the main thread was (or autograd's thread during a backward), not what other
processes did (inductor's compile workers, a kernel warm-up process): time spent waiting on those is counted where
it waits.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from types import FrameType

# First match wins, checked over the whole stack: a Triton compile under inductor counts as Triton's.
KINDS = (
    ("tilelang compile", lambda f, n: "/tilelang/" in f and ("compile" in n or "lower" in n or "build" in n)),
    ("triton autotune", lambda f, n: f.endswith("triton/runtime/autotuner.py") and n in ("_bench", "benchmark")),
    ("triton compile", lambda f, n: f.endswith("triton/compiler/compiler.py") and n == "compile"),
    ("inductor compile", lambda f, n: f.endswith("torch/_inductor/compile_fx.py")),
    ("torch.compile trace", lambda f, n: f.endswith("torch/_dynamo/convert_frame.py") and n in ("_compile",
                                                                                                   "compile_inner")),
    ("import", lambda f, n: n == "_find_and_load"),
)


def stack(frame: FrameType | None) -> list[tuple[str, str, int]]:
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_code.co_name, frame.f_lineno))
        frame = frame.f_back
    return frames          # innermost first


def kind_of(frames: list[tuple[str, str, int]]) -> str:
    for kind, matches in KINDS:
        if any(matches(f, n) for f, n, _ in frames):
            return kind
    return "other"


def where_in_genolc(frames: list[tuple[str, str, int]]) -> str:
    for f, n, line in frames:
        if "/genolc/" in f:
            return f"{f.split('/genolc/', 1)[1]}:{line} {n}"
    return f"{frames[0][0].rsplit('/', 1)[-1]}:{frames[0][2]} {frames[0][1]}" if frames else "?"


class Sampler:
    def __init__(self, interval: float, out: Path | None = None) -> None:
        self.interval, self.out = interval, out
        self.target = threading.main_thread().ident
        self.seconds: collections.Counter[str] = collections.Counter()
        self.other: collections.Counter[str] = collections.Counter()
        self.own: int | None = None
        self.first_seen: dict[str, float] = {}
        self.timeline: list[tuple[float, str]] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _stacks(self) -> dict[int, list[tuple[str, str, int]]]:
        # Frame objects are turned into tuples at once and the dict dropped: it holds this thread's own frame,
        # whose locals hold the dict, a cycle that only the garbage collector breaks, and until it does, every
        # sampled frame keeps its locals alive (on the H200 a recomputed backward's activations: base's first
        # step at 128k peaked at 122.6 GiB under the sampler, 46.3 without).
        frames = sys._current_frames()
        try:
            return {ident: stack(frame) for ident, frame in frames.items() if ident != self.own}
        finally:
            del frames

    def _kind(self) -> tuple[str, list[tuple[str, str, int]]]:
        stacks = self._stacks()
        frames = stacks.get(self.target, [])
        kind = kind_of(frames)
        if kind == "other" and any(n == "_engine_run_backward" for _, n, _ in frames):
            # On CUDA the backward runs on autograd's device thread while the main thread waits: what that
            # thread does (fla's backward kernels compiling, TileLang, the backward graph's compile) counts.
            others = [kind_of(other) for ident, other in stacks.items() if ident != self.target]
            busy = [k for k in others if k != "other"]
            kind = f"{busy[0] if busy else 'running'} (backward)"
        return kind, frames

    def _run(self) -> None:
        self.own = threading.get_ident()
        last = time.monotonic()
        written = last
        while not self._stop.wait(self.interval):
            kind, frames = self._kind()
            now = time.monotonic()
            # Elapsed time, not samples x interval: a C call that holds the GIL delays the next sample.
            elapsed, last = now - last, now
            self.seconds[kind] += elapsed
            at = round(now - self.started, 2)
            self.first_seen.setdefault(kind, at)
            if kind == "other":
                self.other[where_in_genolc(frames)] += elapsed
            if not self.timeline or self.timeline[-1][1] != kind:
                self.timeline.append((at, kind))
            # Every ~10 s what is known so far, for a process killed before it can write the last report.
            if self.out is not None and now - written >= 10:
                written = now
                partial = self.out.with_name(self.out.name + ".partial")
                partial.write_text(json.dumps({"partial": True, **self.summary()}, indent=1) + "\n")
                os.replace(partial, self.out)

    def report(self) -> dict:
        self._stop.set()
        self.thread.join()
        return self.summary()

    def summary(self) -> dict:
        return {"seconds": round(time.monotonic() - self.started, 1), "interval": self.interval,
                "seconds_by_kind": {k: round(v, 1) for k, v in self.seconds.most_common()},
                "first_seen": dict(self.first_seen),
                "other_by_genolc_line": [{"where": w, "seconds": round(v, 1)} for w, v in self.other.most_common(40)],
                "timeline": list(self.timeline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("-m", dest="module", required=True, help="the module to run as __main__, then its arguments")
    # Everything after -m MODULE is the module's: options such as --help included.
    split = sys.argv.index("-m") + 2 if "-m" in sys.argv[:-1] else len(sys.argv)
    args = parser.parse_args(sys.argv[1:split])
    sys.argv = [args.module, *sys.argv[split:]]
    sampler = Sampler(args.interval, args.out)
    sampler.thread.start()
    code = 0
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        result = {"command": " ".join(sys.argv), **sampler.report()}
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wall_sampler: {json.dumps(result['seconds_by_kind'])}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
