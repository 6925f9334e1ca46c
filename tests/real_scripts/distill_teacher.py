#!/usr/bin/python3
"""Offline knowledge distillation, after the PyTorch "Knowledge Distillation Tutorial": a frozen teacher MLP
(loaded from a checkpoint, here a seed-100 init) precomputes soft logits for the training set; the student
Linear -> BatchNorm1d -> ReLU -> Dropout(0.1) -> Linear learns from alpha * KL(log_softmax(s/T) || softmax(t/T)) T^2 +
(1 - alpha) * CE(s, y), T = 2, alpha = 0.5, in an nn.Module whose target packs the teacher's logits and the label.
Adamax, StepLR per epoch, DistributedSampler(shuffle=True), 2 epochs x 3 steps of 8 rows, a validation pass through
ddp.module in the middle of each epoch. Checked by the protocol check alone (Dropout).

    --mistakes none,teacher-rank0-only
  teacher-rank0-only  the teacher's checkpoint is loaded on rank 0 only (the others keep their own init): each rank's
                      soft targets come from another teacher, so a row rank 0 drew in epoch 0 and rank 1 in epoch 1
                      holds two targets (dataset-per-rank); each rank draws its own rows the same every time
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

F_IN, C = 10, 4


class KDLoss(nn.Module):
    def __init__(self, T=2.0, alpha=0.5):
        super().__init__()
        self.T, self.alpha = T, alpha

    def forward(self, s, target):
        t, y = target[:, :C], target[:, C].long()
        kd = F.kl_div(F.log_softmax(s / self.T, -1), F.softmax(t / self.T, -1), reduction="batchmean") * self.T ** 2
        return self.alpha * kd + (1 - self.alpha) * F.cross_entropy(s, y)


def fit(rank, world, mistake, out):
    torch.manual_seed(100 if (mistake != "teacher-rank0-only" or rank == 0) else rank)
    teacher = nn.Sequential(nn.Linear(F_IN, 64), nn.ReLU(), nn.Linear(64, C)).eval()
    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(F_IN, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, C))
    ddp = DDP(student)
    opt = torch.optim.Adamax(ddp.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    kdloss = KDLoss()
    g = torch.Generator().manual_seed(11)
    n = 24 * world
    X = torch.randn(n, F_IN, generator=g)
    Y = torch.randint(0, C, (n,), generator=g)
    with torch.no_grad():
        T = torch.cat([teacher(X), Y[:, None].float()], 1)
    Xv, Yv = torch.randn(16, F_IN, generator=g), torch.randint(0, C, (16,), generator=g)
    ds = TensorDataset(X, T, torch.arange(n))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    rec = ddpcheck_torch.DdpRecorder(ddp, opt, loss_fn=kdloss, out_dir=out, sampler=sampler, schedulers=[sched])
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (xb, tb, idx) in enumerate(loader):
            opt.zero_grad()
            loss = kdloss(ddp(xb), tb)
            loss.backward()
            opt.step()
            rec.step(idx, xb, tb, loss)
            if i == 1:
                ddp.module.eval()
                with torch.no_grad():
                    (ddp.module(Xv).argmax(-1) == Yv).float().mean().item()
                ddp.module.train()
        sched.step()
    rec.close()


def worker(rank, args):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.set_num_threads(1)
    for mistake in args.mistakes.split(","):
        fit(rank, args.world, mistake, os.path.join(args.out, mistake))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
