#!/usr/bin/env bash
# The GPU checks in one run, for a machine with an NVIDIA GPU (docs/gpu.md, "Side by side"): every `ctest -L gpu`
# executable, `ddpcheck gpu-report` on the default scenario and on the other scenarios/, and the DDP step time of
# ddpcheck's GPU world beside PyTorch DDP (NCCL) on the same GPU(s). Run from the repository root:
#
#   scripts/gpu_verify.sh BIN_DIR WORK_DIR REPORT_NAME
#
# BIN_DIR holds ddpcheck-gpu, the gpu_*_test executables and gpu_ddp_step_bench (build/release and
# build/release/real after a build; the script looks in both); WORK_DIR receives the logs and WORK_DIR/REPORT_NAME
# the report (commit it as reports/gpu/REPORT_NAME). Every step has its own timeout, so the script ends within
# about STEP_TIMEOUT (default 300 s) plus two bench runs; the tests and the reports run side by side (they share
# the GPU; nothing here is timed but the benches, which run alone afterwards).
set -u
bin=${1:?usage: scripts/gpu_verify.sh BIN_DIR WORK_DIR REPORT_NAME}
work=${2:?usage: scripts/gpu_verify.sh BIN_DIR WORK_DIR REPORT_NAME}
name=${3:?usage: scripts/gpu_verify.sh BIN_DIR WORK_DIR REPORT_NAME}
step_timeout=${STEP_TIMEOUT:-300}
find_bin() { for d in "$bin" "$bin/real"; do [ -x "$d/$1" ] && { echo "$d/$1"; return; }; done; echo "$bin/$1"; }
mkdir -p "$work/tests" "$work/faults"
{ date -u; nvidia-smi; nvidia-smi -L; nproc; } >"$work/env.log" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')

for t in $(ls "$bin"/gpu_*_test "$bin"/real/gpu_*_test 2>/dev/null); do
  n=$(basename "$t")
  ( start=$(date +%s); timeout "$step_timeout" "$t" >"$work/tests/$n.log" 2>&1; rc=$?
    echo "$n exit $rc ($(( $(date +%s) - start )) s)" >>"$work/summary.txt" ) &
done
gpu=$(find_bin ddpcheck-gpu)
( start=$(date +%s); timeout "$step_timeout" "$gpu" gpu-report --out "$work/$name" >"$work/gpu_report.log" 2>&1; rc=$?
  echo "gpu-report default exit $rc ($(( $(date +%s) - start )) s)" >>"$work/summary.txt" ) &
( start=$(date +%s)
  timeout "$step_timeout" "$gpu" gpu-report --out "$work/$name-scenarios" scenarios/syncbn_mlp.json \
    scenarios/tutorial_toymodel.json scenarios/exact_mlp.json --max-world 4 >"$work/gpu_report_scenarios.log" 2>&1
  rc=$?; echo "gpu-report scenarios exit $rc ($(( $(date +%s) - start )) s)" >>"$work/summary.txt" ) &
# Every catalogued bug (scenarios/faults/) on CUDA replicas: each must be named (exit 1), and the same scenario
# with --no-faults must pass (exit 0); none may crash.
( for f in scenarios/faults/*.json; do
    n=$(basename "$f" .json)
    timeout 120 "$gpu" run "$f" --backend hybrid --timeout-ms 5000 >"$work/faults/$n.log" 2>&1
    rc=$?; echo "$n exit $rc | $(grep -m1 '^VERDICT' "$work/faults/$n.log" | cut -c1-160)" >>"$work/faults.txt"
    timeout 120 "$gpu" run "$f" --no-faults --backend hybrid --timeout-ms 5000 >"$work/faults/$n.clean.log" 2>&1
    rc=$?; echo "$n --no-faults exit $rc | $(grep -m1 '^VERDICT' "$work/faults/$n.clean.log" | cut -c1-100)" \
      >>"$work/faults.txt"
  done; echo "faults done" >>"$work/summary.txt" ) &
wait

# The step, alone on the machine: ddpcheck's GPU world, then PyTorch DDP over NCCL, same model and batch.
bench=$(find_bin gpu_ddp_step_bench)
for amp in none bf16; do
  a=(); [ "$amp" != none ] && a=(--amp "$amp")
  echo "== ddpcheck gpu_ddp_step_bench W=$gpus amp=$amp" >>"$work/bench.txt"
  timeout 120 "$bench" --world "$gpus" --width 2048 --layers 3 --batch 256 --steps 300 "${a[@]}" >>"$work/bench.txt" 2>&1
  echo "== torch DDP (NCCL) W=$gpus amp=$amp" >>"$work/bench.txt"
  timeout 120 torchrun --standalone --nproc_per_node="$gpus" bench/torch_gpu_ddp_step.py --width 2048 --layers 3 \
    --batch 256 --steps 300 --amp "$amp" >>"$work/bench.txt" 2>&1
done
cat "$work/summary.txt" "$work/faults.txt" "$work/bench.txt"
