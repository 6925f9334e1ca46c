#!/usr/bin/python3
"""A Switch-Transformer-style mixture-of-experts classifier (the top-1 routing of the Switch Transformer paper as
the minimal MoE tutorials write it): a Linear router picks one expert per token (argmax of softmax), each expert
an MLP run only on the tokens routed to it and scaled by its gate probability; a load-balancing auxiliary loss
(E * sum_e frac_tokens_e * mean_prob_e) returned by forward beside the logits and added to the cross-entropy with
weight 0.01. An expert that gets no token on a rank has no gradient there, so DDP(find_unused_parameters=True).
AdamW, DistributedSampler with set_epoch, 3 epochs on 48 synthetic rows.

    --mistakes none,jitter,no-set-epoch
  jitter        (correct) Switch Transformer's router input jitter: during training the router sees
                x * U(1 - 0.1, 1 + 0.1), drawn inside forward from each rank's own RNG: PASS
  no-set-epoch  the loop never calls sampler.set_epoch(epoch): every epoch repeats epoch 0's order
                (skip-set-epoch at epoch 1's first step: step 6 at W=2, step 4 at W=3)
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

D, E, C = 10, 4, 3


class Top1MoE(nn.Module):
    def __init__(self, jitter=0.0):
        super().__init__()
        self.jitter = jitter
        self.router = nn.Linear(D, E)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, D)) for _ in range(E)])

    def forward(self, x):
        r_in = x
        if self.training and self.jitter > 0:
            r_in = x * torch.empty_like(x).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        probs = F.softmax(self.router(r_in), dim=-1)
        gate, choice = probs.max(dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (choice == e).nonzero(as_tuple=True)[0]
            if sel.numel():
                out[sel] = gate[sel, None] * expert(x[sel])
        frac = F.one_hot(choice, E).float().mean(0)
        aux = E * (frac * probs.mean(0)).sum()
        return out, aux


class Classifier(nn.Module):
    def __init__(self, jitter=0.0):
        super().__init__()
        self.inp = nn.Linear(6, D)
        self.moe = Top1MoE(jitter)
        self.head = nn.Linear(D, C)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        m, aux = self.moe(h)
        return self.head(h + m), aux


def fit(rank, world, mistake, out):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    X = torch.randn(48, 6, generator=g)
    Y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    ds = TensorDataset(X, Y, torch.arange(48))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(Classifier(0.1 if mistake == "jitter" else 0.0), find_unused_parameters=True)
    torch.manual_seed(10 + rank)  # each rank's own jitter
    ce = nn.CrossEntropyLoss()

    def objective(output, y):
        logits, aux = output
        return ce(logits, y) + 0.01 * aux

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    with ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=objective, out_dir=out) as rec:
        for epoch in range(3):
            if mistake != "no-set-epoch":
                sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                opt.zero_grad()
                loss = objective(model(xb), yb)
                loss.backward()
                opt.step()
                rec.step(idx, xb, yb, loss)
            if rank == 0:
                print(f"[{mistake}] epoch {epoch} loss {loss.item():.4f}")


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
    ap.add_argument("--port", type=int, default=29573)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
