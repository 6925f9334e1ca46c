#!/usr/bin/python3
"""An MLP autoencoder in the style of Lightning's LitAutoEncoder (encoder Linear-act-Linear to a small code,
decoder back, F.mse_loss on the reconstruction) with LayerNorm, GELU and SiLU, plus two same-shaped auxiliary
heads in an nn.ModuleDict (multi-task), AdamW(weight_decay=0.05), OneCycleLR stepped every batch (the
torch.optim.lr_scheduler.OneCycleLR docs' loop), and NO DistributedSampler: each rank slices its own shard by
hand (x[rank::world]), batches cut in order, the last partial batch dropped. Synthetic 1x6x6 "images" flattened to
36 features, 2 epochs. The dataset has 4*4*world+1 rows, so the shards are uneven (rank 0 holds a row more).

    --mistakes none,onecycle-local-len,param-order-rank1
  onecycle-local-len  OneCycleLR(steps_per_epoch=math.ceil(len(shard) / bs)): the rank whose shard holds an
                      extra row gets a longer schedule, so its lr differs from step 1 on
  param-order-rank1   the aux heads are built by iterating a set of task names, whose order differs between
                      processes under hash randomisation (here: reversed on rank 1, deterministically): the
                      ModuleDict registers the same-shaped heads in another order on rank 1, so DDP's
                      broadcast and all-reduce pair rank 0's "depth" head with rank 1's "edges" head
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

D, H, CODE, BS = 36, 24, 4, 4
TASKS = ["depth", "edges"]


class AutoEncoder(nn.Module):
    def __init__(self, task_order):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(D, H), nn.LayerNorm(H), nn.GELU(), nn.Linear(H, CODE))
        self.decoder = nn.Sequential(nn.Linear(CODE, H), nn.SiLU(), nn.Linear(H, D))
        self.heads = nn.ModuleDict({t: nn.Linear(CODE, 2) for t in task_order})

    def forward(self, x):
        z = self.encoder(x)
        aux = sum(self.heads[t](z).pow(2).mean() for t in TASKS)
        return self.decoder(z), aux


def recon_loss(out, x):
    x_hat, aux = out
    return F.mse_loss(x_hat, x) + 0.01 * aux


def fit(rank, world, mistake, out, args):
    g = torch.Generator().manual_seed(11)
    n = 4 * BS * world + 1
    data = torch.rand(n, 1, 6, 6, generator=g).flatten(1)
    rows = torch.arange(rank, n, world)  # this rank's shard
    n_batches = len(rows) // BS  # drop_last: the same on every rank
    torch.manual_seed(0)
    order = TASKS[::-1] if mistake == "param-order-rank1" and rank == 1 else TASKS
    model = DDP(AutoEncoder(order))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    steps_per_epoch = math.ceil(len(rows) / BS) if mistake == "onecycle-local-len" else n_batches
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, epochs=args.epochs,
                                                    steps_per_epoch=steps_per_epoch)
    with ddpcheck_torch.DdpRecorder(model, optimizer, loss_fn=recon_loss, out_dir=out,
                                    schedulers=[scheduler]) as rec:
        for epoch in range(args.epochs):
            for b in range(n_batches):
                idx = rows[b * BS:(b + 1) * BS]
                x = data[idx]
                optimizer.zero_grad()
                loss = recon_loss(model(x), x)
                loss.backward()
                optimizer.step()
                scheduler.step()
                rec.step(idx, x, x, loss)


def worker(rank, args):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.set_num_threads(1)
    for m in args.mistakes.split(","):
        fit(rank, args.world, m, os.path.join(args.out, m), args)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29604)
    p.add_argument("--mistakes", default="none")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
