#!/usr/bin/python3
"""A tiny next-token language model with weight tying (lm_head.weight = embed.weight, as GPT-2/nanoGPT do):
Embedding + learned position embedding, a GELU MLP block with a residual, LayerNorm, tied output Linear (no bias).
F.cross_entropy over logits.view(-1, V); AdamW (weight_decay 0.1); gradient accumulation over 2 micro-batches,
the first under ddp.no_sync(), each micro-batch loss divided by 2. DistributedSampler over fixed-length token
windows, 2 epochs.

    --loss function|module  (loss_fn given to the recorder as a plain function, or as an nn.Module the loop calls)
    --mistakes none,no-divide,loss-times-world,nosync-both
  no-divide          the accumulated micro-batch losses are not divided by the window (2)
  loss-times-world   loss * world_size
  nosync-both        both micro-batches run under no_sync(): DDP never all-reduces
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
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ddpcheck_torch  # noqa: E402

V, T, D, ACC = 23, 8, 16, 2


class TinyLM(nn.Module):
    def __init__(self, tie=True):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(1, T, D))
        self.ln = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.lm_head = nn.Linear(D, V, bias=False)
        if tie:
            self.lm_head.weight = self.embed.weight

    def forward(self, idx):
        h = self.embed(idx) + self.pos[:, : idx.shape[1]]
        h = h + self.mlp(self.ln(h))
        return self.lm_head(h)


class Windows(Dataset):
    def __init__(self, tokens):
        self.tokens = tokens

    def __len__(self):
        return (len(self.tokens) - 1) // T

    def __getitem__(self, i):
        chunk = self.tokens[i * T: i * T + T + 1]
        return chunk[:-1], chunk[1:], i


def lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


class LMLoss(nn.Module):
    def forward(self, logits, y):
        return lm_loss(logits, y)


LOSS = {"function": lm_loss, "module": LMLoss()}


def train(rank, world, mistake, out, loss_kind):
    lm_loss = LOSS[loss_kind]
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, V, (T * 48 + 1,), generator=g)
    data = Windows(tokens)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4 * ACC, sampler=sampler)
    torch.manual_seed(42)
    model = DDP(TinyLM(tie=not (mistake == "untied-rank1" and rank == 1)))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    with ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=lm_loss, out_dir=out) as rec:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                opt.zero_grad(set_to_none=True)
                for k, (mx, my) in enumerate(zip(xb.chunk(ACC), yb.chunk(ACC))):
                    last = k == ACC - 1 and mistake != "nosync-both"
                    with (model.no_sync() if not last else torch.enable_grad()):
                        loss = lm_loss(model(mx), my)
                        if mistake == "loss-times-world":
                            loss = loss * world
                        if mistake != "no-divide":
                            loss = loss / ACC
                        loss.backward()
                opt.step()
                rec.step(idx, xb, yb, loss)


def run(rank, world, port, out, mistakes, loss_kind):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    torch.set_num_threads(1)
    for m in mistakes.split(","):
        try:
            train(rank, world, m, os.path.join(out, m), loss_kind)
        except Exception as e:  # noqa: BLE001  a mistake that crashes DDP: report it and stop
            print("rank %d mistake %s raised %s: %s" % (rank, m, type(e).__name__, str(e)[:300]), flush=True)
            return
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29621)
    p.add_argument("--mistakes", default="none")
    p.add_argument("--loss", choices=["function", "module"], default="function",
                   help="loss_fn as a plain function (default) or an nn.Module the loop calls")
    a = p.parse_args()
    mp.spawn(run, args=(a.world, a.port, a.out, a.mistakes, a.loss), nprocs=a.world)
