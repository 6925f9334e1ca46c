#!/usr/bin/env bash
# The main job: installs what is missing, builds (Release) and runs `ddpcheck run` on the default scenario
# (extra args go to ddpcheck run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/release/ddpcheck run "$@"
