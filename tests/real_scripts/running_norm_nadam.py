#!/usr/bin/python3
"""A tabular classifier in the style of OpenAI baselines' RunningMeanStd / stable-baselines3's VecNormalize: input
statistics kept in registered buffers and updated in every forward, then Conv1d + InstanceNorm1d (no running
statistics) + an MLP head; BCEWithLogitsLoss, NAdam (whose state mu_product is a 0-d tensor per parameter), the
Goyal et al. gradual warmup written in the loop for epoch 0 (param_group['lr'] set by hand) and then an
ExponentialLR stepped per epoch, given to the recorder. DistributedSampler, 2 epochs of 3 steps.

    --mistakes none,stats-rank0-after-ddp,eval-rank1,manual-allreduce-clip,skip-step-rank1,stats-rank0-no-broadcast
  stats-rank0-after-ddp     rank 0 loads the normaliser's statistics after DDP(...): DDP broadcasts rank 0's buffers
                            before every forward, so every rank normalises with them (correct: PASS)
  eval-rank1                rank 1 trains in eval mode: no layer of this model computes another function in eval mode
                            (InstanceNorm1d without running statistics, no Dropout or BatchNorm; correct: PASS)
  manual-allreduce-clip     the loop all-reduces (sums) the gradients again after DDP and then clips them by value
  skip-step-rank1           rank 1 skips optimizer.step() at step 2
  stats-rank0-no-broadcast  rank 0 loads the statistics after DDP(broadcast_buffers=False): the ranks normalise
                            with different statistics
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

F_IN, WARMUP, BASE_LR = 6, 3, 0.01


class RunningNorm(nn.Module):
    """Running mean and variance of the inputs (the parallel-variance update), normalising by them."""

    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("count", torch.tensor(1e-4))
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("var", torch.ones(n))

    def forward(self, x):
        with torch.no_grad():
            bm, bv, bc = x.mean(0), x.var(0, unbiased=False), x.size(0)
            delta, tot = bm - self.mean, self.count + bc
            m2 = self.var * self.count + bv * bc + delta ** 2 * self.count * bc / tot
            self.mean.add_(delta * bc / tot)
            self.var.copy_(m2 / tot)
            self.count.copy_(tot)
        return (x - self.mean) / torch.sqrt(self.var + self.eps)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RunningNorm(F_IN)
        self.conv = nn.Conv1d(1, 4, 3)
        self.inorm = nn.InstanceNorm1d(4, affine=True)
        self.head = nn.Sequential(nn.ReLU(), nn.Flatten(), nn.Linear(4 * (F_IN - 2), 16), nn.PReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.head(self.inorm(self.conv(self.norm(x).unsqueeze(1)))).squeeze(-1)


def train(rank, world, mistake, out):
    torch.manual_seed(0)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=mistake != "stats-rank0-no-broadcast")
    if mistake in ("stats-rank0-after-ddp", "stats-rank0-no-broadcast") and rank == 0:
        with torch.no_grad():  # statistics of an earlier run, loaded on rank 0 only
            model.norm.mean.fill_(2.0)
            model.norm.var.fill_(9.0)
            model.norm.count.fill_(100.0)
    if mistake == "eval-rank1" and rank == 1:
        ddp.eval()
    opt = torch.optim.NAdam(ddp.parameters(), lr=BASE_LR)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(4)
    n = 24 * world
    x = torch.randn(n, F_IN, generator=g) * 3 + 2
    y = (x[:, 0] + x[:, 1] > 4.0).float()
    data = TensorDataset(x, y, torch.arange(n))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    with ddpcheck_torch.DdpRecorder(ddp, opt, loss_fn=bce, out_dir=out, sampler=sampler, schedulers=[sched]) as rec:
        step = 0
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                if epoch == 0:  # gradual warmup (Goyal et al.), by hand
                    for group in opt.param_groups:
                        group["lr"] = BASE_LR * (step + 1) / WARMUP
                opt.zero_grad()
                loss = bce(ddp(xb), yb)
                loss.backward()
                if mistake == "manual-allreduce-clip":
                    for p in ddp.parameters():
                        dist.all_reduce(p.grad)
                    torch.nn.utils.clip_grad_value_(ddp.parameters(), 0.05)
                if not (mistake == "skip-step-rank1" and rank == 1 and step == 2):
                    opt.step()
                rec.step(idx, xb, yb, loss)
                step += 1
            sched.step()


def run(rank, world, port, out, mistakes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    for m in mistakes.split(","):
        train(rank, world, m, os.path.join(out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--mistakes", default="none")
    a = p.parse_args()
    mp.spawn(run, args=(a.world, a.port, a.out, a.mistakes), nprocs=a.world)
