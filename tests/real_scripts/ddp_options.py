#!/usr/bin/python3
"""A multi-task regressor whose auxiliary head runs only on some steps (every other step, the same on every
rank), so DDP is built with find_unused_parameters=True; gradient_as_bucket_view=True (grads are views into the
buckets) and bucket_cap_mb=0.01 so the model's ~30 KB of parameters fall into several buckets. SGD with momentum
0.9 and nesterov, MSE on both heads. DistributedSampler, 2 epochs.

    --mistakes none,none-rank-branch,loss-times-world,lr-rank0-scaled,no-find-unused,momentum-rank1
  --aux-positional   pass with_aux positionally (the default passes it as a keyword argument)
  none-rank-branch   (correct) the aux head runs on rank 0 only, on even steps: legal with
                     find_unused_parameters=True (rank 1's aux grads count as zero in the average)
  loss-times-world   loss * world_size
  lr-rank0-scaled    rank 0 sets lr *= world_size after building the optimizer ("linear scaling rule" on rank 0 only)
  no-find-unused     find_unused_parameters=False with the step-dependent aux head: DDP raises at the next step
  momentum-rank1     rank 1 builds SGD without momentum
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

AUX_KW = True  # forward(x, with_aux=...) as a keyword (default) or positionally (--aux-positional)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.main = nn.Sequential(nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 2))
        self.aux = nn.Sequential(nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x, with_aux=False):
        h = self.trunk(x)
        return self.main(h), (self.aux(h) if with_aux else None)


class Indexed(TensorDataset):
    def __getitem__(self, i):
        return (*super().__getitem__(i), i)


class TwoHeadLoss(nn.Module):
    """loss over (main, aux) outputs; targets are [N, 3]: 2 main columns, 1 aux column."""
    def forward(self, out, y):
        main, aux = out
        loss = F.mse_loss(main, y[:, :2])
        if aux is not None:
            loss = loss + 0.5 * F.mse_loss(aux, y[:, 2:])
        return loss


def train(rank, world, mistake, out):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(96, 10, generator=g)
    y = torch.cat([x[:, :2] - x[:, 2:4], x[:, 4:5] * 0.5], dim=1) + 0.05 * torch.randn(96, 3, generator=g)
    data = Indexed(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=6, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(MultiTask(), find_unused_parameters=(mistake != "no-find-unused"), gradient_as_bucket_view=True,
                bucket_cap_mb=0.01)
    momentum = 0.0 if (mistake == "momentum-rank1" and rank == 1) else 0.9
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=momentum, nesterov=momentum > 0)
    if mistake == "lr-rank0-scaled" and rank == 0:
        for group in opt.param_groups:
            group["lr"] *= world
    criterion = TwoHeadLoss()
    step = 0
    with ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=criterion, out_dir=out) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                with_aux = step % 2 == 0
                if mistake == "none-rank-branch":
                    with_aux = with_aux and rank == 0
                opt.zero_grad()
                output = model(xb, with_aux=with_aux) if AUX_KW else model(xb, with_aux)
                loss = criterion(output, yb)
                if mistake == "loss-times-world":
                    loss = loss * world
                loss.backward()
                opt.step()
                rec.step(idx, xb, yb, loss)
                step += 1


def run(rank, world, port, out, mistakes, aux_kw=True):
    global AUX_KW
    AUX_KW = aux_kw
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    torch.set_num_threads(1)
    for m in mistakes.split(","):
        try:
            train(rank, world, m, os.path.join(out, m))
        except Exception as e:  # noqa: BLE001  a mistake that crashes DDP: report it and go on
            print("rank %d mistake %s raised %s: %s" % (rank, m, type(e).__name__, str(e)[:200]), flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29631)
    p.add_argument("--mistakes", default="none")
    p.add_argument("--aux-positional", action="store_true", help="call model(xb, with_aux) instead of with_aux=")
    a = p.parse_args()
    mp.spawn(run, args=(a.world, a.port, a.out, a.mistakes, not a.aux_positional), nprocs=a.world)
