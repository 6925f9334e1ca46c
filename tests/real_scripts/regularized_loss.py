#!/usr/bin/python3
"""A CNN with BatchNorm2d and LayerNorm (checked by the protocol check alone) whose loop adds terms to the loss module's
value on every rank: an L2 weight penalty on even steps, a penalty on the logits' size on every third step, and a
loss weight of 1.1 on every rank on steps 1, 4, 7 (a pure scaling, the same everywhere: no finding). The recorder
is given the loss module (CrossEntropyLoss) only, and rec.step() the loss the loop backpropagates. A validation pass
(model.eval(), torch.no_grad(), through DDP) ends each epoch.

    --mistakes none,loss-scale-rank1,bn-stats-edited
  bn-stats-edited    the BatchNorm running statistics halved by hand on every rank between steps 2 and 3: DDP
                     broadcasts rank 0's, so every rank's step-3 forward starts from them, not from rank 0's statistics
                     after step 2 (tests/torch_protocol_buffers_test.cc: no BUGS.md pattern)
  loss-scale-rank1   rank 1 multiplies its loss by 1.1 before backward() at every step (BUGS.md loss-scale-per-rank):
                     not a clean multiple of the loss module's value; at the steps without an added term the
                     local gradient is exactly that ratio times the single-process gradient while rank 0's is 1 x
"""
import argparse
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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        return self.head(self.norm(h))


def fit(rank, world, mistake, out):
    g = torch.Generator().manual_seed(11)
    n = 16 * world
    ds = TensorDataset(torch.randn(n, 2, 6, 6, generator=g), torch.randint(0, 3, (n,), generator=g), torch.arange(n))
    sampler = DistributedSampler(ds, shuffle=True, seed=2)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(Net())
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    with ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=criterion, out_dir=out) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for x, y, idx in loader:
                opt.zero_grad()
                logits = model(x)
                loss = criterion(logits, y)
                if step % 2 == 0:
                    loss = loss + 1e-3 * sum(p.pow(2).sum() for p in model.parameters())
                if step % 3 == 0:
                    loss = loss + 0.05 * logits.pow(2).mean()
                if step % 3 == 1:
                    loss = loss * 1.1  # a loss weight, the same on every rank
                if mistake == "loss-scale-rank1" and rank == 1:
                    loss = loss * 1.1
                loss.backward()
                opt.step()
                rec.step(idx, x, y, loss)
                if mistake == "bn-stats-edited" and step == 2:
                    with torch.no_grad():
                        model.module.bn.running_mean.mul_(0.5)
                step += 1
            model.eval()
            with torch.no_grad():
                model(ds.tensors[0][:8])
            model.train()


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
    ap.add_argument("--port", type=int, default=29516)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
