#!/usr/bin/python3
"""A small CNN (Conv2d, BatchNorm2d, MaxPool2d, AdaptiveAvgPool2d, Flatten) on synthetic 3x8x8 images,
CrossEntropyLoss(label_smoothing=0.1), SGD with Nesterov momentum and weight decay, gradient accumulation over
2 micro-batches with no_sync.

    --mistakes none,no-buffer-broadcast,accum-no-divide,eval-rank1
  no-buffer-broadcast   DDP(broadcast_buffers=False): BatchNorm running stats drift apart per rank
  accum-no-divide       the micro-batch losses are not divided by the accumulation window
  eval-rank1            rank 1 validates after the first step (model.eval()) and never calls model.train() again
"""
import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

ACCUM = 2


def make_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def fit(rank, world, mistake, out):
    g = torch.Generator().manual_seed(3)
    ds = TensorDataset(torch.randn(16 * world, 3, 8, 8, generator=g), torch.randint(0, 4, (16 * world,), generator=g),
                       torch.arange(16 * world))
    sampler = DistributedSampler(ds, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(make_cnn(), broadcast_buffers=mistake != "no-buffer-broadcast")
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    with ddpcheck_torch.DdpRecorder(model, opt, loss_fn=criterion, out_dir=out) as rec:
        sampler.set_epoch(0)
        for i, (x, y, _) in enumerate(loader):
            sync = (i + 1) % ACCUM == 0
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = criterion(model(x), y)
                (loss if mistake == "accum-no-divide" else loss / ACCUM).backward()
            if sync:
                opt.step()
                opt.zero_grad()
                rec.step(loss=loss)
                if mistake == "eval-rank1" and dist.get_rank() == 1 and i == ACCUM - 1:
                    model.eval()  # a validation on rank 1 only, model.train() forgotten after it


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
    ap.add_argument("--port", type=int, default=29515)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
