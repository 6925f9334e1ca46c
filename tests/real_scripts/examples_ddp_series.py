#!/usr/bin/python3
"""pytorch/examples distributed/ddp-tutorial-series (multigpu.py) on CPU/gloo: a Trainer class, MyTrainDataset,
DataLoader + DistributedSampler with set_epoch, a Linear(20, 1) model, SGD, F.mse_loss.

    --mistakes none,skip-set-epoch,sampler-seed-per-rank
  skip-set-epoch          the epoch loop forgets train_data.sampler.set_epoch(epoch)
  sampler-seed-per-rank   DistributedSampler(seed=rank): "a different seed per worker"
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
import torch.multiprocessing as mp
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from ddpcheck_torch import DdpRecorder  # noqa: E402


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(7)
        self.size = size
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index] + (index,)


class Trainer:
    def __init__(self, model, train_data, optimizer, gpu_id, mistake, out):
        self.gpu_id = gpu_id
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer
        self.mistake = mistake
        self.rec = DdpRecorder(self.model, optimizer, sampler=train_data.sampler, loss_fn=F.mse_loss, out_dir=out)

    def _run_batch(self, source, targets, idx):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        self.rec.step(idx, source, targets, loss)

    def _run_epoch(self, epoch):
        if self.mistake != "skip-set-epoch":
            self.train_data.sampler.set_epoch(epoch)
        for source, targets, idx in self.train_data:
            self._run_batch(source, targets, idx)

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
        self.rec.close()


def main(rank, world_size, args):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(args.port)
    init_process_group(backend="gloo", rank=rank, world_size=world_size)
    for mistake in args.mistakes.split(","):
        dataset = MyTrainDataset(12 * world_size)
        seed = rank if mistake == "sampler-seed-per-rank" else 0
        loader = DataLoader(dataset, batch_size=4, pin_memory=False, shuffle=False,
                            sampler=DistributedSampler(dataset, shuffle=True, seed=seed))
        model = torch.nn.Linear(20, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        Trainer(model, loader, optimizer, rank, mistake, os.path.join(args.out, mistake)).train(2)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--out", required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, default=29513)
    parser.add_argument("--mistakes", default="none")
    args = parser.parse_args()
    mp.spawn(main, args=(args.world, args), nprocs=args.world)
