#!/usr/bin/python3
"""Full-batch regression without any sampler: every rank takes rows [rank*n/W, (rank+1)*n/W) of a tensor by
slicing; Adadelta with weight decay, ReduceLROnPlateau stepped on the epoch's loss, L1 loss, a Tanh MLP with an
Identity and a bias-free output layer. One optimizer step per epoch.

    --mistakes none,skip-step-rank1
  skip-step-rank1   rank 1 skips optimizer.step() at epoch 2 because its loss "spiked"
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


def train(rank, world, mistake, out):
    g = torch.Generator().manual_seed(21)
    X = torch.randn(12 * world, 5, generator=g)
    Y = X @ torch.randn(5, 1, generator=g) + 0.1 * torch.randn(12 * world, 1, generator=g)
    n = X.shape[0] // world
    xs, ys = X[rank * n:(rank + 1) * n], Y[rank * n:(rank + 1) * n]
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(5, 10), nn.Tanh(), nn.Identity(), nn.Linear(10, 1, bias=False))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adadelta(ddp.parameters(), lr=1.0, weight_decay=1e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    l1 = nn.L1Loss()
    with ddpcheck_torch.DdpRecorder(ddp, opt, loss_fn=l1, out_dir=out, schedulers=[plateau]) as rec:
        for epoch in range(4):
            opt.zero_grad()
            loss = l1(ddp(xs), ys)
            loss.backward()
            if not (mistake == "skip-step-rank1" and rank == 1 and epoch == 2):
                opt.step()
            rec.step(loss=loss)
            plateau.step(loss.item() if epoch != 1 else 1e9)  # epoch 1 "plateaus": the lr halves


def main(rank, world, port, out, mistakes):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for m in mistakes.split(","):
        train(rank, world, m, os.path.join(out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29519)
    ap.add_argument("--mistakes", default="none")
    a = ap.parse_args()
    mp.spawn(main, args=(a.world, a.port, a.out, a.mistakes), nprocs=a.world)
