#!/usr/bin/python3
"""A small real DDP training loop (gloo, CPU) recorded with ddpcheck_torch, for `ddpcheck torch-compare`.

    /usr/bin/python3 tools/examples/ddp_example.py --out /tmp/dump --world 2 --model bn
    ddpcheck torch-compare /tmp/dump

Shaped like the PyTorch DDP tutorial: DistributedSampler + DataLoader, SGD with momentum, ExponentialLR then
CosineAnnealingLR stepped per epoch. Flags reproduce three BUGS.md mistakes:
  --no-set-epoch          never call sampler.set_epoch(epoch)               -> skip-set-epoch
  --no-broadcast-buffers  DDP(broadcast_buffers=False) with BatchNorm        -> no-buffer-broadcast
  --bypass-rank R         rank R computes its forward through ddp.module     -> bypass-ddp@R
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ddpcheck_torch  # noqa: E402


def build_model(kind):
    if kind == "linear":
        return nn.Linear(8, 4)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def worker(rank, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    g = torch.Generator().manual_seed(12345)
    X = torch.randn(args.samples, 8, generator=g, dtype=torch.float64).to(dtype)
    Y = torch.randn(args.samples, 4, generator=g, dtype=torch.float64).to(dtype)
    ds = TensorDataset(X, Y, torch.arange(args.samples))
    sampler = DistributedSampler(ds, num_replicas=args.world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0 if rank == 0 else 1000 + rank)  # ranks differ: DDP's broadcast must fix that
    model = build_model(args.model).to(dtype)
    local = ddpcheck_torch.snapshot(model)
    ddp = DDP(model, broadcast_buffers=not args.no_broadcast_buffers)
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    scheds = [torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9),
              torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)]
    try:
        with ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=loss_fn, out_dir=args.out,
                                        schedulers=scheds, local_init=local) as rec:
            rec.set_dataset(X, Y)
            for epoch in range(args.epochs):
                if not args.no_set_epoch:
                    sampler.set_epoch(epoch)
                for xb, yb, idx in loader:
                    opt.zero_grad()
                    forward = ddp.module if rank == args.bypass_rank else ddp
                    loss = loss_fn(forward(xb), yb)
                    loss.backward()
                    opt.step()
                    rec.step(idx, xb, yb, loss)
                for s in scheds:
                    s.step()
    except RuntimeError as e:  # a collective that never completed (bypass-ddp): the dump records it
        print("rank %d: %s" % (rank, str(e).splitlines()[0]), file=sys.stderr)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="dump folder (rank<r>/ per rank)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", choices=["linear", "mlp", "bn"], default="bn")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--port", type=int, default=29611)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds before a stuck collective errors")
    ap.add_argument("--no-set-epoch", action="store_true")
    ap.add_argument("--no-broadcast-buffers", action="store_true")
    ap.add_argument("--bypass-rank", type=int, default=-1)
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
