#!/usr/bin/env bash
# The CI job of docs/ci.md, as one script: record a short real PyTorch DDP run (tools/examples/ddp_example.py,
# 2 ranks over gloo on the CPU), check it with `ddpcheck torch-compare` (its exit code is the gate), and write
# the JUnit XML and the HTML report a CI system uploads. ctest runs it (test torch_ci_example, label torch)
# with --self-test, which also checks that the gate closes on a real mistake (a run without
# sampler.set_epoch must fail naming skip-set-epoch).
#
#   scripts/ci_example.sh [--self-test] [OUT_DIR]        env: DDPCHECK (the binary), PYTHON (with torch)
# Exit: the torch-compare verdict (0 PASS, 1 divergence, 2 bad input); 77 when PYTHON has no torch (SKIP).
set -euo pipefail
cd "$(dirname "$0")/.."
self_test=0
if [[ "${1:-}" == "--self-test" ]]; then self_test=1; shift; fi
OUT=${1:-ci-out}
DDPCHECK=${DDPCHECK:-build/release/ddpcheck}
PYTHON=${PYTHON:-/usr/bin/python3}
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "SKIP: $PYTHON cannot import torch (Debian: python3-torch)"
  exit 77
fi
rm -rf "$OUT" && mkdir -p "$OUT"
# Ports of our own, free when asked (the OS picks them): two CI jobs, or this test beside others under ctest -j,
# must not meet on one machine (a port from the PID collided now and then).
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
bug_port=$(free_port)

# --- the job (docs/ci.md shows these commands) ---
"$PYTHON" tools/examples/ddp_example.py --out "$OUT/dump" --world 2 --epochs 1 --port "$port" ||
  # A free port can still be taken by another world between the OS handing it out and torch binding it (under
  # ctest -j, gloo then aborts a rank: "terminate called without an active exception"): once more, on new ports.
  "$PYTHON" tools/examples/ddp_example.py --out "$OUT/dump" --world 2 --epochs 1 --port "$(free_port)"
# torch-compare takes the report flags through the harness (issue 19); until a build has them, the JUnit XML
# and the HTML come from `ddpcheck run` of the same model family in the CPU world.
report_flags=()
if "$DDPCHECK" torch-compare --help | grep -q -- '--junit'; then
  report_flags=(--junit "$OUT/junit.xml" --report-html "$OUT/report.html")
fi
set +e
"$DDPCHECK" torch-compare "$OUT/dump" --report-json "$OUT/report.json" "${report_flags[@]}"
verdict=$?
set -e
if [[ ${#report_flags[@]} -eq 0 ]]; then
  "$DDPCHECK" run scenarios/default.json --progress never -q --junit "$OUT/junit.xml" --report-html "$OUT/report.html"
fi
# --- end of the job ---

if [[ $self_test -eq 1 ]]; then
  [[ $verdict -eq 0 ]] || { echo "FAIL: torch-compare of a correct run exited $verdict"; exit 1; }
  for f in report.json junit.xml report.html; do
    [[ -s "$OUT/$f" ]] || { echo "FAIL: $OUT/$f missing or empty"; exit 1; }
  done
  "$PYTHON" - "$OUT" <<'PY'
import json, sys, xml.etree.ElementTree as ET
out = sys.argv[1]
suite = ET.parse(out + "/junit.xml").getroot()
assert suite.tag == "testsuites" and int(suite.get("failures")) == 0, ET.tostring(suite)[:300]
assert json.load(open(out + "/report.json"))["verdict"] == "PASS"
html = open(out + "/report.html").read()
assert "VERDICT: PASS" in html and "<svg" in html and len(html) < 150 * 1024, len(html)
PY
  "$PYTHON" tools/examples/ddp_example.py --out "$OUT/dump-bug" --world 2 --epochs 2 --port "$bug_port" \
    --no-set-epoch ||
    "$PYTHON" tools/examples/ddp_example.py --out "$OUT/dump-bug" --world 2 --epochs 2 --port "$(free_port)" \
      --no-set-epoch  # (as above: once more, on new ports)
  set +e
  "$DDPCHECK" torch-compare "$OUT/dump-bug" -q --report-json "$OUT/report-bug.json"
  bug=$?
  set -e
  [[ $bug -eq 1 ]] || { echo "FAIL: torch-compare of a run without set_epoch exited $bug, want 1"; exit 1; }
  grep -q '"skip-set-epoch"' "$OUT/report-bug.json" || { echo "FAIL: skip-set-epoch not named"; exit 1; }
  echo "ci_example: self-test passed (PASS gated open, skip-set-epoch gated closed)"
fi
exit "$verdict"
