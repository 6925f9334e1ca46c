#!/usr/bin/python3
"""The replayed shape (nn.Sequential(Linear, ReLU, Linear), MSELoss, SGD with momentum, StepLR stepped per epoch,
DistributedSampler with set_epoch) with a DataLoader(drop_last=True) over 10 rows a rank in batches of 4: each
epoch ends a batch early, so the scheduler steps after 2 batches, not ceil(10 / 4) = 3. ddpcheck infers the dropped
batch from the recorded epochs and replays the run.

    --mistakes none,loss-times-world,skip-set-epoch
  skip-set-epoch   set_epoch never called: the recorded epochs then never change, and the dropped batch shows in
                   the step where the short last batch would be holding a whole batch
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


def go(rank, world, mistake, out):
    g = torch.Generator().manual_seed(2)
    X, Y = torch.randn(10 * world, 6, generator=g), torch.randn(10 * world, 3, generator=g)
    ds = TensorDataset(X, Y, torch.arange(10 * world))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loss_fn = nn.MSELoss()
    with ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=loss_fn, out_dir=out, schedulers=[sched]) as rec:
        rec.set_dataset(X, Y)
        for epoch in range(2):
            if mistake != "skip-set-epoch":
                sampler.set_epoch(epoch)
            for xb, yb, idx in DataLoader(ds, batch_size=4, sampler=sampler, drop_last=True):
                opt.zero_grad()
                loss = loss_fn(ddp(xb), yb)
                (loss * world if mistake == "loss-times-world" else loss).backward()
                opt.step()
                rec.step(idx, xb, yb, loss)
            sched.step()


def main(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    for m in args.mistakes.split(","):
        go(rank, args.world, m, os.path.join(args.out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29521)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.world)
