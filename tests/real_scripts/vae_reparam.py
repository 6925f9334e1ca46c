#!/usr/bin/python3
"""A variational autoencoder in the style of pytorch/examples' vae/main.py: the reparameterization draws
torch.randn_like(mu) inside forward (each rank seeded on its own after DDP's constructor, so the ranks' noise
differs as in any real run), BCE-with-logits reconstruction plus a KL term whose weight beta the loop anneals on the
loss module, Adam. The float64 reference must draw the run's noise (drawn in float64 it would be other numbers:
QA round 15's false alarm), and the mistakes must still show.

    --mistakes none,loss-div-world,loss-scale-rank1,param-edit-rank1
  loss-div-world     the loss divided by the world size "because DDP sums" (BUGS.md grad-accum-normalisation)
  loss-scale-rank1   rank 1 multiplies its loss by 1.01 before backward() (BUGS.md loss-scale-per-rank)
  param-edit-rank1   rank 1 nudges fc_mu.bias by 1e-4 by hand after step 5's optimizer step (a parameter changed
                     outside optimizer.step() on one rank: no BUGS.md pattern, named by the protocol check)
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


class VAE(nn.Module):
    def __init__(self, d=20, h=16, z=4):
        super().__init__()
        self.enc = nn.Linear(d, h)
        self.fc_mu, self.fc_logvar = nn.Linear(h, z), nn.Linear(h, z)
        self.dec1, self.dec2 = nn.Linear(z, h), nn.Linear(h, d)

    def forward(self, x):
        h = F.relu(self.enc(x))
        mu, logvar = self.fc_mu(h), self.fc_logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec2(F.relu(self.dec1(z))), mu, logvar


class VAELoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.beta = 0.0

    def forward(self, out, x):
        recon, mu, logvar = out
        bce = F.binary_cross_entropy_with_logits(recon, x, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return (bce + self.beta * kld) / x.shape[0]


def fit(rank, world, mistake, out):
    g = torch.Generator().manual_seed(5)
    n = 32 * world
    ds = TensorDataset((torch.rand(n, 20, generator=g) > 0.5).float())
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(VAE())
    torch.manual_seed(1234 + rank)  # each rank's own noise
    criterion = VAELoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    with ddpcheck_torch.DdpRecorder(model, opt, loss_fn=criterion, out_dir=out, sampler=sampler) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for (x,) in loader:
                criterion.beta = min(1.0, step / 6)
                opt.zero_grad()
                loss = criterion(model(x), x)
                if mistake == "loss-div-world":
                    loss = loss / world
                if mistake == "loss-scale-rank1" and rank == 1:
                    loss = loss * 1.01
                loss.backward()
                opt.step()
                if mistake == "param-edit-rank1" and rank == 1 and step == 5:
                    with torch.no_grad():
                        model.module.fc_mu.bias.add_(1e-4)
                rec.step(xb=x, loss=loss)
                step += 1


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
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
