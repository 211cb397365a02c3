#!/usr/bin/env bash
# Set up (once) and run genolc's CPU test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
python -m pytest -n 2 "$@"
