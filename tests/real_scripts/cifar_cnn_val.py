#!/usr/bin/python3
"""The PyTorch CIFAR-10 tutorial CNN ("Training a Classifier"), made DDP: Conv2d-ReLU-MaxPool2d, Conv2d-ReLU,
Dropout2d(0.2), AdaptiveAvgPool2d(1), Flatten, Linear; CrossEntropyLoss; SGD(momentum=0.9, weight_decay=5e-4) with
a CosineAnnealingLR stepped per epoch (given to the recorder); a DistributedSampler with set_epoch; after every
epoch a validation pass through the DDP model under torch.no_grad() and model.eval() on each rank's shard of the
validation set, the correct counts summed with dist.all_reduce; 3 epochs on 48 synthetic 3x8x8 images (12 held
out for validation). Each rank seeds its own RNG (its own dropout masks; DDP broadcasts rank 0's initial weights).

    --mistakes none,val-module,rank0-val
  val-module  (correct) validation through model.module (the unwrapped net) under no_grad on every rank, then
              model.train() at the next epoch's start: PASS
  rank0-val   validation only on rank 0 (the "main process evaluates" idiom), with model.train() called once
              before the epoch loop instead of at each epoch's start: rank 0 trains epochs 1-2 with Dropout2d off
              while the other ranks keep it on (different-forward-path@0 at epoch 1's first step: step 4 at W=2,
              3 at W=3)
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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.drop = nn.Dropout2d(0.2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.drop(F.relu(self.conv2(x)))
        return self.fc(torch.flatten(self.gap(x), 1))


def fit(rank, world, mistake, out):
    torch.manual_seed(100 + rank)  # each rank its own dropout masks
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(60, 3, 8, 8, generator=g), torch.randint(0, 10, (60,), generator=g)
    train_ds = TensorDataset(X[:48], Y[:48], torch.arange(48))
    val_ds = TensorDataset(X[48:], Y[48:])
    sampler = DistributedSampler(train_ds, shuffle=True, seed=0)
    val_sampler = DistributedSampler(val_ds, shuffle=False)
    trainloader = DataLoader(train_ds, batch_size=6, sampler=sampler)
    valloader = DataLoader(val_ds, batch_size=6, sampler=val_sampler)
    net = Net()
    model = DDP(net)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3)
    with ddpcheck_torch.DdpRecorder(model, optimizer, sampler=sampler, loss_fn=criterion, out_dir=out,
                                    schedulers=[scheduler]) as rec:
        if mistake == "rank0-val":
            model.train()
        for epoch in range(3):
            sampler.set_epoch(epoch)
            if mistake != "rank0-val":
                model.train()
            for inputs, labels, idx in trainloader:
                optimizer.zero_grad()
                outputs = model(inputs)
                loss = criterion(outputs, labels)
                loss.backward()
                optimizer.step()
                rec.step(idx, inputs, labels, loss)
            scheduler.step()
            if mistake == "rank0-val" and rank != 0:
                continue
            model.eval()
            correct = torch.zeros(2)
            with torch.no_grad():
                for images, labels in valloader:
                    pred = (model.module if mistake == "val-module" else model)(images).argmax(1)
                    correct += torch.tensor([(pred == labels).sum().item(), labels.numel()])
            if mistake != "rank0-val":
                dist.all_reduce(correct)
            if rank == 0:
                print(f"[{mistake}] epoch {epoch} val acc {correct[0] / correct[1]:.3f}")


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
    ap.add_argument("--port", type=int, default=29574)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
