#!/usr/bin/python3
"""A model written functionally: raw nn.Parameters used through F.linear / F.silu / F.layer_norm in forward(),
plus an `encode` method that the training loop may call directly; RMSprop with momentum; SmoothL1 loss; the user's
own DDP communication hook (torch's allreduce_hook, registered after the recorder, which wraps it).

    --mistakes none,bypass-method
  bypass-method   the loop calls model.module.encode(x) + model.module.readout(...) instead of model(x): the
                  forward never goes through DDP, so no gradient is ever all-reduced
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


class FunctionalNet(nn.Module):
    def __init__(self, d_in=6, d_hidden=12):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(d_hidden, d_in) / math.sqrt(d_in))
        self.b1 = nn.Parameter(torch.zeros(d_hidden))
        self.gamma = nn.Parameter(torch.ones(d_hidden))
        self.w2 = nn.Parameter(torch.randn(2, d_hidden) / math.sqrt(d_hidden))

    def encode(self, x):
        h = F.silu(F.linear(x, self.w1, self.b1))
        return F.layer_norm(h, h.shape[-1:], weight=self.gamma)

    def readout(self, h):
        return F.linear(h, self.w2)

    def forward(self, x):
        return self.readout(self.encode(x))


def train(rank, world, mistake, out):
    torch.manual_seed(99)
    model = nn.parallel.DistributedDataParallel(FunctionalNet())
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-2, momentum=0.5, alpha=0.9)
    crit = nn.SmoothL1Loss(beta=0.5)
    rec = ddpcheck_torch.DdpRecorder(model, opt, loss_fn=crit, out_dir=out)
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    data = torch.Generator().manual_seed(500 + rank)
    for step in range(3):
        x, y = torch.randn(8, 6, generator=data), torch.randn(8, 2, generator=data)
        pred = model.module.readout(model.module.encode(x)) if mistake == "bypass-method" else model(x)
        loss = crit(pred, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        rec.step(xb=x, yb=y, loss=loss)
    rec.close()


def entry(rank, world, port, out, mistakes):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for m in mistakes.split(","):
        train(rank, world, m, os.path.join(out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--mistakes", default="none")
    a = ap.parse_args()
    mp.spawn(entry, args=(a.world, a.port, a.out, a.mistakes), nprocs=a.world)
