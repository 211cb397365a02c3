"""genolc/hostmem.py: freed activations go back to the system instead of staying resident as heap fragments."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A training step's pattern: tensors saved for backward (1 MiB) between temporaries (3 MiB) that are freed, then
# larger temporaries (4 MiB) that fit none of the holes. One 32 MiB block freed first raises glibc's threshold, as a
# step's first large frees do. glibc keeps the holes resident (~90 MiB beyond the 40 MiB saved); fixed, they go back.
FRAGMENT = """
import resource, sys, torch
if sys.argv[1] == "fixed":
    from genolc.hostmem import return_large_frees_to_the_system
    assert return_large_frees_to_the_system()
def rss_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2 ** 20
start = rss_mib()
first = torch.ones(8 * 2 ** 20)
del first
saved = []
for _ in range(40):
    saved.append(torch.ones(2 ** 18))
    temporary = torch.ones(3 * 2 ** 18)
    del temporary
for _ in range(20):
    temporary = torch.ones(4 * 2 ** 18)
print(rss_mib() - start)
"""


def _resident_after_frees(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", FRAGMENT, mode], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_large_tensors_leave_the_process():
    assert _resident_after_frees("default") > 100       # glibc's own behaviour, which the fix is for
    assert _resident_after_frees("fixed") < 60          # the 40 MiB saved and one temporary


def test_the_users_own_malloc_setting_is_left_alone(monkeypatch):
    from genolc.hostmem import return_large_frees_to_the_system

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert return_large_frees_to_the_system() is False
