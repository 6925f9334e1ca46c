#!/usr/bin/python3
"""Uneven inputs with DDP's Join context manager (the "Distributed Training with Uneven Inputs Using the Join
Context Manager" tutorial): an IterableDataset sharded by hand, so rank r reads 24 + 4r rows and runs more
batches than rank 0; each epoch in `with Join([model]):`, where ranks that run out of batches shadow the others'
all-reduces until every rank is done, then the last to join broadcasts its model. SGD, MSELoss, 2 epochs.

    --mistakes none,loss-times-world,momentum
  loss-times-world   (loss * world_size).backward()
  momentum           SGD(momentum=0.9): Join syncs the model at each round's end but not the optimizer; the ranks
                     that stepped alone updated their momentum alone, so the ranks' models drift apart from the
                     next epoch on (a run that looks fine and is not)
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

BATCH, EPOCHS = 4, 2


class Shard(IterableDataset):
    """This rank's rows of a synthetic regression stream: rank r gets 24 + 4r of them."""

    def __init__(self, rank):
        g = torch.Generator().manual_seed(100 + rank)
        self.x = torch.randn(24 + 4 * rank, 5, generator=g)
        self.y = self.x @ torch.linspace(-1, 1, 5).unsqueeze(1) + 0.05 * torch.randn(len(self.x), 1, generator=g)

    def __iter__(self):
        return iter(zip(self.x, self.y))


def run_case(rank, world, mistake, out):
    loader = DataLoader(Shard(rank), batch_size=BATCH)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9 if mistake == "momentum" else 0.0)
    loss_fn = nn.MSELoss()
    rec = ddpcheck_torch.DdpRecorder(model, opt, loss_fn=loss_fn, out_dir=out)
    for _ in range(EPOCHS):
        with Join([model]):
            for xb, yb in loader:
                opt.zero_grad()
                loss = loss_fn(model(xb), yb)
                (loss * world if mistake == "loss-times-world" else loss).backward()
                opt.step()
                rec.step(xb=xb, yb=yb, loss=loss)
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
    ap.add_argument("--port", type=int, default=29542)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.world)
