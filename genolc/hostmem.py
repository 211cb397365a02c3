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

``MALLOC_MMAP_THRESHOLD_`` in the environment (glibc's own setting) is left to rule. Other C libraries have no
``mallopt``; there nothing changes.
"""

from __future__ import annotations

import ctypes
import os

# glibc's malloc.h: M_MMAP_THRESHOLD.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20


# Resident bytes per byte of live tensors with glibc's rising threshold (mini, 1k tokens, one step on CPU).
HEAP_OVERHEAD = 1.6


def heap_overhead_may_not_fit(estimate_bytes: int, budget_bytes: int) -> bool:
    """True when a CPU run planned at ``estimate_bytes`` may outgrow ``budget_bytes`` through heap fragments."""
    return estimate_bytes * HEAP_OVERHEAD > budget_bytes


def return_large_frees_to_the_system() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` for this process (module docstring). True when set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
