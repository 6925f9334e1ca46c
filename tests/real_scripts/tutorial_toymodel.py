#!/usr/bin/python3
"""PyTorch's "Getting Started with DDP" tutorial (ToyModel class, mp.spawn, gloo), instrumented with ddpcheck.

Random data straight from torch.randn each step (no dataset, no sampler), SGD, MSELoss.
  --mistakes none,loss-times-world,loss-scale-rank1   (each case in OUT/<case>/, one after the other)
  loss-times-world   (loss * world_size).backward(), "because DDP sums the gradients"
  loss-scale-rank1   rank 1 weights its loss by 2 (a per-rank loss scale)
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402  (ddpcheck line 1/4)


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size, mistake, out):
    torch.manual_seed(rank)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    rec = ddpcheck_torch.DdpRecorder(ddp_model, optimizer, loss_fn=loss_fn, out_dir=out)  # 2/4
    for _ in range(3):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss = loss_fn(outputs, labels)
        if mistake == "loss-times-world":
            loss = loss * world_size
        if mistake == "loss-scale-rank1" and rank == 1:
            loss = loss * 2.0
        loss.backward()
        optimizer.step()
        rec.step(loss=loss)  # 3/4
    rec.close()  # 4/4


def main(rank, world_size, args):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    for mistake in args.mistakes.split(","):
        demo_basic(rank, world_size, mistake, os.path.join(args.out, mistake))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29512)
    ap.add_argument("--mistakes", default="none")
    a = ap.parse_args()
    mp.spawn(main, args=(a.world, a), nprocs=a.world, join=True)
