#!/usr/bin/python3
"""Steady-state step time of PyTorch DDP (gloo, CPU), the counterpart of ddpcheck_bench_sim.

W processes (torch.multiprocessing.spawn), one thread each (torch.set_num_threads(1)), gloo over loopback;
model Linear(h,h) -> ReLU -> Linear(h,h) -> ReLU -> Linear(h,h) wrapped in DDP (default buckets), MSE, SGD
lr 0.01, fp32, per-rank batch B drawn from a pre-generated dataset by shuffled indices each step (as the sim's
sampler does). After `warmup` steps and a barrier, each rank times `steps` steps; the step time is the
slowest rank's mean (a step ends when every rank is done). Prints one JSON line like ddpcheck_bench_sim.

    /usr/bin/python3 bench/torch_ddp_step.py --hidden 56 --world 4 --batch 32 --warmup 3 --steps 20
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, args, port, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    h = args.hidden
    model = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    total = args.warmup + args.steps
    gen = torch.Generator().manual_seed(1234)
    samples = args.batch * args.world * total
    x_all = torch.randn(samples, h, generator=gen)
    y_all = torch.randn(samples, h, generator=gen)
    order = torch.randperm(samples, generator=gen)

    def step(i):
        idx = order[(i * args.world + rank) * args.batch:(i * args.world + rank + 1) * args.batch]
        x, y = x_all[idx], y_all[idx]
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.warmup, total):
        step(i)
    elapsed = time.perf_counter() - t0
    times = [None] * args.world
    dist.all_gather_object(times, elapsed)
    if rank == 0:
        queue.put(max(times) / args.steps)
    # Every rank leaves together; destroy_process_group() was seen to hang now and then when peers had already
    # exited, so the process group is left to process exit.
    dist.barrier()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=56)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=1, help="independent runs; the median is reported")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    results = []
    for _ in range(args.reps):
        queue = ctx.SimpleQueue()
        mp.spawn(rank_main, args=(args, free_port(), queue), nprocs=args.world, join=True)
        results.append(queue.get())
    results.sort()
    params = 3 * (args.hidden * args.hidden + args.hidden)
    print(json.dumps({"impl": "torch", "hidden": args.hidden, "params": params, "world": args.world,
                      "batch": args.batch, "steps": args.steps, "reps": args.reps, "torch": torch.__version__,
                      "step_ms": round(results[len(results) // 2] * 1e3, 4),
                      "min_ms": round(results[0] * 1e3, 4), "max_ms": round(results[-1] * 1e3, 4)}))


if __name__ == "__main__":
    main()
