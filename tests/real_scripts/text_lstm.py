#!/usr/bin/python3
"""An LSTM text classifier in the style of the PyTorch text-classification tutorials (nn.Embedding with
padding_idx, nn.LSTM over pack_padded_sequence, the last hidden state -> nn.Linear), F.cross_entropy,
SGD(momentum=0.9, weight_decay=1e-4), torch.nn.utils.clip_grad_norm_(max_norm=0.5) between backward and step,
a collate_fn that pads variable-length token sequences, a DistributedSampler. Synthetic token ids (vocab 50,
lengths 3..9, 4 classes), 2 epochs.

    --mistakes none,skip-on-local-loss,loss-times-world
  skip-on-local-loss  "skip bad batches": a rank skips optimizer.step() when ITS local loss is above a threshold
                      (the gradients were already all-reduced; the other ranks step)
  loss-times-world    loss = F.cross_entropy(...) * world_size
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
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

VOCAB, EMB, HID, NCLASS = 50, 8, 12, 4
# what the loop passes to rec.step as xb (--xb): the padded token ids (default), the (text, lengths) tuple the
# model takes, or nothing
XB = {"text": lambda t, l: t, "tuple": lambda t, l: (t, l), "none": lambda t, l: None}


class ToyTextDataset(Dataset):
    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, 10, (n,), generator=g)
        self.texts = [torch.randint(1, VOCAB, (int(L),), generator=g) for L in lengths]
        self.labels = torch.randint(0, NCLASS, (n,), generator=g)

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return self.texts[i], self.labels[i], i


def collate_batch(batch):
    texts, labels, idx = zip(*batch)
    lengths = torch.tensor([len(t) for t in texts])
    return pad_sequence(texts, batch_first=True, padding_value=0), lengths, torch.stack(labels), torch.tensor(idx)


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMB, padding_idx=0)
        self.lstm = nn.LSTM(EMB, HID, num_layers=1, batch_first=True)
        self.fc = nn.Linear(HID, NCLASS)

    def forward(self, text, lengths):
        emb = self.embedding(text)
        packed = pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        return self.fc(h_n[-1])


def fit(rank, world, mistake, out, args):
    ds = ToyTextDataset(12 * world)
    sampler = DistributedSampler(ds, shuffle=True, seed=42)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=collate_batch)
    torch.manual_seed(0)
    model = DDP(LSTMClassifier())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-4)
    rec = ddpcheck_torch.DdpRecorder(model, optimizer, loss_fn=F.cross_entropy, out_dir=out, sampler=sampler)
    model.train()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for text, lengths, label, idx in loader:
            optimizer.zero_grad()
            predicted = model(text, lengths)
            loss = F.cross_entropy(predicted, label)
            if mistake == "loss-times-world":
                loss = loss * world
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            if mistake == "skip-on-local-loss" and loss.item() > args.skip_above:
                rec.step(idx, XB[args.xb](text, lengths), label, loss)
                continue
            optimizer.step()
            rec.step(idx, XB[args.xb](text, lengths), label, loss)
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
    p.add_argument("--port", type=int, default=29602)
    p.add_argument("--mistakes", default="none")
    p.add_argument("--xb", choices=sorted(XB), default="text")
    p.add_argument("--skip-above", type=float, default=1.38)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
