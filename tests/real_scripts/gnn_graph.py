#!/usr/bin/python3
"""A two-layer GCN (Kipf & Welling) for node classification with message passing written by hand, as PyG-free
tutorials do: symmetric degree normalisation, self loops, messages h[src] * norm summed into their targets with
index_add_ (layer 1) and scatter_add_ (layer 2). The model holds its graph (node features x, edge_index, norm);
forward(node_ids) propagates over the whole graph and returns the batch's logits, keeping the last ones in
self.last_logits (a cache its forward sets: each rank its own) and counting its propagations in a helper method.
It also keeps its rank for logging. Labels are a fixed function of the base graph's features. DistributedSampler
over the training node ids, Adam(weight_decay=5e-4), StepLR per epoch, 2 epochs x 3 steps of 6 nodes. Checked by
the protocol check alone.

    --mistakes none,graph-buffer-rank-seed,graph-attr-rank-seed,edges-attr-rank-seed
  none                    the graph built from the same seed on every rank, held as plain attributes: PASS
  graph-buffer-rank-seed  (correct) every rank builds the graph from its own seed, but as registered buffers: DDP
                          broadcasts rank 0's at construction and before every forward: PASS
  graph-attr-rank-seed    the per-rank graph held as plain attributes (self.edge_index = ...), which DDP never
                          broadcasts: every rank propagates over its own graph (attribute-per-rank, step 0)
  edges-attr-rank-seed    the node features a buffer (broadcast), edge_index and norm per-rank plain attributes
                          (attribute-per-rank, step 0)
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

N, FIN, HID, C, E, BS = 60, 8, 16, 3, 180, 6


def make_graph(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, FIN, generator=g)
    src = torch.randint(0, N, (E,), generator=g)
    dst = torch.randint(0, N, (E,), generator=g)
    loops = torch.arange(N)
    edge_index = torch.stack([torch.cat([src, dst, loops]), torch.cat([dst, src, loops])])  # undirected + self loops
    deg = torch.zeros(N).index_add_(0, edge_index[1], torch.ones(edge_index.size(1)))
    norm = deg[edge_index[0]].rsqrt() * deg[edge_index[1]].rsqrt()
    return x, edge_index, norm


class GCN(nn.Module):
    def __init__(self, graph, rank, buffers=(), dropout=0.0):
        super().__init__()
        for name, t in zip(("x", "edge_index", "norm"), graph):
            if name in buffers:
                self.register_buffer(name, t)
            else:
                setattr(self, name, t)
        self.rank = rank  # for logging
        self.propagations = 0
        self.lin1 = nn.Linear(FIN, HID)
        self.lin2 = nn.Linear(HID, C)
        self.dropout = dropout

    def propagate(self, h, scatter=False):
        self.propagations += 1
        src, dst = self.edge_index
        msg = h[src] * self.norm.unsqueeze(1)
        if scatter:
            return torch.zeros_like(h).scatter_add_(0, dst.unsqueeze(1).expand_as(msg), msg)
        return torch.zeros_like(h).index_add_(0, dst, msg)

    def forward(self, node_ids):
        h = F.relu(self.propagate(self.lin1(self.x)))
        h = F.dropout(h, self.dropout, self.training)
        out = self.propagate(self.lin2(h), scatter=True)[node_ids]
        self.last_logits = out.detach()
        return out


def fit(rank, world, mistake, out):
    base = make_graph(7)
    labels = (base[0][:, 0] > 0).long() + (base[0][:, 1] > 0.5).long()  # 3 classes from the fixed features
    graph = make_graph(100 + rank) if mistake != "none" else base
    buffers = {"graph-buffer-rank-seed": ("x", "edge_index", "norm"), "edges-attr-rank-seed": ("x",)}.get(mistake, ())
    train_ids = torch.arange(BS * 3 * world)
    ds = TensorDataset(train_ids, labels[train_ids], torch.arange(len(train_ids)))
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=BS, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(GCN(graph, rank, buffers))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    rec = ddpcheck_torch.DdpRecorder(model, opt, sampler=sampler, loss_fn=F.cross_entropy, out_dir=out,
                                     schedulers=[sched])
    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        for nodes, y, idx in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(nodes), y)
            loss.backward()
            opt.step()
            rec.step(idx, nodes, y, loss)
        sched.step()
    rec.close()


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
    ap.add_argument("--port", type=int, default=29653)
    ap.add_argument("--mistakes", default="none")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world)
