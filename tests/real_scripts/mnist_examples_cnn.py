#!/usr/bin/python3
"""pytorch/examples mnist/main.py, made DDP (DistributedSampler + set_epoch) and shrunk: Net = Conv2d(1,4,3) ->
relu -> Conv2d(4,8,3) -> relu -> max_pool2d(2) -> Dropout(0.25) -> flatten -> Linear -> relu -> Dropout(0.5) ->
Linear -> log_softmax, F.nll_loss, optim.Adadelta(lr=1.0), StepLR(step_size=1, gamma=0.7) stepped per epoch,
2 epochs, with the example's train() / test() per epoch (test() runs the DDP model in eval() under no_grad).
Synthetic 1x12x12 images.

    --mistakes none,skip-set-epoch,lr-rank0-scaled,loss-times-world
  skip-set-epoch    sampler.set_epoch(epoch) forgotten: every epoch repeats epoch 0's order
  lr-rank0-scaled   `if rank == 0: lr *= world` (linear scaling rule applied inside a rank-0-only block)
  loss-times-world  loss = F.nll_loss(output, target) * world_size
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(8 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, train_loader, optimizer, epoch, rec, mistake, world):
    model.train()
    for batch_idx, (data, target, idx) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        if mistake == "loss-times-world":
            loss = loss * world
        loss.backward()
        optimizer.step()
        rec.step(idx, data, target, loss)


def test(model, test_loader):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    return test_loss / len(test_loader.dataset), correct


def fit(rank, world, mistake, out, args):
    g = torch.Generator().manual_seed(0)
    n = 16 * world
    x = torch.rand(n, 1, 12, 12, generator=g)
    x = (x - 0.1307) / 0.3081  # transforms.Normalize((0.1307,), (0.3081,))
    y = torch.randint(0, 10, (n,), generator=g)
    train_ds = TensorDataset(x, y, torch.arange(n))
    test_ds = TensorDataset(torch.rand(8, 1, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g))
    sampler = DistributedSampler(train_ds, shuffle=True)
    train_loader = DataLoader(train_ds, batch_size=4, sampler=sampler)
    test_loader = DataLoader(test_ds, batch_size=4)

    torch.manual_seed(1 + rank)  # args.seed; per rank so dropout masks differ, DDP broadcasts rank 0's init
    model = DDP(Net())
    lr = args.lr
    if mistake == "lr-rank0-scaled" and rank == 0:
        lr *= world
    optimizer = optim.Adadelta(model.parameters(), lr=lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    rec = ddpcheck_torch.DdpRecorder(model, optimizer, loss_fn=F.nll_loss, out_dir=out, sampler=sampler,
                                     schedulers=[scheduler])
    for epoch in range(1, args.epochs + 1):
        if mistake != "skip-set-epoch":
            sampler.set_epoch(epoch)
        train(args, model, train_loader, optimizer, epoch, rec, mistake, world)
        test(model, test_loader)
        scheduler.step()
    rec.close()


def worker(rank, args):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.set_num_threads(1)
    for m in args.mistakes.split(","):
        fit(rank, args.world, m, os.path.join(args.out, m), args)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29601)
    p.add_argument("--mistakes", default="none")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
