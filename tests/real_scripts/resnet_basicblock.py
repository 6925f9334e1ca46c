#!/usr/bin/python3
"""A tiny CIFAR-style ResNet built from torchvision's BasicBlock (conv3x3-BN-ReLU-conv3x3-BN + identity /
1x1-conv-BN downsample, ReLU(inplace=True), kaiming_normal_ init, zero_init_residual), trained like the
pytorch/examples imagenet/main.py loop: CrossEntropyLoss, SGD(lr=0.1, momentum=0.9, nesterov=True,
weight_decay=5e-4), MultiStepLR(milestones=[1], gamma=0.1) stepped per epoch, optimizer.zero_grad(set_to_none=True),
DistributedSampler + set_epoch, a validate() per epoch on every rank (DistributedSampler(shuffle=False), eval()
under no_grad, accuracy all-reduced). Synthetic 3x8x8 images, 2 epochs.

    --mistakes none,ok-module-eval,ckpt-rank0-after-ddp,eval-mode-rank0,loss-times-world
  ok-module-eval        (correct) as eval-mode-rank0, but model.train() at every epoch's start: must PASS
  ckpt-rank0-after-ddp  resume: `if rank == 0: model.module.load_state_dict(ckpt)` AFTER wrapping in DDP
                        (DDP broadcast the fresh init at construction; the other ranks keep it)
  eval-mode-rank0       model.train() called once before the epoch loop; rank 0 alone runs an extra
                        "sanity" eval (model.module.eval(), no DDP collective) after epoch 0 and trains epoch 1
                        in eval mode (BatchNorm uses running stats on rank 0 only)
  loss-times-world      loss = criterion(output, target) * world_size
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10, zero_init_residual=True):
        super().__init__()
        self.inplanes = 8
        self.conv1 = conv3x3(3, 8)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(8, 1)
        self.layer2 = self._make_layer(16, 1, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        for _ in range(1, blocks):
            layers.append(BasicBlock(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def validate(model, loader, criterion):
    model.eval()
    correct, total = torch.zeros(1), torch.zeros(1)
    with torch.no_grad():
        for images, target in loader:
            output = model(images)
            correct += (output.argmax(1) == target).sum()
            total += target.numel()
    dist.all_reduce(correct)
    dist.all_reduce(total)
    return (correct / total).item()


def fit(rank, world, mistake, out, args):
    g = torch.Generator().manual_seed(7)
    n = 16 * world
    train_ds = TensorDataset(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g),
                             torch.arange(n))
    val_ds = TensorDataset(torch.randn(4 * world, 3, 8, 8, generator=g), torch.randint(0, 10, (4 * world,), generator=g))
    train_sampler = DistributedSampler(train_ds)
    val_sampler = DistributedSampler(val_ds, shuffle=False, drop_last=True)
    train_loader = DataLoader(train_ds, batch_size=4, sampler=train_sampler)
    val_loader = DataLoader(val_ds, batch_size=4, sampler=val_sampler)

    torch.manual_seed(rank)  # imagenet example: no seed given -> each rank initialises differently; DDP broadcasts
    model = DDP(TinyResNet())
    if mistake == "ckpt-rank0-after-ddp" and rank == 0:
        torch.manual_seed(1234)
        ckpt = TinyResNet().state_dict()  # stands for torch.load(args.resume)["state_dict"]
        model.module.load_state_dict(ckpt)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1], gamma=0.1)
    rec = ddpcheck_torch.DdpRecorder(model, optimizer, loss_fn=criterion, out_dir=out, sampler=train_sampler,
                                     schedulers=[scheduler])
    model.train()
    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        if mistake != "eval-mode-rank0":
            model.train()
        for images, target, idx in train_loader:
            output = model(images)
            loss = criterion(output, target)
            if mistake == "loss-times-world":
                loss = loss * world
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            rec.step(idx, images, target, loss)
        if mistake in ("eval-mode-rank0", "ok-module-eval"):
            if rank == 0:  # a quick look at one batch on rank 0 only, through .module (no collective)
                model.module.eval()
                with torch.no_grad():
                    model.module(val_ds.tensors[0][:4])
        else:
            validate(model, val_loader, criterion)
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
    p.add_argument("--port", type=int, default=29603)
    p.add_argument("--mistakes", default="none")
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
