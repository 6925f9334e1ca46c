#!/usr/bin/python3
"""The torchtext "Text classification with the torchtext library" tutorial's model, in its older form with
nn.EmbeddingBag(vocab, dim, sparse=True) trained by plain SGD (DDP all-reduces the embedding's sparse gradient in
a bucket of its own): token ids of variable length per text, concatenated with offsets, mean-pooled, a Linear
head; synthetic texts whose class shows in their tokens; a DistributedSampler over the texts.

    --mistakes none,loss-times-world,sampler-seed-per-rank
  loss-times-world       (loss * world_size).backward()
  sampler-seed-per-rank  DistributedSampler(seed=rank): the ranks' shards overlap
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

VOCAB, DIM, CLASSES, TEXTS, BATCH = 500, 16, 4, 64, 8


class TextClassificationModel(nn.Module):
    def __init__(self, vocab_size, embed_dim, num_class):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=True)
        self.fc = nn.Linear(embed_dim, num_class)
        self.init_weights()

    def init_weights(self):
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))


class Texts(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(11)
        self.labels = torch.randint(0, CLASSES, (TEXTS,), generator=g)
        self.texts = []
        for i in range(TEXTS):
            n = int(torch.randint(5, 20, (1,), generator=g))
            base = int(self.labels[i]) * (VOCAB // CLASSES)
            self.texts.append(torch.randint(base, base + VOCAB // CLASSES, (n,), generator=g))

    def __len__(self):
        return TEXTS

    def __getitem__(self, i):
        return i, int(self.labels[i]), self.texts[i]


def collate_batch(batch):
    idx, labels, texts = zip(*batch)
    offsets = torch.tensor([0] + [len(t) for t in texts[:-1]]).cumsum(dim=0)
    return torch.tensor(idx), torch.tensor(labels), torch.cat(texts), offsets


def run_case(rank, world, mistake, out):
    data = Texts()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                 seed=rank if mistake == "sampler-seed-per-rank" else 0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, collate_fn=collate_batch)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TextClassificationModel(VOCAB, DIM, CLASSES))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    rec = ddpcheck_torch.DdpRecorder(model, optimizer, loss_fn=criterion, out_dir=out, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for idx, label, text, offsets in loader:
            optimizer.zero_grad()
            loss = criterion(model(text, offsets), label)
            (loss * world if mistake == "loss-times-world" else loss).backward()
            torch.nn.utils.clip_grad_norm_(model.module.fc.parameters(), 0.1)
            optimizer.step()
            rec.step(idx, yb=label, loss=loss)
    rec.close()


def main(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    for m in args.mistakes.split(","):
        run_case(rank, args.world, m, os.path.join(args.out, m))
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.world)
