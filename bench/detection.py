#!/usr/bin/python3
"""Detection power of `ddpcheck torch-compare` (issue 15): how small an error in a real PyTorch DDP run it catches.

Records real DDP runs (gloo, CPU) with tools/ddpcheck_torch.py, then for each run and each eps scales ONE recorded
tensor (a parameter, a reduced gradient, or the loss) by (1 + eps) on every rank at one step, so the ranks still
agree and only the comparison with the replay can see it, and runs `ddpcheck torch-compare` on the edited copy.
Prints caught/total per precision and eps, whether the first divergence is at the perturbed step, and whether
every clean twin passes.

    /usr/bin/python3 bench/detection.py --ddpcheck build/release/ddpcheck [--quick]

A benchmark, not a test: about a minute for the default grid on a 2-core machine.
"""
import argparse
import datetime
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import ddpcheck_torch  # noqa: E402


def build_model(kind):
    if kind == "linear":
        return nn.Linear(8, 4)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def worker(rank, cfg, out, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg["world"], timeout=datetime.timedelta(seconds=20))
    dtype = torch.float64 if cfg["dtype"] == "float64" else torch.float32
    autocast = cfg["dtype"] == "autocast"  # float32 parameters, the forward under CPU autocast in bfloat16
    g = torch.Generator().manual_seed(12345)
    n = 8 * cfg["world"] * 3
    X = torch.randn(n, 8, generator=g, dtype=torch.float64).to(dtype)
    Y = torch.randn(n, 4, generator=g, dtype=torch.float64).to(dtype)
    ds = TensorDataset(X, Y, torch.arange(n))
    sampler = DistributedSampler(ds, num_replicas=cfg["world"], rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = build_model(cfg["model"]).to(dtype)
    ddp = DDP(model)
    loss_fn = nn.MSELoss()
    if cfg["opt"] == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    with ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=loss_fn, out_dir=out) as rec:
        rec.set_dataset(X, Y)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                opt.zero_grad()
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
                    out = ddp(xb)
                loss = loss_fn(out.to(yb.dtype) if autocast else out, yb)
                loss.backward()
                opt.step()
                rec.step(idx, xb, yb, loss)
    dist.destroy_process_group()


def record(cfg, out, port):
    mp.spawn(worker, args=(cfg, out, port), nprocs=cfg["world"], join=True)


def perturb(src, dst, what, step, eps):
    """Copies dump src to dst and scales one recorded tensor of `step` by (1 + eps) on every rank."""
    shutil.copytree(src, dst)
    done = set()  # the entries scaled: a rank naming rank 0's entry (format version 3) shares it, scaled once
    r = 0
    while os.path.isdir(os.path.join(dst, "rank%d" % r)):
        ix_path = os.path.join(dst, "rank%d" % r, "index.json")
        with open(ix_path) as f:
            ix = json.load(f)
        st = ix["steps"][step]
        if what == "loss":
            st["loss"] = st["loss"] * (1 + eps)
            with open(ix_path, "w") as f:
                json.dump(ix, f)
        else:
            kind, name = what.split(":")
            rank_dir, file = os.path.join(dst, "rank%d" % r), st[kind][name]
            if file.startswith("../"):  # "../rank0/s3.npz/s3.x.npy": rank 0's entry, which this rank holds bitwise
                peer, file = file[3:].split("/", 1)
                rank_dir = os.path.join(dst, peer)
            if (rank_dir, file) not in done:
                done.add((rank_dir, file))
                scale(rank_dir, file, eps)
        r += 1


def scale(rank_dir, file, eps):
    """Scales the tensor the index names `file` (a .npy file, or "ARCHIVE.npz/ENTRY.npy") by (1 + eps) in place."""
    def scaled(a):
        return (a.astype(np.float64) * (1 + eps)).astype(a.dtype)
    if ".npz/" not in file:
        path = os.path.join(rank_dir, file)
        np.save(path, scaled(np.load(path)))
        return
    archive, entry = file.split("/", 1)
    path = os.path.join(rank_dir, archive)
    with zipfile.ZipFile(path) as z:
        entries = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:  # stored, as the recorder writes it
        for n, data in entries:
            if n == entry:
                buf = io.BytesIO()
                np.save(buf, scaled(np.load(io.BytesIO(data))))
                data = buf.getvalue()
            z.writestr(n, data)


def compare(ddpcheck, dump):
    js = dump + ".json"
    p = subprocess.run([ddpcheck, "torch-compare", "--quiet", "--comm", "local", "--report-json", js, dump],
                       capture_output=True, text=True)
    first = None
    if os.path.exists(js):
        with open(js) as f:
            fd = json.load(f).get("first_divergence")
        if fd:
            first = fd.get("step")
    return p.returncode, first, p.stdout.strip() + p.stderr.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddpcheck", default="build/release/ddpcheck")
    ap.add_argument("--quick", action="store_true", help="one run per precision")
    ap.add_argument("--precisions", default="float32,float64,autocast",
                    help="comma-separated subset of float32, float64, autocast (bfloat16 CPU autocast)")
    ap.add_argument("--keep", help="keep the dumps under this folder")
    args = ap.parse_args()
    runs = [("linear", 2, "sgd"), ("mlp", 3, "adam"), ("bn", 4, "sgd"), ("bn", 2, "adam"), ("mlp", 4, "sgd"),
            ("linear", 3, "adam")]
    if args.quick:
        runs = runs[2:3]
    eps_by = {"float32": [1e-3, 1e-4, 1e-5], "float64": [1e-10, 1e-11, 1e-12], "autocast": [1e-1, 1e-2, 1e-3]}
    tmp = args.keep or tempfile.mkdtemp(prefix="ddpcheck_detection_")
    port = 29700
    table = {}  # (dtype, eps) -> [caught, total, at_step]
    clean_pass = clean_total = 0
    for dtype in args.precisions.split(","):
        for i, (model, world, opt) in enumerate(runs):
            cfg = {"dtype": dtype, "model": model, "world": world, "opt": opt}
            name = "%s_%s_w%d_%s" % (dtype, model, world, opt)
            base = os.path.join(tmp, name)
            port += 1
            record(cfg, base, port)
            rc, first, out = compare(args.ddpcheck, base)
            clean_total += 1
            clean_pass += rc == 0
            if rc != 0:
                print("CLEAN RUN FLAGGED: %s rc=%d %s" % (name, rc, out))
            with open(os.path.join(base, "rank0", "index.json")) as f:
                ix = json.load(f)
            nsteps = len(ix["steps"])
            step = nsteps // 2
            st = ix["steps"][step]
            params = sorted(st["params"])
            grads = sorted(st["grads"])
            targets = ["loss", "params:" + params[i % len(params)], "grads:" + grads[(i + 1) % len(grads)]]
            for eps, what in itertools.product(eps_by[dtype], targets):
                dst = os.path.join(tmp, "%s_%s_%g" % (name, what.replace(":", "_"), eps))
                perturb(base, dst, what, step, eps)
                rc, first, out = compare(args.ddpcheck, dst)
                cell = table.setdefault((dtype, eps), [0, 0, 0])
                cell[1] += 1
                if rc == 1:
                    cell[0] += 1
                    cell[2] += first == step
                elif rc != 0:
                    print("ERROR %s: rc=%d %s" % (dst, rc, out))
                print("%-60s rc=%d first=%s (perturbed step %d)" % (os.path.basename(dst), rc, first, step), flush=True)
                if not args.keep:
                    shutil.rmtree(dst)
                    os.remove(dst + ".json") if os.path.exists(dst + ".json") else None
    print()
    print("| precision | eps | caught | first divergence at the perturbed step |")
    print("| --- | --- | --- | --- |")
    for (dtype, eps), (c, t, at) in sorted(table.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        print("| %s | %g | %d/%d | %d/%d |" % (dtype, eps, c, t, at, c))
    print("clean twins passing: %d/%d" % (clean_pass, clean_total))
    if not args.keep:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
