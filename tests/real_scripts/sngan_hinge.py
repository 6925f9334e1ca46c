#!/usr/bin/python3
"""An SN-GAN discriminator step as the SN-GAN/BigGAN examples write it: spectral-normalised Linear layers
(torch.nn.utils.parametrizations.spectral_norm; the hook-based torch.nn.utils.spectral_norm with --old-sn), the
hinge loss, two forwards through the DDP discriminator per step (real, then fake) whose losses are summed into one
objective, Adam(0, 0.9), a generator (not recorded) with BatchNorm1d. Spectral norm's u and v move in every
training forward, so the second forward of a step starts from other buffers than the first.

    --mistakes none,r1-rank1,d-eval-rank1
  r1-rank1       rank 1 adds an R1 gradient penalty (a third forward of D) that the others do not compute
  d-eval-rank1   rank 1 leaves the discriminator in eval mode after a look at its outputs
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

NZ, DX, BS = 8, 12, 8


def hinge(out, y):
    """The hinge loss of one forward: y = +1 for real rows, -1 for fake ones."""
    return F.relu(1.0 - y * out.squeeze(1)).mean()


def run_case(rank, world, mistake, out, old_sn):
    sn = nn.utils.spectral_norm if old_sn else nn.utils.parametrizations.spectral_norm
    g = torch.Generator().manual_seed(13)
    n = 4 * BS * world
    real_all = torch.sin(torch.linspace(0, 3, DX))[None] * torch.randn(n, 1, generator=g) + 0.1 * torch.randn(n, DX, generator=g)
    ds = TensorDataset(torch.arange(n), real_all)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=BS, sampler=sampler)
    torch.manual_seed(0)
    netG = DDP(nn.Sequential(nn.Linear(NZ, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, DX)))
    netD = DDP(nn.Sequential(sn(nn.Linear(DX, 32)), nn.LeakyReLU(0.1), sn(nn.Linear(32, 32)), nn.LeakyReLU(0.1),
                             sn(nn.Linear(32, 1))))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-4, betas=(0.0, 0.9))
    optD = torch.optim.Adam(netD.parameters(), lr=4e-4, betas=(0.0, 0.9))
    torch.manual_seed(300 + rank)
    with ddpcheck_torch.DdpRecorder(netD, optD, loss_fn=hinge, out_dir=out, sampler=sampler) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for idx, real in loader:
                optD.zero_grad()
                fake = netG(torch.randn(len(real), NZ)).detach()
                lossD = hinge(netD(real), torch.ones(len(real))) + hinge(netD(fake), -torch.ones(len(fake)))
                if mistake == "r1-rank1" and rank == 1:  # (through netD.module: a DDP forward on one rank hangs)
                    r = real.clone().requires_grad_(True)
                    grad, = torch.autograd.grad(netD.module(r).sum(), r, create_graph=True)
                    lossD = lossD + 0.1 * grad.pow(2).sum(1).mean()
                lossD.backward()
                optD.step()
                rec.step(torch.cat([idx, idx]), yb=torch.cat([torch.ones(len(real)), -torch.ones(len(fake))]),
                         loss=lossD)
                if mistake == "d-eval-rank1" and rank == 1:
                    netD.eval()  # a look at the outputs, model.train() forgotten
                optG.zero_grad()
                lossG = -netD(netG(torch.randn(BS, NZ))).mean()
                lossG.backward()
                optG.step()


def main(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    for m in args.mistakes.split(","):
        run_case(rank, args.world, m, os.path.join(args.out, m), args.old_sn)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29543)
    ap.add_argument("--mistakes", default="none")
    ap.add_argument("--old-sn", action="store_true")
    args = ap.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.world)
