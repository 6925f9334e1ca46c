#!/usr/bin/env bash
# The walls between ddpcheck's layers (docs/architecture.md): cli -> harness -> {reference, sim, real} -> core.
#   core/       includes no other layer
#   reference/  includes core/ only
#   sim/        includes core/ and reference/ (its replicas are the reference layers), never real/, cli/, harness/
#   real/       includes core/ only (CUDA, NCCL), never sim/, reference/, cli/, harness/
#   harness/    includes core/, reference/, sim/, real/ (harness/gpu/ only for real/), never cli/
#   cli/        includes core/ and harness/ only
# and commands are registered (DDPCHECK_REGISTER_COMMAND) in cli/ only; RunReference and CompareTraces are
# called from harness/ (and tests/, props/, bench/) only. Prints every breach and exits 1 if there is one.
set -uo pipefail
root="${1:-$(dirname "$0")/..}"
cd "$root" || exit 2
fail=0
breach() { echo "wall broken: $1"; fail=1; }

check_layer() {  # check_layer DIR ALLOWED_REGEX
  local dir=$1 allowed=$2
  while IFS= read -r line; do
    local file=${line%%:*} inc
    inc=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    [[ "$inc" =~ ^($allowed)$ ]] || breach "$file includes $inc/ (${dir}/ may include: ${allowed//|/, })"
  done < <(grep -rnE '^#include "[a-z_]+/' "$dir" --include='*.h' --include='*.cc' --include='*.cu' 2>/dev/null | grep -v '^real/tests/')
}
check_layer core 'core'
check_layer reference 'core|reference'
check_layer sim 'core|reference|sim'
check_layer real 'core|real'
check_layer harness 'core|reference|sim|real|harness'
check_layer cli 'core|harness|cli'
# real/ only from harness/gpu/ inside harness/
while IFS= read -r line; do
  breach "${line%%:*} includes real/ outside harness/gpu/"
done < <(grep -rn '^#include "real/' harness --include='*.h' --include='*.cc' | grep -v '^harness/gpu/')

while IFS= read -r line; do
  breach "${line%%:*} registers a command outside cli/"
done < <(grep -rln 'DDPCHECK_REGISTER_COMMAND(' --include='*.cc' core reference sim real harness 2>/dev/null)

for fn in 'RunReference(' 'CompareTraces('; do
  while IFS= read -r file; do
    breach "$file calls ${fn%(} (only harness/, tests/, props/ and bench/ may)"
  done < <(grep -rlF "$fn" --include='*.cc' cli sim real 2>/dev/null)
done
# The reference is the oracle: it knows nothing of faults.
while IFS= read -r line; do
  breach "${line%%:*} looks at faults (the reference must not): ${line#*:}"
done < <(grep -rnE 'core/faults\.h|ScenarioHasFault|\.faults\b' reference --include='*.h' --include='*.cc')

if ((fail)); then exit 1; fi
echo "layer walls hold"
