#!/usr/bin/env bash
# The test command: installs what is missing, builds (Release) and runs the whole suite through ctest.
# ctest prints its summary line ("100% tests passed, 0 tests failed out of N").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --preset release -j"$(nproc)" "$@"
