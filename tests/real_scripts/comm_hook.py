#!/usr/bin/python3
"""An MLP regression (nn.Sequential of Linear/Tanh, MSELoss, SGD with momentum, DistributedSampler, 2 epochs) that
compresses its gradient traffic with a DDP communication hook, as the DDP comm hooks docs show:
ddp.register_comm_hook(None, default_hooks.fp16_compress_hook), registered after the recorder is constructed.

    --mistakes none,none-allreduce-hook,none-static-graph,none-hook-before,hook-sum,loss-times-world,hook-rank0-only
  QA2_LAYERNORM=1 in the environment adds a LayerNorm (a model ddpcheck checks by protocol only)
  none                 (correct) fp16_compress_hook
  none-allreduce-hook  (correct) default_hooks.allreduce_hook
  none-static-graph    (correct) DDP(static_graph=True), no hook
  none-hook-before     (correct) fp16_compress_hook registered BEFORE the recorder (docs: buckets not recorded)
  none-custom-mean     (correct) a hand-written hook: all_reduce(SUM) of the bucket, then divide by world size
  hook-sum             a hand-written hook that all-reduces with SUM and forgets to divide by the world size
  loss-times-world     fp16_compress_hook, loss * world_size
  hook-rank0-only      fp16_compress_hook registered on rank 0 only (rank 1 runs DDP's default all-reduce)
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


def sum_hook(state, bucket):
    """A user's hook: all-reduce the bucket (SUM) and return it, forgetting DDP's division by the world size."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def mean_hook(state, bucket):
    """A user's hook done right: all-reduce (SUM) then divide by the world size."""
    world = dist.get_world_size()
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


class Indexed(TensorDataset):
    def __getitem__(self, i):
        return (*super().__getitem__(i), i)


def train(rank, world, mistake, out):
    g = torch.Generator().manual_seed(21)
    x = torch.randn(80, 6, generator=g)
    y = (x @ torch.randn(6, 2, generator=g)).tanh() + 0.05 * torch.randn(80, 2, generator=g)
    data = Indexed(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=2)
    loader = DataLoader(data, batch_size=5, sampler=sampler)
    torch.manual_seed(0)
    layers = [nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2)]
    if os.environ.get("QA2_LAYERNORM"):  # a LayerNorm: not replayed, checked by protocol only
        layers.insert(2, nn.LayerNorm(32))
    net = nn.Sequential(*layers)
    model = DDP(net, static_graph=(mistake == "none-static-graph"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.MSELoss()
    hook = {"none-allreduce-hook": default_hooks.allreduce_hook, "none-static-graph": None, "hook-sum": sum_hook,
            "none-custom-mean": mean_hook}.get(mistake, default_hooks.fp16_compress_hook)
    if mistake == "hook-rank0-only" and rank != 0:
        hook = None
    if mistake == "none-hook-before":
        model.register_comm_hook(None, hook)
    with ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=criterion, out_dir=out) as rec:
        if hook is not None and mistake != "none-hook-before":
            model.register_comm_hook(None, hook)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                opt.zero_grad()
                loss = criterion(model(xb), yb)
                if mistake == "loss-times-world":
                    loss = loss * world
                loss.backward()
                opt.step()
                rec.step(idx, xb, yb, loss)


def run(rank, world, port, out, mistakes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    torch.set_num_threads(1)
    for m in mistakes.split(","):
        try:
            train(rank, world, m, os.path.join(out, m))
        except Exception as e:  # noqa: BLE001  a mistake that crashes DDP: report it and stop
            print("rank %d mistake %s raised %s: %s" % (rank, m, type(e).__name__, str(e)[:300]), flush=True)
            return
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29641)
    p.add_argument("--mistakes", default="none")
    a = p.parse_args()
    mp.spawn(run, args=(a.world, a.port, a.out, a.mistakes), nprocs=a.world)
