#!/usr/bin/python3
"""A U-Net-style segmentation loop: a conv encoder, an upsampling decoder with a skip connection concatenated
along channels, BCEWithLogitsLoss on a binary mask, Adam(amsgrad=True) and a MultiStepLR stepped every batch;
batches from a DistributedSampler.

    --mistakes none,sampler-seed-per-rank
  sampler-seed-per-rank   DistributedSampler(..., seed=rank)
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


class TinyUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
        self.pool = nn.AvgPool2d(2)
        self.mid = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.out = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        skip = self.down(x)
        h = self.up(self.mid(self.pool(skip)))
        return self.out(torch.cat([h, skip], dim=1))


def train(rank, world, mistake, out):
    g = torch.Generator().manual_seed(4)
    imgs = torch.randn(8 * world, 1, 8, 8, generator=g)
    masks = (torch.rand(8 * world, 1, 8, 8, generator=g) > 0.5).float()
    ds = TensorDataset(imgs, masks, torch.arange(8 * world))
    sampler = DistributedSampler(ds, shuffle=True, seed=rank if mistake == "sampler-seed-per-rank" else 17)
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(TinyUNet())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[2, 3], gamma=0.5)
    criterion = nn.BCEWithLogitsLoss()
    recorder = ddpcheck_torch.DdpRecorder(model, optimizer, sampler=sampler, loss_fn=criterion, out_dir=out,
                                          schedulers=[scheduler])
    sampler.set_epoch(0)
    for img, mask, idx in DataLoader(ds, batch_size=2, sampler=sampler):
        optimizer.zero_grad()
        loss = criterion(model(img), mask)
        loss.backward()
        optimizer.step()
        scheduler.step()
        recorder.step(idx, img, mask, loss)
    recorder.close()


def main(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    for m in args.mistakes.split(","):
        train(rank, args.world, m, os.path.join(args.out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29520)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.world)
