#!/usr/bin/python3
"""An imbalanced binary classifier (about one positive in five) trained with nn.BCEWithLogitsLoss(pos_weight =
negatives / positives), distilled at the same time from a frozen teacher: loss = alpha * BCE(s, y; pos_weight) +
(1 - alpha) * T^2 * BCE(s / T, sigmoid(t / T)), in a plain function closing over the criterion, alpha and a small
module holding the temperature, which the loop anneals every epoch (T = 3, 2.5) on every rank. The teacher (a seed-50
init, loaded on every rank) precomputes its logits for the training set, packed into the target beside the label.
The loss also closes over the rank (it logs on rank 0 only). MLP 12 -> 32 -> 1, Adam, DistributedSampler(shuffle=True),
2 epochs x 3 steps of 8 rows. Checked by the protocol check alone (a loss function ddpcheck does not replay).

    --mistakes none,pos-weight-allreduce,pos-weight-per-shard,alpha-per-rank
  none                  pos_weight from the whole dataset's counts (every rank holds the dataset): PASS
  pos-weight-allreduce  (correct) pos_weight from the rank's shard counts, all_reduced before building the loss:
                        every rank builds the same loss: PASS
  pos-weight-per-shard  pos_weight from the rank's own shard only: each rank weights its positives differently
                        (loss-per-rank, step 0, the criterion's pos_weight)
  alpha-per-rank        alpha = 0.5 + 0.1 * rank (a rank-dependent schedule gone wrong): loss-per-rank at step 0,
                        the closure variable alpha
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

F_IN = 12


class Temperature(nn.Module):
    """The distillation term's temperature, annealed by the loop."""
    def __init__(self, T):
        super().__init__()
        self.T = T

    def forward(self, s, t):
        return F.binary_cross_entropy_with_logits(s / self.T, torch.sigmoid(t / self.T)) * self.T ** 2


def make_loss(crit, alpha, kd, rank, log_every=100):
    calls = 0

    def loss_fn(out, target):
        nonlocal calls
        calls += 1
        y, t = target[:, 0], target[:, 1]
        loss = alpha * crit(out[:, 0], y) + (1 - alpha) * kd(out[:, 0], t)
        if rank == 0 and calls % log_every == 0:
            print("step %d loss %.4f" % (calls, loss.item()))
        return loss

    return loss_fn


def fit(rank, world, mistake, out):
    torch.manual_seed(50)
    teacher = nn.Sequential(nn.Linear(F_IN, 64), nn.ReLU(), nn.Linear(64, 1)).eval()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(F_IN, 32), nn.ReLU(), nn.Linear(32, 1))
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(7)
    n = 24 * world
    X = torch.randn(n, F_IN, generator=g)
    Y = (torch.rand(n, generator=g) < 0.2).float()
    Y[:2] = 1.0  # at least two positives: every shard's count is then likely, not certain, to differ
    with torch.no_grad():
        target = torch.stack([Y, teacher(X)[:, 0]], 1)
    ds = TensorDataset(X, target, torch.arange(n))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    if mistake == "pos-weight-per-shard":
        shard = Y[list(sampler)]
        pos, total = shard.sum(), torch.tensor(float(len(shard)))
    elif mistake == "pos-weight-allreduce":
        shard = Y[list(sampler)]
        counts = torch.stack([shard.sum(), torch.tensor(float(len(shard)))])
        dist.all_reduce(counts)
        pos, total = counts[0], counts[1]
    else:
        pos, total = Y.sum(), torch.tensor(float(n))
    crit = nn.BCEWithLogitsLoss(pos_weight=(total - pos) / pos.clamp(min=1))
    alpha = 0.5 + 0.1 * rank if mistake == "alpha-per-rank" else 0.5
    kd = Temperature(3.0)
    loss_fn = make_loss(crit, alpha, kd, rank)
    rec = ddpcheck_torch.DdpRecorder(ddp, opt, loss_fn=loss_fn, out_dir=out, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        kd.T = 3.0 - 0.5 * epoch  # the same schedule on every rank
        for xb, tb, idx in loader:
            opt.zero_grad()
            loss = loss_fn(ddp(xb), tb)
            loss.backward()
            opt.step()
            rec.step(idx, xb, tb, loss)
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
    ap.add_argument("--port", type=int, default=29651)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
