#!/usr/bin/env bash
# Set up (once) and run the genolc demo on the real human DNA bundled in the package. Extra arguments go to
# `genolc demo`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
genolc demo "$@"
