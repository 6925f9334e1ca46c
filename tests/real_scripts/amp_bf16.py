#!/usr/bin/python3
"""An AMP-style loop on CPU: torch.autocast(device_type="cpu", dtype=torch.bfloat16) around the forward, a
GradScaler that is disabled (torch 1.13's GradScaler is CUDA-only; enabled=False keeps the loop's shape),
OneCycleLR stepped every iteration, SGD with momentum, MSE loss; each rank a random slice of the data.

    --mistakes none,loss-times-world,autocast-rank1-off
  loss-times-world     scaler.scale(loss * world_size).backward()
  autocast-rank1-off   rank 1 runs without autocast (enabled= from a per-rank setting: "no bf16 on that host")
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

STEPS = 4


def run_case(rank, world, mistake, out):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.1), nn.Linear(32, 32), nn.Sigmoid(), nn.Linear(32, 4))
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=STEPS)
    scaler = torch.cuda.amp.GradScaler(enabled=False)
    loss_fn = nn.MSELoss()
    rec = ddpcheck_torch.DdpRecorder(ddp, opt, loss_fn=loss_fn, out_dir=out, scaler=scaler, schedulers=[sched])
    g = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        use_amp = not (mistake == "autocast-rank1-off" and rank == 1)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=use_amp):
            loss = loss_fn(ddp(x).float(), y)
        opt.zero_grad()
        scaler.scale(loss * world if mistake == "loss-times-world" else loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        rec.step(loss=loss)
    rec.close()


def main(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    for m in args.mistakes.split(","):
        run_case(rank, args.world, m, os.path.join(args.out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29518)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.world)
