#!/usr/bin/python3
"""Recording overhead of tools/ddpcheck_torch.py: seconds per training step of one DDP loop (W ranks, gloo, CPU)
un-instrumented and recorded: with the default reference="auto" (this loop is one ddpcheck replays: an MLP,
CrossEntropyLoss, SGD, a DistributedSampler and the batch indices passed to rec.step, so no float64 reference is
recomputed), with reference=True (the float64 single-process reference at every step, what a run ddpcheck cannot
replay pays) and with reference=False.

    /usr/bin/python3 bench/torch_recorder_overhead.py [--world 2] [--steps 40] [--width 256] [--batch 64] [--tmp DIR]
        [--rounds 5] [--modes recorded]

After a warm-up loop, each round runs the plain loop and then each mode's (all in one process pair, so a change of
the machine's load hits both alike). Prints one JSON line per mode with rank 0's median step time and the ratio to
the plain loop of the same round (target <= 2x; the median over rounds, and each round's in "ratios"), the
whole loop's time per step (first step to the end of rec.close(), which waits for the recorder's writer thread, so
every file written is counted) with its ratio to the plain loop's, and rank 0's CPU time per step over the loop:
its training thread's (main_cpu) and its whole process's (cpu: the writer and gloo threads too). The recorder
writes every step's tensors to one archive per rank and step (under --tmp): the ratio grows with the model's size
relative to its compute and with the file system's cost per page (docs/torch.md, "Overhead"). All ranks record
into one folder per loop (rank<r>/ in it), as a script's out_dir="dump" does. Run from a folder
holding an older tools/ (a copy of this file beside it), it times that recorder on the same loop.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# One thread per rank, the BLAS's too (OpenBLAS otherwise starts a worker per core that spins in sched_yield between
# products: on two cores shared by two ranks it takes time from both loops; bench/compare.py does the same).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import ddpcheck_torch  # noqa: E402


REFERENCE = {"recorded": "auto", "recorded-reference": True, "recorded-no-reference": False}


def loop(rank, args, mode, out):
    g = torch.Generator().manual_seed(0)  # the same dataset on every rank; the sampler shards it
    n = args.steps * args.batch * args.world
    X, Y = torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,), generator=g)
    sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(X), shuffle=True, seed=0)
    order = torch.tensor(list(sampler))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    rec = None if mode == "plain" else ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=loss_fn,
                                                                   out_dir=out, reference=REFERENCE[mode])
    times = []
    start, cpu, main_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    for k in range(args.steps):
        idx = order[k * args.batch:(k + 1) * args.batch]
        x, y = X[idx], Y[idx]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        if rec is not None:
            rec.step(idx, x, y, loss)
        times.append(time.perf_counter() - t0)
    if rec is not None:
        rec.close()  # waits for the writer thread: the loop's time includes every file written
    return {"step": statistics.median(times[5:]), "loop": (time.perf_counter() - start) / args.steps,
            "cpu": (time.process_time() - cpu) / args.steps, "main_cpu": (time.thread_time() - main_cpu) / args.steps}


def worker(rank, args, tmp, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.set_num_threads(1)
    modes = args.modes.split(",")
    loop(rank, args, "plain", os.path.join(tmp, "warm-up"))  # warm caches; not counted
    dist.barrier()
    for r in range(args.rounds):  # plain, then each mode, every round: load drift hits both sides alike
        for mode in ["plain"] + modes:
            t = loop(rank, args, mode, os.path.join(tmp, "%s%d" % (mode, r)))
            dist.barrier()
            if rank == 0:
                results[(mode, r)] = t
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of plain + each mode in one process; the ratios "
                    "are each round's recorded over that round's plain, and the medians over rounds are printed")
    ap.add_argument("--modes", default=",".join(REFERENCE), help="recorded modes to time (comma-separated): "
                    + ", ".join(REFERENCE))
    ap.add_argument("--tmp", default=None, help="folder for the dumps (default: the system's temporary folder)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    for m in modes:
        if m not in REFERENCE:
            ap.error("unknown mode %r; known: %s" % (m, ", ".join(REFERENCE)))
    results = mp.Manager().dict()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:  # one dump folder for all ranks, as out_dir="dump" is
        mp.spawn(worker, args=(args, tmp, results), nprocs=args.world)
    med = statistics.median
    for mode in ["plain"] + modes:
        runs = [(results[(mode, r)], results[("plain", r)]) for r in range(args.rounds)]
        print(json.dumps({"mode": mode, "reference": REFERENCE.get(mode), "world": args.world, "width": args.width,
                          "batch": args.batch, "rounds": args.rounds,
                          "step_s": round(med(r["step"] for r, _ in runs), 6),
                          "ratio": round(med(r["step"] / p["step"] for r, p in runs), 3),
                          "ratios": [round(r["step"] / p["step"], 3) for r, p in runs],
                          "loop_s_per_step": round(med(r["loop"] for r, _ in runs), 6),
                          "loop_ratio": round(med(r["loop"] / p["loop"] for r, p in runs), 3),
                          "main_cpu_s_per_step": round(med(r["main_cpu"] for r, _ in runs), 6),
                          "cpu_s_per_step": round(med(r["cpu"] for r, _ in runs), 6)}))


if __name__ == "__main__":
    main()
