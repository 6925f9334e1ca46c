#!/bin/sh
# Builds the sim bench and ddpcheck (for --whole-check) and prints the sim-vs-torch table (last line: speedup_vs_torch_10k_w4=X).
#   bench/run_bench.sh [compare.py flags...]
set -e
cd "$(dirname "$0")/.."
cmake -S . -B build-f -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-f -j2 --target ddpcheck_bench_sim ddpcheck >/dev/null
exec /usr/bin/python3 bench/compare.py --build build-f "$@"
