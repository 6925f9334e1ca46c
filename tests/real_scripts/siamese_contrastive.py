#!/usr/bin/python3
"""A Siamese network with a contrastive loss on image pairs, in the style of the classic "Siamese network in
PyTorch" tutorials: a shared conv encoder (Conv2d-ReLU-MaxPool2d-Conv2d-ReLU, then Flatten-Linear-ReLU-Linear)
applied to both images of a pair in one forward(x1, x2); ContrastiveLoss(margin=2.0) called as
criterion(out1, out2, label) (label 1 = dissimilar); Adam; DistributedSampler with set_epoch; 3 epochs on 48
synthetic 1x8x8 pairs (half of them a noisy copy of the first image).

    --mistakes none,lr-rank0
  lr-rank0  the linear-scaling rule (lr *= world_size) applied inside the `if rank == 0:` block that logs the
            config, so only rank 0 trains at the scaled lr (optimizer-settings-per-rank at step 0: rank 1 of two,
            rank 0 of three)
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


class SiameseNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                                 nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(inplace=True))
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 32), nn.ReLU(inplace=True), nn.Linear(32, 8))

    def forward_once(self, x):
        return self.fc(self.cnn(x))

    def forward(self, x1, x2):
        return self.forward_once(x1), self.forward_once(x2)


class ContrastiveLoss(nn.Module):
    def __init__(self, margin=2.0):
        super().__init__()
        self.margin = margin

    def forward(self, output1, output2, label):
        d = F.pairwise_distance(output1, output2, keepdim=True)
        return torch.mean((1 - label) * d.pow(2) + label * torch.clamp(self.margin - d, min=0.0).pow(2))


def fit(rank, world, mistake, out):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    n = 48
    x1 = torch.rand(n, 1, 8, 8, generator=g)
    same = torch.rand(n, generator=g) < 0.5
    x2 = torch.where(same[:, None, None, None], x1 + 0.05 * torch.randn(n, 1, 8, 8, generator=g),
                     torch.rand(n, 1, 8, 8, generator=g))
    label = (~same).float().unsqueeze(1)  # 1 = dissimilar
    ds = TensorDataset(x1, x2, label, torch.arange(n))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    torch.manual_seed(0)
    net = DDP(SiameseNetwork())
    criterion = ContrastiveLoss()
    lr = 5e-4
    if rank == 0:
        if mistake == "lr-rank0":
            lr *= world
        print(f"[{mistake}] config: lr={lr} world={world}")
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    with ddpcheck_torch.DdpRecorder(net, optimizer, sampler=sampler, out_dir=out,
                                    loss_fn=lambda out, y: criterion(out[0], out[1], y)) as rec:
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for img0, img1, lab, idx in loader:
                optimizer.zero_grad()
                output1, output2 = net(img0, img1)
                loss = criterion(output1, output2, lab)
                loss.backward()
                optimizer.step()
                rec.step(idx, (img0, img1), lab, loss)
            if rank == 0:
                print(f"[{mistake}] epoch {epoch} loss {loss.item():.4f}")


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
    ap.add_argument("--port", type=int, default=29571)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
