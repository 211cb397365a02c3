"""House style the code review would otherwise have to catch: no banner comments in genolc/, tests/, benchmarks/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# '# ---- Section ----', '# ===== ... =====', '#####', '# -- part ------': dividers that say nothing a name could not.
BANNER = re.compile(r"^\s*#\s*(-{3,}|={3,}|#{3,})|^\s*#.*(-{4,}|={4,})\s*$|^\s*#{3,}")


def test_no_banner_comments():
    found = []
    for folder in ("genolc", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".sh") or "results" in path.parts or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
                if BANNER.match(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "banner comments:\n" + "\n".join(found)


def test_the_banner_pattern_tells_dividers_from_comments():
    for divider in ("# ---- Section ----", "    # -- drawing -----------", "# ===== x =====", "#####", "# --- a"):
        assert BANNER.match(divider), divider
    for comment in ("# why: the flag is sticky", "x = 1  # ---", "#!/usr/bin/env bash", "# a - b"):
        assert not BANNER.match(comment), comment
