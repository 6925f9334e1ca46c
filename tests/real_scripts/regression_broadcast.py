#!/usr/bin/python3
"""A tabular regression as tutorials write it (a TensorDataset of features and a target column, an MLP ending in
nn.Linear(hidden, 1), MSELoss, Adam, a DistributedSampler with set_epoch), with the shape slip many of them
have: the targets are a column vector y of shape (B,) while the model outputs (B, 1), so MSELoss broadcasts them
to a (B, B) loss (torch only warns "Using a target size ... different to the input size"). The loss is the
user's choice; DDP's part is still checkable: ddpcheck checks the run by protocol (its replay does not model
the broadcast) against the recorder's float64 reference, which calls the same loss.

    --mistakes none,loss-times-world,skip-set-epoch
  loss-times-world   (loss * world_size).backward()
  skip-set-epoch     sampler.set_epoch(epoch) forgotten: every epoch sees epoch 0's order
"""
import argparse
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

ROWS, FEATURES, BATCH, EPOCHS = 96, 6, 8, 2


def run_case(rank, world, mistake, out):
    warnings.filterwarnings("ignore", message="Using a target size")
    g = torch.Generator().manual_seed(7)
    features = torch.randn(ROWS, FEATURES, generator=g)
    target = features @ torch.randn(FEATURES, generator=g) + 0.1 * torch.randn(ROWS, generator=g)  # shape (ROWS,)
    dataset = TensorDataset(torch.arange(ROWS), features, target)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    torch.manual_seed(0)
    regressor = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    model = nn.parallel.DistributedDataParallel(regressor)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.MSELoss()
    rec = ddpcheck_torch.DdpRecorder(model, opt, loss_fn=criterion, out_dir=out, sampler=sampler)
    for epoch in range(EPOCHS):
        if mistake != "skip-set-epoch":
            sampler.set_epoch(epoch)
        for idx, xb, yb in loader:
            opt.zero_grad()
            loss = criterion(model(xb), yb)
            (loss * world if mistake == "loss-times-world" else loss).backward()
            opt.step()
            rec.step(idx, xb, yb, loss)
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
    ap.add_argument("--port", type=int, default=29540)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.world)
