#!/usr/bin/python3
"""Sim vs PyTorch DDP step time, side by side, in one run.

For each MLP size (~10K, ~1M, ~10M parameters) and world W in 1, 2, 4, runs ddpcheck_bench_sim and
torch_ddp_step.py alternately (`--rounds` rounds, interleaved so both see the same machine load), takes the
median step time of each, and prints a table. The last line is `speedup_vs_torch_10k_w4=X` with
X = torch step time / sim step time at ~10K parameters, W=4.

    /usr/bin/python3 bench/compare.py [--build build-f] [--rounds 3] [--batch 32] [--quick]

Against what users run: the header names the BLAS torch's matmuls go through (read from the torch process's
memory map) and the run refuses (exit 2) to print a speedup against the netlib reference BLAS
(libblas3's, BLAS_INFO=generic) unless --allow-reference-blas: `apt-get install libopenblas0-pthread` (in
scripts/setup.sh) makes Debian's torch use OpenBLAS. Each row also prints the compute limit of the step: its
FLOPs per rank (18 B h^2 for three Linear(h,h), forward and backward) over the single-core GEMM peak measured
here (a float32 matmul on torch's BLAS, one thread), and its floor: the same step at W = 1 as a bare loop on the
sim's BLAS (ddpcheck_bench_sim --floor: the products, zero_grad's fill and the SGD update, nothing of the sim's),
so sim/floor is the sim's own cost and floor/limit the BLAS's and the memory's. --whole-check adds the whole
`ddpcheck run` (world + reference + step-local replay + compare + report) against the world alone, with peak
memory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

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


# One thread per rank on torch's side too: OpenBLAS's pthread build ignores torch.set_num_threads.
ONE_THREAD = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

PROBE = r"""
import json, re, time, torch
torch.set_num_threads(1)
a = torch.randn(64, 64); a @ a
libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if re.search(r'lib(open)?blas|libmkl|libblis', l)})
n = 1024
x, y = torch.randn(n, n), torch.randn(n, n)
x @ y
best = float('inf')
for _ in range(5):
    t = time.perf_counter(); x @ y; best = min(best, time.perf_counter() - t)
print(json.dumps({"libs": libs, "gflops": 2 * n ** 3 / best / 1e9, "torch": torch.__version__}))
"""


def torch_blas():
    """(kind, library paths, single-core float32 GEMM GFLOP/s) of the BLAS behind torch's CPU matmul."""
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True, env=ONE_THREAD)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    libs = info["libs"]
    joined = " ".join(libs)
    if "mkl" in joined:
        kind = "mkl"
    elif "openblas" in joined:
        kind = "openblas"
    elif "blis" in joined:
        kind = "blis"
    elif "/blas/libblas" in joined or "libblas.so" in joined:
        kind = "reference"  # Debian's libblas3: the netlib reference implementation
    else:
        kind = "none found (torch's own kernels)"
    return kind, libs, info["gflops"]


def run_json(cmd, timeout_s=180, tries=3):
    """Runs one measurement; a run that hangs (seen now and then in torch's gloo rendezvous) is retried."""
    for attempt in range(tries):
        try:
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s,
                                 env=ONE_THREAD)
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
    p.add_argument("--with-tcp", action="store_true",
                   help="also time the sim with Gloo's TCP transport between its rank threads (extra column)")
    p.add_argument("--with-ring", action="store_true",
                   help="also time the sim with every all-reduce through gloo::allreduce's ring (extra column)")
    p.add_argument("--quick", action="store_true", help="only the ~10K model at W=4 (the headline number)")
    p.add_argument("--allow-reference-blas", action="store_true",
                   help="print speedups even when torch runs on the netlib reference BLAS (no user trains on it)")
    p.add_argument("--whole-check", action="store_true",
                   help="also time `ddpcheck run` (world + reference + compare + report) against the world alone")
    p.add_argument("--whole-check-only", action="store_true",
                   help="only the whole check (--rounds interleaved runs of each side, medians), not the grid")
    args = p.parse_args()
    blas, libs, gflops = torch_blas()
    print(f"# torch BLAS: {blas} ({', '.join(libs) or 'no BLAS library mapped'}); single-core fp32 GEMM peak "
          f"{gflops:.1f} GFLOP/s (1024^3 matmul, one thread)")
    if blas == "reference" and not args.allow_reference_blas:
        print("bench/compare.py: torch uses the netlib reference BLAS (libblas3), which no one trains on: install a "
              "tuned one (apt-get install libopenblas0-pthread, or bash scripts/setup.sh) or pass "
              "--allow-reference-blas", file=sys.stderr)
        sys.exit(2)
    sim_bin = os.path.join(ROOT, args.build, "bench", "ddpcheck_bench_sim")
    if not os.path.exists(sim_bin):
        sys.exit(f"{sim_bin}: not built (cmake --build {args.build} --target ddpcheck_bench_sim)")
    grid = [(l, h, w) for l, h in SIZES for w in WORLDS]
    if args.quick:
        grid = [("10K", 56, 4)]
    if args.whole_check_only:
        whole_check(args, sim_bin, *(("10K", 56, 4) if args.quick else ("10M", 1824, 4)))
        return
    floors = {}  # hidden -> floor step times, one per round
    rows = []
    for label, hidden, world in grid:
        warmup, steps = steps_for(hidden)
        common = ["--hidden", str(hidden), "--world", str(world), "--batch", str(args.batch),
                  "--warmup", str(warmup), "--steps", str(steps)]
        sim_cmd = [sim_bin, *common, "--reps", "1"] + (["--no-fingerprints"] if args.no_fingerprints else [])
        torch_cmd = [sys.executable, os.path.join(HERE, "torch_ddp_step.py"), *common, "--reps", "1"]
        extras = []  # (column, extra sim flags) for the optional columns
        if args.with_tcp:
            extras.append(("tcp", ["--gloo-transport", "tcp"]))
        if args.with_ring:
            extras.append(("ring", ["--gloo-ring-only"]))
        if args.with_local:
            extras.append(("local", ["--comm", "local"]))
        sim_ms, torch_ms = [], []
        extra_ms = {name: [] for name, _ in extras}
        floor_cmd = [sim_bin, "--floor", "--hidden", str(hidden), "--batch", str(args.batch), "--warmup",
                     str(warmup), "--steps", str(steps), "--reps", "1"]
        for _ in range(args.rounds):
            if len(floors.setdefault(hidden, [])) < args.rounds:
                floors[hidden].append(run_json(floor_cmd)["step_ms"])
            sim_ms.append(run_json(sim_cmd)["step_ms"])
            torch_ms.append(run_json(torch_cmd)["step_ms"])
            for name, flags in extras:
                extra_ms[name].append(run_json(sim_cmd + flags)["step_ms"])
        s, t = statistics.median(sim_ms), statistics.median(torch_ms)
        rows.append((label, 3 * (hidden * hidden + hidden), world, s, t,
                     [statistics.median(extra_ms[name]) for name, _ in extras], hidden))
        print(f"# {label} W={world}: sim {sim_ms} ms, torch {torch_ms} ms, " +
              ", ".join(f"{name} {extra_ms[name]} ms" for name, _ in extras), file=sys.stderr, flush=True)

    names = [name for name, _ in extras]
    notes = {"tcp": "tcp = the sim with Gloo's TCP transport on loopback between its rank threads",
             "ring": "ring = the sim with every all-reduce through gloo::allreduce (no one-round direct exchange)",
             "local": "local = the sim with the in-memory LocalCommunicator"}
    print("# sim = ddpcheck_bench_sim (sim::RunSim, Gloo communicator, its rank threads on the in-process transport, record=false); torch = torch_ddp_step.py; "
          "speedup = torch_ms / sim_ms" + "".join("; " + notes[n] for n in names))
    print(f"# batch {args.batch} per rank, fp32, SGD, torch's Gloo on loopback TCP, one thread per rank; "
          f"fingerprints {'off' if args.no_fingerprints else 'on'}; medians of {args.rounds} interleaved rounds")
    extra_head = "".join(f" {n + '_ms':>10} {'speedup':>8}" for n in names)
    extra_unit = "".join(f" {'ms/step':>10} {'x':>8}" for n in names)
    print(f"# limit_ms = 18 * batch * h^2 FLOPs per rank-step / {gflops:.1f} GFLOP/s; W ranks share "
          f"{os.cpu_count()} cores, so above W={os.cpu_count()} the limit is per core, not per step")
    print("# floor_ms = ddpcheck_bench_sim --floor: one rank's step as a bare loop on the sim's BLAS (products, zero_grad, "
          "SGD; no DDP), the least the sim's W=1 step could take; above W=1 the ranks share cores and communicate")
    print(f"{'model':>6} {'params':>10} {'W':>2} {'sim_ms':>10} {'torch_ms':>10} {'speedup':>8} {'limit_ms':>9} "
          f"{'sim/limit':>9} {'floor_ms':>9} {'sim/floor':>9}{extra_head}")
    print(f"{'':>6} {'':>10} {'':>2} {'ms/step':>10} {'ms/step':>10} {'x':>8} {'ms/step':>9} {'x':>9} {'ms/step':>9} "
          f"{'x':>9}{extra_unit}")
    for label, params, world, s, t, ex, hidden in rows:
        limit = 18 * args.batch * hidden * hidden / (gflops * 1e9) * 1e3
        floor = statistics.median(floors[hidden])
        extra = "".join(f" {e:>10.3f} {t / e:>8.2f}" for e in ex)
        print(f"{label:>6} {params:>10} {world:>2} {s:>10.3f} {t:>10.3f} {t / s:>8.2f} {limit:>9.3f} {s / limit:>9.2f}"
              f" {floor:>9.3f} {s / floor:>9.2f}{extra}")
    headline = [r for r in rows if r[0] == "10K" and r[2] == 4][0]
    print(f"speedup_vs_torch_10k_w4={headline[4] / headline[3]:.2f}")
    if args.whole_check:
        whole_check(args, sim_bin, *(("10K", 56, 4) if args.quick else ("10M", 1824, 4)))


def whole_check(args, sim_bin, label, hidden, world):
    """`ddpcheck run` on the bench's MLP against the world alone (ddpcheck_bench_sim), with peak memory."""
    import tempfile
    ddpcheck = os.path.join(ROOT, args.build, "ddpcheck")
    if not os.path.exists(ddpcheck):
        sys.exit(f"{ddpcheck}: not built")
    steps = 4
    lin = {"type": "linear", "in": hidden, "out": hidden}
    scenario = {"name": f"bench-mlp-{label}", "model": [lin, {"type": "relu"}, lin, {"type": "relu"}, lin],
                "loss": "mse", "data": {"kind": "regression", "samples": world * args.batch * steps, "seed": 1},
                "world": world, "batch_size": args.batch, "precision": "fp32", "epochs": 1,
                "optimizer": {"type": "sgd", "lr": 0.01}}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "scenario.json")
        with open(path, "w") as f:
            json.dump(scenario, f)

        def timed(cmd):
            t = time.perf_counter()
            p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, cwd=ROOT,
                               env=ONE_THREAD)
            wall = time.perf_counter() - t
            if p.returncode not in (0, 1):
                sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
            return wall, int(p.stderr.strip().splitlines()[-1])  # max RSS, KiB

        runs, worlds = [], []
        for _ in range(max(1, args.rounds)):  # interleaved; medians
            runs.append(timed([ddpcheck, "run", path, "--quiet", "--progress", "never", "--comm", "gloo"]))
            worlds.append(timed([sim_bin, "--hidden", str(hidden), "--world", str(world), "--batch", str(args.batch),
                                 "--warmup", "1", "--steps", str(steps - 1), "--reps", "1"]))  # steps in all
        run_s, run_kib = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        world_s, world_kib = statistics.median(w[0] for w in worlds), statistics.median(w[1] for w in worlds)
    print(f"# whole check, {label} model, W={world}, {steps} steps, batch {args.batch}, fp32: ddpcheck run "
          f"{run_s:.2f} s, the world alone {world_s:.2f} s (process wall times, start-up included; medians of "
          f"{len(runs)}: run {[round(r[0], 2) for r in runs]}, world {[round(w[0], 2) for w in worlds]})")
    print(f"whole_check_ratio_{label}_w{world}={run_s / world_s:.2f}")
    print(f"peak_rss_mib_{label}_w{world}: ddpcheck run {run_kib / 1024:.0f} MiB for {world} rank threads "
          f"({run_kib / 1024 / world:.0f} MiB per rank), the world alone {world_kib / 1024:.0f} MiB "
          f"({world_kib / 1024 / world:.0f} MiB per rank)")


if __name__ == "__main__":
    main()
