#!/usr/bin/python3
"""Fine-tuning a "pretrained" backbone (rank 0 saves a checkpoint, every rank loads it, as a user loading torchvision
weights would): the stem is frozen (requires_grad=False before DDP), block1/block2 are fine-tuned at lr 1e-4 and a
new classification head at lr 1e-2. Adam with three param groups: backbone weights (weight_decay 1e-2), backbone
biases (no weight decay), head (no weight decay). CrossEntropyLoss, DistributedSampler, 2 epochs.

    --mistakes none,loss-times-world,head-lr-rank1,freeze-rank1,opt-missing-rank1
  loss-times-world   loss * world_size
  head-lr-rank1      rank 1 builds its optimizer with the head at lr 1e-3 (the lr set differently on one rank)
  freeze-rank1       rank 1 also freezes block1 (requires_grad=False after DDP, e.g. a rank-dependent
                     "freeze until step N" schedule): a parameter frozen on one rank only
  opt-missing-rank1  rank 1 forgets block2 in its optimizer's param groups (so it never updates it)
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.block1 = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.block2 = nn.Sequential(nn.Linear(32, 24), nn.ReLU())

    def forward(self, x):
        return self.block2(self.block1(self.stem(x)))


class FineTuned(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.backbone = Backbone()
        self.head = nn.Linear(24, n_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


class Indexed(TensorDataset):
    def __getitem__(self, i):
        return (*super().__getitem__(i), i)


def train(rank, world, mistake, out):
    ckpt = os.path.join(out, "pretrained.pt")
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        torch.manual_seed(100)
        torch.save(Backbone().state_dict(), ckpt)
    dist.barrier()
    torch.manual_seed(rank)  # the new head's init differs per rank: DDP broadcasts rank 0's
    model = FineTuned(5)
    model.backbone.load_state_dict(torch.load(ckpt, map_location="cpu"))
    for p in model.backbone.stem.parameters():
        p.requires_grad = False
    ddp = DDP(model)
    if mistake == "freeze-rank1" and rank == 1:
        for p in ddp.module.backbone.block1.parameters():
            p.requires_grad = False
    bb = [(n, p) for n, p in model.backbone.named_parameters() if p.requires_grad]
    if mistake == "opt-missing-rank1" and rank == 1:
        bb = [(n, p) for n, p in bb if not n.startswith("block2")]
    head_lr = 1e-3 if (mistake == "head-lr-rank1" and rank == 1) else 1e-2
    opt = torch.optim.Adam([
        {"params": [p for n, p in bb if n.endswith("weight")], "lr": 1e-4, "weight_decay": 1e-2},
        {"params": [p for n, p in bb if n.endswith("bias")], "lr": 1e-4, "weight_decay": 0.0},
        {"params": model.head.parameters(), "lr": head_lr, "weight_decay": 0.0},
    ])
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 16, generator=g)
    y = torch.randint(0, 5, (64,), generator=g)
    data = Indexed(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=11)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    criterion = nn.CrossEntropyLoss()
    with ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=criterion, out_dir=out) as rec:
        ddp.train()
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                opt.zero_grad(set_to_none=True)
                loss = criterion(ddp(xb), yb)
                if mistake == "loss-times-world":
                    loss = loss * world
                loss.backward()
                opt.step()
                rec.step(idx, xb, yb, loss)


def run(rank, world, port, out, mistakes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    torch.set_num_threads(1)
    for m in mistakes.split(","):
        try:
            train(rank, world, m, os.path.join(out, m))
        except Exception as e:  # noqa: BLE001  a mistake that crashes DDP: report it and go on
            print("rank %d mistake %s raised %s: %s" % (rank, m, type(e).__name__, str(e)[:300]), flush=True)
            return
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29611)
    p.add_argument("--mistakes", default="none")
    a = p.parse_args()
    mp.spawn(run, args=(a.world, a.port, a.out, a.mistakes), nprocs=a.world)
