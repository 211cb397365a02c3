"""Keep a CPU training run's resident memory near what its tensors hold, when memory is tight.

glibc serves an allocation at or above its mmap threshold from fresh pages that go back to the system when it is
freed, and smaller ones from its heaps, which return memory only from their top. The threshold starts at 128 KiB but
rises to the size of any such block that is freed (up to 32 MiB), so once a step's first large tensors are freed
most activations come from the heaps, and what a step frees stays resident as fragments. `finetune --model mini
--seq 4k` on CPU (planned at 15.8 GiB of the machine's 21 GiB free) reached 24.4 GB of RSS and was killed by the
kernel's out-of-memory killer; with the threshold fixed at 1 MiB it peaked at 15.2 GiB (2026-12-01, this project's
2-core machine). At 1k tokens the fixed threshold took the peak from 5.5 to 3.8 GiB (the tensors: 3.5) but the step
from 12-13 s to 22-23 s: every large tensor then costs fresh, zeroed pages. So the trainer fixes it only when the
plan's estimate times ``HEAP_OVERHEAD`` (the 5.5 / 3.5 measured) would not fit the memory free
(:func:`heap_overhead_may_not_fit`), and says so.

`genolc prepare` wants the opposite (:func:`keep_freed_blocks_for_reuse`): it allocates and frees the same few
chunk-sized arrays for every chunk of a genome (4 MiB blocks: the upper-cased bases, soft-mask flags, token ids), and
with glibc's defaults each comes from fresh pages that the kernel must fault in and zero. Serving them from a heap
that keeps what is freed took a prepare of the 70 Mbp GRCh37 chrX piece from 52-62k minor page faults to 36-44k and
its system time from a median 0.48 to 0.29 s (wall median 0.955 -> 0.85 s, six alternating runs each on this
project's 2-core machine, 2026-12-02; peak RSS 180 -> 205 MB). benchmarks/results/prepare_2026-12-02.json: the CLI
over four .fa.gz genomes 65.5 -> 77.6 Mbp/s median (CPU 2.04 -> 1.68 s), over them inflated 61.6 -> 65.5; the same
prepare() without the setting varied by 13 % between its two runs there, so read these as about 5-18 %.

``MALLOC_MMAP_THRESHOLD_`` (and, for the second, ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_TOP_PAD_``) in the
environment, glibc's own settings, are left to rule. Other C libraries have no ``mallopt``; there nothing changes.
"""

from __future__ import annotations

import ctypes
import os

# glibc's malloc.h: M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20
# prepare's: every chunk array from the heap, whose freed top is kept, grown 256 MiB at a time.
_KEPT_HEAP = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, (1 << 31) - 1), (_M_TOP_PAD, 256 << 20))
_KEPT_HEAP_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


# Resident bytes per byte of live tensors with glibc's rising threshold (mini, 1k tokens, one step on CPU).
HEAP_OVERHEAD = 1.6


def heap_overhead_may_not_fit(estimate_bytes: int, budget_bytes: int) -> bool:
    """True when a CPU run planned at ``estimate_bytes`` may outgrow ``budget_bytes`` through heap fragments."""
    return estimate_bytes * HEAP_OVERHEAD > budget_bytes


def _mallopt():
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def return_large_frees_to_the_system() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` for this process (module docstring). True when set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def keep_freed_blocks_for_reuse() -> bool:
    """Serve every allocation from glibc's heap and keep what is freed there, for `genolc prepare`'s process
    (module docstring). True when set."""
    if any(name in os.environ for name in _KEPT_HEAP_ENV):
        return False
    mallopt = _mallopt()
    return mallopt is not None and all(mallopt(option, value) == 1 for option, value in _KEPT_HEAP)
