#!/usr/bin/env bash
# Regenerates reports/sample/: every report form (JSON, Markdown, HTML, JUnit) of the default scenario, once
# passing and once with loss-times-world injected (exit 1 is the expected verdict there).
# Usage: scripts/make_sample_reports.sh [DDPCHECK_BINARY]   (default: build/release/ddpcheck, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build/release/ddpcheck}"
if [[ ! -x "$bin" ]]; then
  bash scripts/build.sh --target ddpcheck
fi
out=reports/sample
mkdir -p "$out"

run() {  # NAME EXPECTED_EXIT ARGS...
  local name=$1 want=$2
  shift 2
  set +e
  "$bin" run "$@" --progress never \
    --report-json "$out/$name.json" --report-md "$out/$name.md" \
    --report-html "$out/$name.html" --junit "$out/$name.junit.xml" >"$out/$name.txt"
  local rc=$?
  set -e
  if [[ $rc -ne $want ]]; then
    echo "make_sample_reports: '$name' exited $rc, expected $want" >&2
    exit 1
  fi
  echo "make_sample_reports: $out/$name.{txt,json,md,html,junit.xml} (exit $rc)"
}

run default_pass 0
run default_loss_times_world 1 --fault loss-times-world
