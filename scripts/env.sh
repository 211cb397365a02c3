# Sourced by the set-up scripts: create (once) and activate .venv with genolc and its test dependencies.
# torch==2.13.0 is installed first so pip takes the CPU wheel on disk instead of a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GENOLC_VENV:-$ROOT/.venv}"
STAMP="$VENV/.genolc-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  fi
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test,workflows]"
  touch "$STAMP"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
