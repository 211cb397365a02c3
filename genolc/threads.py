"""How many CPU threads torch uses in ``genolc finetune`` and ``genolc eval``: chosen before work starts, recorded.

torch's default is one thread per core, whether or not other processes keep those cores busy. Its OpenMP threads
wait for each other at every parallel op, so one thread that is not scheduled stalls all of them: on a shared
2-core machine three tiny training steps took 106 s with the default 2 threads and 14 s with one. The rule, first
match wins:

1. ``--threads N``: N.
2. ``OMP_NUM_THREADS`` set in the environment: that number (torch reads it too).
3. ``--deterministic`` (finetune): 1. The rounding of torch's parallel reductions depends on the thread count, so a
   count read from the machine's load could differ between two runs and so could their results.
4. Otherwise the cores free now: the usable cores (the CPU affinity mask, capped by a cgroup CPU quota) minus the
   time other processes spent on them over a short sample of ``/proc/stat`` (rounded), at least 1. Where
   ``/proc/stat`` cannot be read, the 1-minute load average stands in for the busy cores.

The choice and its reason go into the run record and ``summary.json`` (``threads``, ``threads_rule``).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from genolc.errors import ConfigError

SAMPLE_SECONDS = 0.25
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    rule: str          # which rule decided, in words (recorded as threads_rule)

    def to_dict(self) -> dict[str, object]:
        return {"threads": self.threads, "threads_rule": self.rule}


def check_threads(threads: int | None, where: str = "--threads") -> None:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"the thread count must be a whole number of at least 1, got {threads!r}", where=where,
                          fix="pass e.g. --threads 1, or leave it out to use the cores free now")


def affinity_cores() -> list[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time the container may use (cgroup v2 ``cpu.max`` or v1 CFS quota); None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores(cores: list[int] | None = None, quota: float | None = None) -> int:
    """Cores in the affinity mask, capped by the cgroup quota (whole CPUs, at least 1)."""
    count = len(cores if cores is not None else affinity_cores())
    quota = cgroup_cpu_quota() if quota is None else quota
    if quota is not None:
        count = min(count, max(1, math.floor(quota)))
    return max(1, count)


def _cpu_times(cores: list[int]) -> dict[int, tuple[int, int]] | None:
    """(busy, total) jiffies per CPU in ``cores`` from /proc/stat; None when unreadable."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted, times = set(cores), {}
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            cpu, values = int(name[3:]), [int(v) for v in fields[:8]]
        except ValueError:
            continue
        if cpu in wanted and len(values) >= 5:
            idle = values[3] + values[4]                  # idle + iowait
            times[cpu] = (sum(values) - idle, sum(values))
    return times if len(times) == len(wanted) else None


def busy_cores(cores: list[int], seconds: float = SAMPLE_SECONDS) -> tuple[float, str] | None:
    """How many of ``cores`` other processes keep busy now, and how that was measured; None when unknown."""
    before = _cpu_times(cores)
    if before is not None:
        time.sleep(seconds)
        after = _cpu_times(cores)
        if after is not None:
            busy = 0.0
            for cpu in cores:
                total = after[cpu][1] - before[cpu][1]
                if total > 0:
                    busy += (after[cpu][0] - before[cpu][0]) / total
            return busy, f"{busy:.1f} busy over {seconds:g} s"
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    return load, f"1-minute load {load:.1f}"


def choose_threads(requested: int | None = None, *, deterministic: bool = False,
                   environ: dict[str, str] | None = None) -> ThreadChoice:
    """The thread count by the module's rule."""
    check_threads(requested)
    if requested is not None:
        return ThreadChoice(requested, "--threads")
    environ = os.environ if environ is None else environ
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        return ThreadChoice(int(omp), "OMP_NUM_THREADS")
    if deterministic:
        return ThreadChoice(1, "--deterministic: a count that does not follow the machine's load")
    cores = affinity_cores()
    usable = usable_cores(cores)
    busy = busy_cores(cores)
    if busy is None:
        return ThreadChoice(usable, f"{usable} usable cores (their load is unknown)")
    free = usable - busy[0]
    threads = max(1, min(usable, math.floor(free + 0.5)))
    return ThreadChoice(threads, f"cores free now: {usable} usable, {busy[1]}")


@contextlib.contextmanager
def torch_threads(choice: ThreadChoice) -> Iterator[ThreadChoice]:
    """torch runs on ``choice.threads`` threads inside the block; the previous count is restored after it."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(choice.threads)
    try:
        yield choice
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def run_threads(requested: int | None, record=None, *, deterministic: bool = False) -> Iterator[ThreadChoice]:
    """Choose the thread count by the rule, note it in ``record`` (a :class:`genolc.runs.RunRecord`) and run the
    block on it."""
    choice = choose_threads(requested, deterministic=deterministic)
    if record is not None:
        record.compute.update(choice.to_dict())
    with torch_threads(choice):
        yield choice
