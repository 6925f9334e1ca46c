#!/usr/bin/python3
"""A tabular CTR-style model in the style of the "entity embeddings for categorical variables" tutorials: two
categorical columns through an nn.Embedding each, concatenated with standardised numeric features, then
Linear-LayerNorm-ReLU-Linear to one logit; BCEWithLogitsLoss; Adam with two param groups (weight decay 1e-4 for
weight matrices, none for biases, LayerNorm and embeddings), a linear warmup then cosine decay as a LambdaLR stepped
every iteration (given to the recorder); forward(cat, num); a DistributedSampler(drop_last=True) with set_epoch;
3 epochs on 50 synthetic rows.

    --mistakes none,pretrained-rank0
  pretrained-rank0  rank 0 copies "pretrained" embedding vectors into model.module after DDP(...) was built (the
                    main process loads the checkpoint): the ranks start from different embeddings and DDP never
                    broadcasts parameters again (no-initial-broadcast at step 0 on city.weight: rank 1 of two, rank 0 of
                    three)
"""
import argparse
import math
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

N_CITY, N_DEV, N_NUM = 7, 4, 5


class TabularNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.city = nn.Embedding(N_CITY, 4)
        self.device = nn.Embedding(N_DEV, 3)
        self.mlp = nn.Sequential(nn.Linear(4 + 3 + N_NUM, 24), nn.LayerNorm(24), nn.ReLU(), nn.Linear(24, 1))

    def forward(self, cat, num):
        h = torch.cat([self.city(cat[:, 0]), self.device(cat[:, 1]), num], dim=1)
        return self.mlp(h).squeeze(1)


def fit(rank, world, mistake, out):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(9)
    n = 50
    cat = torch.stack([torch.randint(0, N_CITY, (n,), generator=g), torch.randint(0, N_DEV, (n,), generator=g)], 1)
    num = torch.randn(n, N_NUM, generator=g) * 3 + 1
    num = (num - num.mean(0)) / num.std(0)
    y = ((num[:, 0] + (cat[:, 0] % 2).float()) > 0.5).float()
    ds = TensorDataset(cat, num, y, torch.arange(n))
    sampler = DistributedSampler(ds, shuffle=True, seed=1, drop_last=True)
    loader = DataLoader(ds, batch_size=5, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(TabularNet())
    if mistake == "pretrained-rank0" and rank == 0:
        pretrained = torch.randn(N_CITY, 4, generator=torch.Generator().manual_seed(77))
        with torch.no_grad():
            model.module.city.weight.copy_(pretrained)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "city" not in name and "device" not in name else no_decay).append(p)
    opt = torch.optim.Adam([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                           lr=1e-2)
    epochs, warmup = 3, 3
    total = epochs * len(loader)

    def lr_lambda(it):
        if it < warmup:
            return (it + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (it - warmup) / max(1, total - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    criterion = nn.BCEWithLogitsLoss()
    with ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=criterion, out_dir=out,
                                    schedulers=[sched]) as rec:
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for c, x, t, idx in loader:
                opt.zero_grad()
                loss = criterion(model(c, x), t)
                loss.backward()
                opt.step()
                sched.step()
                rec.step(idx, (c, x), t, loss)
            if rank == 0:
                print(f"[{mistake}] epoch {epoch} loss {loss.item():.4f} lr {sched.get_last_lr()}")


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
    ap.add_argument("--port", type=int, default=29572)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
