#!/usr/bin/python3
"""PyTorch's "Getting Started with DDP" tutorial, demo_checkpoint section, done mid-training (ToyModel, SGD with
momentum, MSELoss, a DistributedSampler over a fixed dataset), with WGAN-style weight clipping after every step.
After epoch 0 rank 0 saves ddp_model.state_dict() and optimizer.state_dict() (the "best" checkpoint), dist.barrier();
at the end of epoch 1 every rank restores it with map_location (a rollback) and trains on. Correct: the ranks stay
identical, and a single process would do the same (parameters changed outside optimizer.step() are not held to its
update; once a false alarm).
  --mistakes none,manual-allreduce,resume-epoch-rank0   (each case in OUT/<case>/, one after the other)
  manual-allreduce     dist.all_reduce(p.grad) after the backward on every rank, "to average the gradients":
                       DDP already averaged them, so the step is W times too large
  resume-epoch-rank0   rank 0 calls sampler.set_epoch(epoch + 1) (it resumed from a later snapshot than the others):
                       its shard is permuted with another seed + epoch, so shards overlap
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
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

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


def demo_checkpoint(rank, world_size, mistake, out):
    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    n = 8 * world_size
    ds = TensorDataset(torch.randn(n, 10, generator=g), torch.randn(n, 5, generator=g), torch.arange(n))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    checkpoint = os.path.join(out, "model.checkpoint")
    os.makedirs(out, exist_ok=True)
    rec = ddpcheck_torch.DdpRecorder(ddp_model, optimizer, loss_fn=loss_fn, out_dir=out, sampler=sampler)  # 2/4
    for epoch in range(3):
        sampler.set_epoch(epoch + 1 if mistake == "resume-epoch-rank0" and rank == 0 else epoch)
        for xb, yb, idx in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(xb), yb)
            loss.backward()
            if mistake == "manual-allreduce":
                for p in ddp_model.parameters():
                    dist.all_reduce(p.grad)
            optimizer.step()
            with torch.no_grad():  # weight clipping (WGAN's critic), on every rank
                for p in ddp_model.parameters():
                    p.data.clamp_(-0.3, 0.3)
            rec.step(idx, xb, yb, loss)  # 3/4
        if epoch == 0:
            if rank == 0:
                torch.save({"model": ddp_model.state_dict(), "optim": optimizer.state_dict()}, checkpoint)
            dist.barrier()
        if epoch == 1:  # roll back to the best checkpoint, on every rank
            ck = torch.load(checkpoint, map_location={"cuda:0": "cpu"})
            ddp_model.load_state_dict(ck["model"])
            optimizer.load_state_dict(ck["optim"])
    rec.close()  # 4/4
    dist.barrier()


def main(rank, world_size, args):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    for mistake in args.mistakes.split(","):
        demo_checkpoint(rank, world_size, mistake, os.path.join(args.out, mistake))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29512)
    ap.add_argument("--mistakes", default="none")
    a = ap.parse_args()
    mp.spawn(main, args=(a.world, a), nprocs=a.world, join=True)
