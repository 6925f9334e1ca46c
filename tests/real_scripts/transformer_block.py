#!/usr/bin/python3
"""A tiny transformer block for token classification: Embedding, LayerNorm, MultiheadAttention, GELU MLP with
residual adds; AdamW with two param groups (no weight decay on norms and biases) and a LambdaLR warm-up stepped
every iteration; batches drawn by a DistributedSampler.

    --mistakes none,scheduler-one-rank,loss-times-world
  scheduler-one-rank   only rank 0 calls scheduler.step() ("logging rank does the bookkeeping")
  loss-times-world     loss * world_size
"""
import argparse
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

VOCAB, DIM, SEQ = 20, 16, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, num_heads=2, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 32), nn.GELU(), nn.Linear(32, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return self.head(h)


def train(rank, world, mistake, out):
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, VOCAB, (8 * world, SEQ), generator=g)
    ds = TensorDataset(tokens[:, :-1], tokens[:, 1:], torch.arange(8 * world))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    torch.manual_seed(42)
    model = DDP(Block())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / 3))
    loss_fn = nn.CrossEntropyLoss()
    rec = ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, out_dir=out, schedulers=[sched],
                                     loss_fn=lambda logits, y: loss_fn(logits.reshape(-1, VOCAB), y.reshape(-1)))
    sampler.set_epoch(0)
    for x, y, idx in DataLoader(ds, batch_size=2, sampler=sampler):
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, VOCAB), y.reshape(-1))
        if mistake == "loss-times-world":
            loss = loss * world
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mistake != "scheduler-one-rank" or rank == 0:
            sched.step()
        rec.step(idx, x, y, loss)
    rec.close()


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
    ap.add_argument("--port", type=int, default=29516)
    ap.add_argument("--mistakes", default="none")
    mp.spawn(main, args=(ap.parse_args(),), nprocs=ap.parse_args().world)
