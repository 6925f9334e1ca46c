#!/usr/bin/python3
"""A user's MNIST MLP (Flatten, Linear, ReLU, Dropout, LogSoftmax + F.nll_loss, Adam) on synthetic 1x8x8 images,
each rank drawing its own shard by hand (no DistributedSampler).

    --mistakes none,loss-times-world,bypass-ddp
  loss-times-world   loss = F.nll_loss(...) * world_size
  bypass-ddp         every rank calls net.module(x): the inner module, so DDP never all-reduces
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(64, 32)
        self.dropout = nn.Dropout(0.25)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.dropout(F.relu(self.fc1(self.flatten(x))))
        return F.log_softmax(self.fc2(x), dim=1)


def train(rank, world, mistake, out):
    torch.manual_seed(1234 + rank)  # dropout masks differ per rank
    images = torch.rand(48, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 10, (48,), generator=torch.Generator().manual_seed(1))
    mine = torch.arange(rank, 48, world)  # this rank's rows
    net = nn.parallel.DistributedDataParallel(Net())
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    recorder = ddpcheck_torch.DdpRecorder(net, optimizer, loss_fn=F.nll_loss, out_dir=out)
    net.train()
    for batch in mine.split(6)[:3]:
        data, target = images[batch], labels[batch]
        optimizer.zero_grad()
        output = net.module(data) if mistake == "bypass-ddp" else net(data)
        loss = F.nll_loss(output, target)
        if mistake == "loss-times-world":
            loss = loss * world
        loss.backward()
        optimizer.step()
        recorder.step(batch, data, target, loss)
    recorder.close()


def run(rank, world, port, out, mistakes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for m in mistakes.split(","):
        train(rank, world, m, os.path.join(out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29514)
    p.add_argument("--mistakes", default="none")
    a = p.parse_args()
    mp.spawn(run, args=(a.world, a.port, a.out, a.mistakes), nprocs=a.world)
