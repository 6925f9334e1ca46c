#!/usr/bin/env bash
# Configures and builds ddpcheck (Release, Ninja) into build/release. Extra args go to cmake --build.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build build/release -j"$(nproc)" "$@"
