#!/usr/bin/python3
"""Sim vs PyTorch DDP step time, side by side, in one run.

For each MLP size (~10K, ~1M, ~10M parameters) and world W in 1, 2, 4, runs ddpcheck_bench_sim and
torch_ddp_step.py alternately (`--rounds` rounds, interleaved so both see the same machine load), takes the
median step time of each, and prints a table. The last line is `speedup_vs_torch_10k_w4=X` with
X = torch step time / sim step time at ~10K parameters, W=4.

    /usr/bin/python3 bench/compare.py [--build build-f] [--rounds 3] [--batch 32] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (label, hidden width h): params = 3 * (h*h + h) for Linear(h,h) x 3.
SIZES = [("10K", 56), ("1M", 576), ("10M", 1824)]
WORLDS = [1, 2, 4]


def steps_for(hidden):
    """(warmup, timed steps): fewer for the big models so the grid finishes in minutes."""
    if hidden <= 100:
        return 5, 100
    if hidden <= 1000:
        return 3, 20
    return 2, 4


def run_json(cmd, timeout_s=180, tries=3):
    """Runs one measurement; a run that hangs (seen now and then in torch's gloo rendezvous) is retried."""
    for attempt in range(tries):
        try:
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
            return json.loads(out.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            print(f"# timed out after {timeout_s} s (try {attempt + 1}/{tries}): {' '.join(cmd)}", file=sys.stderr)
        except subprocess.CalledProcessError as e:
            print(f"# failed with {e.returncode} (try {attempt + 1}/{tries}): {' '.join(cmd)}\n{e.stderr[-2000:]}",
                  file=sys.stderr)
    sys.exit(f"no result after {tries} tries: {' '.join(cmd)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build-f", help="build folder holding bench/ddpcheck_bench_sim")
    p.add_argument("--rounds", type=int, default=3, help="interleaved sim/torch rounds; medians are reported")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    p.add_argument("--no-fingerprints", action="store_true", help="sim: skip the fingerprint allgather")
    p.add_argument("--with-local", action="store_true",
                   help="also time the sim with the in-memory LocalCommunicator (extra column, not the headline)")
    p.add_argument("--with-ring", action="store_true",
                   help="also time the sim with every all-reduce through gloo::allreduce's ring (extra column)")
    p.add_argument("--quick", action="store_true", help="only the ~10K model at W=4 (the headline number)")
    args = p.parse_args()
    sim_bin = os.path.join(ROOT, args.build, "bench", "ddpcheck_bench_sim")
    if not os.path.exists(sim_bin):
        sys.exit(f"{sim_bin}: not built (cmake --build {args.build} --target ddpcheck_bench_sim)")
    grid = [(l, h, w) for l, h in SIZES for w in WORLDS]
    if args.quick:
        grid = [("10K", 56, 4)]
    rows = []
    for label, hidden, world in grid:
        warmup, steps = steps_for(hidden)
        common = ["--hidden", str(hidden), "--world", str(world), "--batch", str(args.batch),
                  "--warmup", str(warmup), "--steps", str(steps)]
        sim_cmd = [sim_bin, *common, "--reps", "1"] + (["--no-fingerprints"] if args.no_fingerprints else [])
        torch_cmd = [sys.executable, os.path.join(HERE, "torch_ddp_step.py"), *common, "--reps", "1"]
        extras = []  # (column, extra sim flags) for the optional columns
        if args.with_ring:
            extras.append(("ring", ["--gloo-ring-only"]))
        if args.with_local:
            extras.append(("local", ["--comm", "local"]))
        sim_ms, torch_ms = [], []
        extra_ms = {name: [] for name, _ in extras}
        for _ in range(args.rounds):
            sim_ms.append(run_json(sim_cmd)["step_ms"])
            torch_ms.append(run_json(torch_cmd)["step_ms"])
            for name, flags in extras:
                extra_ms[name].append(run_json(sim_cmd + flags)["step_ms"])
        s, t = statistics.median(sim_ms), statistics.median(torch_ms)
        rows.append((label, 3 * (hidden * hidden + hidden), world, s, t,
                     [statistics.median(extra_ms[name]) for name, _ in extras]))
        print(f"# {label} W={world}: sim {sim_ms} ms, torch {torch_ms} ms, " +
              ", ".join(f"{name} {extra_ms[name]} ms" for name, _ in extras), file=sys.stderr, flush=True)

    names = [name for name, _ in extras]
    notes = {"ring": "ring = the sim with every all-reduce through gloo::allreduce (no one-round direct exchange)",
             "local": "local = the sim with the in-memory LocalCommunicator"}
    print("# sim = ddpcheck_bench_sim (sim::RunSim, Gloo communicator, record=false); torch = torch_ddp_step.py; "
          "speedup = torch_ms / sim_ms" + "".join("; " + notes[n] for n in names))
    print(f"# batch {args.batch} per rank, fp32, SGD, Gloo on loopback, one thread per rank; "
          f"fingerprints {'off' if args.no_fingerprints else 'on'}; medians of {args.rounds} interleaved rounds")
    extra_head = "".join(f" {n + '_ms':>10} {'speedup':>8}" for n in names)
    extra_unit = "".join(f" {'ms/step':>10} {'x':>8}" for n in names)
    print(f"{'model':>6} {'params':>10} {'W':>2} {'sim_ms':>10} {'torch_ms':>10} {'speedup':>8}{extra_head}")
    print(f"{'':>6} {'':>10} {'':>2} {'ms/step':>10} {'ms/step':>10} {'x':>8}{extra_unit}")
    for label, params, world, s, t, ex in rows:
        extra = "".join(f" {e:>10.3f} {t / e:>8.2f}" for e in ex)
        print(f"{label:>6} {params:>10} {world:>2} {s:>10.3f} {t:>10.3f} {t / s:>8.2f}{extra}")
    headline = [r for r in rows if r[0] == "10K" and r[2] == 4][0]
    print(f"speedup_vs_torch_10k_w4={headline[4] / headline[3]:.2f}")


if __name__ == "__main__":
    main()
