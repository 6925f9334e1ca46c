#!/usr/bin/python3
"""A user's regression loop with gradient clipping and gradient accumulation done the simple way: every micro-batch
goes through DDP (each backward all-reduces), each micro-batch loss divided by the window, then
clip_grad_norm_ and one optimizer step (DistributedSampler, SGD with momentum, StepLR per epoch).

    --mistakes none,no-divide,bypass-ddp
  no-divide    the micro-batch losses are not divided by the accumulation window
  bypass-ddp   every rank calls model.module(x): DDP never all-reduces
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

ACCUMULATE = 2


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh())
        self.head = nn.Linear(48, 3)

    def forward(self, x):
        return self.head(self.body(x))


class Indexed(TensorDataset):
    def __getitem__(self, i):
        return (*super().__getitem__(i), i)


def train(rank, world, mistake, out):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(96, 12, generator=g)
    y = x[:, :3] * 2.0 - x[:, 3:6] + 0.1 * torch.randn(96, 3, generator=g)
    data = Indexed(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Regressor())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loss_fn = nn.MSELoss()
    with ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=loss_fn, out_dir=out,
                                    schedulers=[sched]) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                opt.zero_grad()
                for part_x, part_y in zip(xb.chunk(ACCUMULATE), yb.chunk(ACCUMULATE)):
                    out_ = model.module(part_x) if mistake == "bypass-ddp" else model(part_x)
                    loss = loss_fn(out_, part_y)
                    (loss if mistake == "no-divide" else loss / ACCUMULATE).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
                opt.step()
                rec.step(idx, xb, yb, loss)
            sched.step()


def run(rank, world, port, out, mistakes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    for m in mistakes.split(","):
        train(rank, world, m, os.path.join(out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--mistakes", default="none")
    a = p.parse_args()
    mp.spawn(run, args=(a.world, a.port, a.out, a.mistakes), nprocs=a.world)
