#!/usr/bin/python3
"""Regenerates the project's golden fixtures (tests/golden/) from Debian's python3-torch (torch 1.13, CPU, gloo).

    /usr/bin/python3 tools/gen_golden.py [--out DIR] [--inplace] [--only randperm,sampler,lr,ddp_traj]

Files, in the formats documented in tests/golden/README.md (the project's copies are subsets of the shipped grids):
  randperm.json          torch.randperm(n, Generator().manual_seed(seed)) for n in {1,2,5,11,100} x seeds {0,7}
  sampler.json           DistributedSampler for n in {1,3,10,11,17,100} x W {1,2,3,4,8} x shuffle x seed {0,42}
                         x epoch {0,1} x drop_last, every rank; plus constructor error cases
  lr.json                ExponentialLR(0.9) then CosineAnnealingLR(50) for 100 epochs; StepLR(3, 0.5) for 30
  ddp_traj/<model>_<dtype>_W<W>.json   real torch.multiprocessing gloo DDP runs (recipe in the golden README,
                         section 6) for models a_linear10x10, b_mlp10_20_10, c_mlp_bn8_16_4, float32/float64,
                         W in --worlds (default 2,3)
A file whose regenerated content differs from the existing one is written to --out (default out/golden) and
reported; existing files are overwritten only with --inplace. Identical files are left alone.
"""
import argparse
import datetime
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "tests", "golden")


class Dummy:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def gen_randperm():
    cases = []
    for seed in (0, 7):
        for n in (1, 2, 5, 11, 100):
            g = torch.Generator().manual_seed(seed)
            cases.append({"n": n, "seed": seed, "initial_seed": g.initial_seed(),
                          "perm": torch.randperm(n, generator=g).tolist()})
    return {"source": "torch 1.13 (Debian python3-torch), torch.randperm(n, generator=torch.Generator()"
                      ".manual_seed(seed))", "cases": cases}


def gen_sampler():
    from torch.utils.data.distributed import DistributedSampler
    cases = []
    for n in (1, 3, 10, 11, 17, 100):
        for w in (1, 2, 3, 4, 8):
            for shuffle in (True, False):
                for seed in (0, 42):
                    for epoch in (0, 1):
                        for drop_last in (False, True):
                            idx, s = [], None
                            for r in range(w):
                                s = DistributedSampler(Dummy(n), num_replicas=w, rank=r, shuffle=shuffle, seed=seed,
                                                       drop_last=drop_last)
                                s.set_epoch(epoch)
                                idx.append(list(iter(s)))
                            cases.append({"n": n, "num_replicas": w, "shuffle": shuffle, "seed": seed, "epoch": epoch,
                                          "drop_last": drop_last, "num_samples": s.num_samples,
                                          "total_size": s.total_size, "indices": idx})
    errors = []
    probes = [(10, 4, 4, 0, 0), (10, 4, -1, 0, 0), (10, 0, 0, 0, 0), (10, -1, 0, 0, 0), (10, 1, 1, 0, 0),
              (5, 2, 0, 2**64, 0), (5, 2, 0, 2**64 - 1, 1)]
    for n, w, rank, seed, epoch in probes:
        rec = {"shuffle": True, "seed": seed, "epoch": epoch, "drop_last": False, "n": n, "num_replicas": w,
               "rank": rank}
        stage = "constructor"
        try:
            s = DistributedSampler(Dummy(n), num_replicas=w, rank=rank, shuffle=True, seed=seed)
            s.set_epoch(epoch)
            stage = "iter"
            list(iter(s))
            continue  # accepted: not an error case
        except Exception as e:  # noqa: BLE001 - the error text is the fixture
            rec.update({"error_type": type(e).__name__, "error": str(e), "raised_in": stage})
        errors.append(rec)
    return {"source": "torch 1.13 DistributedSampler(Dummy(n), num_replicas, rank, shuffle, seed, drop_last); "
                      "set_epoch(epoch); list(iter(s)) for every rank", "cases": cases, "error_cases": errors}


def gen_lr(existing):
    classes = {"ExponentialLR": torch.optim.lr_scheduler.ExponentialLR,
               "CosineAnnealingLR": torch.optim.lr_scheduler.CosineAnnealingLR,
               "StepLR": torch.optim.lr_scheduler.StepLR}
    specs = [("exp0.9_then_cosine50", [("ExponentialLR", {"gamma": 0.9}), ("CosineAnnealingLR", {"T_max": 50, "eta_min": 0})], 100),
             ("step3_0.5", [("StepLR", {"step_size": 3, "gamma": 0.5})], 30)]
    cases = []
    for name, scheds, epochs in specs:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=0.01)
        ss = [classes[t](opt, **kw) for t, kw in scheds]
        lrs, last = [opt.param_groups[0]["lr"]], []
        for _ in range(epochs):
            opt.step()
            for s in ss:
                s.step()
            lrs.append(opt.param_groups[0]["lr"])
            last.append([s.get_last_lr()[0] for s in ss])
        cases.append({"name": name, "optimizer": {"type": "SGD", "lr": 0.01},
                      "schedulers_in_step_order": [{"type": t, "kwargs": kw} for t, kw in scheds], "epochs": epochs,
                      "lrs": lrs, "lrs_repr": [repr(x) for x in lrs], "get_last_lr_per_scheduler": last})
    out = {"source": "torch 1.13 lr_scheduler"}
    for key in ("protocol", "notes"):  # prose, kept from the existing file
        if key in existing:
            out[key] = existing[key]
    out["cases"] = cases
    return out


# --------------------------------------------------------------------------------------------------------------
# ddp_traj: real gloo DDP runs, one process per rank.
MODELS = {
    "a_linear10x10": ("nn.Linear(10, 10)", 10, 10),
    "b_mlp10_20_10": ("nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 10))", 10, 10),
    "c_mlp_bn8_16_4": ("nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))", 8, 4),
}


def _nested(t):
    return t.detach().tolist()


def _traj_worker(rank, world, model, dtype_name, port, out):
    import torch.distributed as dist
    from torch import nn  # noqa: F401 - used by eval of the model definition
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    dtype = getattr(torch, dtype_name)
    model_def, n_in, n_out = MODELS[model]
    g = torch.Generator().manual_seed(12345)
    X = torch.randn(64, n_in, generator=g, dtype=torch.float64).to(dtype)
    Y = torch.randn(64, n_out, generator=g, dtype=torch.float64).to(dtype)
    seed = 0 if rank == 0 else 1000 + rank
    torch.manual_seed(seed)
    m = eval(model_def).to(dtype)  # noqa: S307 - fixed strings above
    init_local = {"params": {k: _nested(v) for k, v in m.named_parameters()},
                  "buffers": {k: _nested(v) for k, v in m.named_buffers()}}
    ddp = DDP(m, broadcast_buffers=True)
    init_after = {"params": {k: _nested(v) for k, v in m.named_parameters()},
                  "buffers": {k: _nested(v) for k, v in m.named_buffers()}}
    ds = TensorDataset(X, Y, torch.arange(64))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=False)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, drop_last=False, num_workers=0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.MSELoss()
    steps, step = [], 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for k, (xb, yb, idx) in enumerate(loader):
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            buckets = [b.index() for b in ddp.reducer._get_zeros_like_grad_buckets()]
            grads = {n: _nested(p.grad) for n, p in m.named_parameters()}
            opt.step()
            steps.append({"global_step": step, "epoch": epoch, "step_in_epoch": k, "batch_indices": idx.tolist(),
                          "loss": loss.item(), "grads": grads, "buckets_after_backward": buckets,
                          "params": {n: _nested(p) for n, p in m.named_parameters()},
                          "buffers": {n: (int(b) if b.dim() == 0 else _nested(b)) for n, b in m.named_buffers()}})
            step += 1
    mom = {n: _nested(opt.state[p]["momentum_buffer"]) for n, p in m.named_parameters()}
    rec = {"rank": rank, "init_seed": seed, "init_local": init_local, "init_after_ddp_broadcast": init_after,
           "steps": steps, "momentum": mom, "X": _nested(X), "Y": _nested(Y),
           "param_names": [n for n, _ in m.named_parameters()], "buffer_names": [n for n, _ in m.named_buffers()]}
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump(rec, f)
    dist.destroy_process_group()


def _bucket_layout(model, step):
    # DDP 1.13 (find_unused_parameters=False): one bucket in parameter order at step 0, rebuilt from the
    # gradient-ready order from step 1 (golden README sections 3 and 6).
    order = {"a_linear10x10": [[0, 1]], "b_mlp10_20_10": [[0, 1, 2, 3]], "c_mlp_bn8_16_4": [[0, 1, 2, 3, 4, 5]]}
    rebuilt = {"a_linear10x10": [[1, 0]], "b_mlp10_20_10": [[3, 2, 1, 0]], "c_mlp_bn8_16_4": [[5, 4, 2, 3, 1, 0]]}
    return order[model] if step == 0 else rebuilt[model]


def gen_ddp_traj(model, dtype_name, world, port, existing=None):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_traj_worker, args=(world, model, dtype_name, port, tmp), nprocs=world, join=True)
        ranks = [json.load(open(os.path.join(tmp, "rank%d.json" % r))) for r in range(world)]
    r0 = ranks[0]
    model_def = MODELS[model][0] + ("; DDP broadcast_buffers=True" if "bn" in model else "")
    steps = []
    for i, s0 in enumerate(r0["steps"]):
        per = [r["steps"][i] for r in ranks]
        steps.append({"global_step": i, "epoch": s0["epoch"], "step_in_epoch": s0["step_in_epoch"],
                      "params_equal_across_ranks": all(p["params"] == s0["params"] for p in per),
                      "grads_equal_across_ranks": all(p["grads"] == s0["grads"] for p in per),
                      "bucket_param_indices": _bucket_layout(model, i),
                      "grads_after_allreduce_rank0": s0["grads"],
                      "ranks": [{"rank": r, "batch_indices": p["batch_indices"], "loss": p["loss"],
                                 "params": p["params"], "buffers": p["buffers"]} for r, p in enumerate(per)]})
    n_in, n_out = MODELS[model][1], MODELS[model][2]
    data = {"model": model, "model_def": model_def, "dtype": dtype_name, "world_size": world,
            "params": {"init": "per rank: torch.manual_seed(init_seed(rank)); model = <model_def>; model.to(dtype)",
                       "init_seed_by_rank": [r["init_seed"] for r in ranks],
                       "ddp": "DistributedDataParallel(model, broadcast_buffers=True); gloo; CPU",
                       "data": "g=torch.Generator().manual_seed(12345); X=torch.randn(64,%d,generator=g,dtype=float64); "
                               "Y=torch.randn(64,%d,generator=g,dtype=float64); then .to(dtype)" % (n_in, n_out),
                       "sampler": "DistributedSampler(ds, num_replicas=W, rank=rank, shuffle=True, seed=0); set_epoch(epoch)",
                       "loader": "DataLoader(ds, batch_size=4, sampler=sampler)", "loss": "nn.MSELoss()",
                       "optimizer": "SGD(lr=0.01, momentum=0.9, weight_decay=1e-4)", "epochs": 3, "n_samples": 64,
                       "batch_size_per_rank": 4},
            "param_names": r0["param_names"], "buffer_names": r0["buffer_names"],
            "dataset": {"X": r0["X"], "Y": r0["Y"]},
            "initial": [{"rank": r["rank"], "init_seed": r["init_seed"], "init_local": r["init_local"],
                         "init_after_ddp_broadcast": r["init_after_ddp_broadcast"]} for r in ranks],
            "steps": steps, "final_momentum_buffers_rank0": r0["momentum"],
            "final_momentum_equal_across_ranks": all(r["momentum"] == r0["momentum"] for r in ranks)}
    out = {"generator": "tools/gen_golden.py", "torch_version": torch.__version__, "python": sys.version.split()[0]}
    out.update(data)
    if existing:  # keep the existing file's prose (provenance and recipe text); every number is regenerated
        for key in ("generator", "torch_version", "python", "model_def"):
            if key in existing:
                out[key] = existing[key]
        for key, v in existing.get("params", {}).items():
            if isinstance(v, str) and key in out["params"]:
                out["params"][key] = v
    return out


def write(rel, data, args):
    path = os.path.join(GOLDEN, rel)
    text = json.dumps(data)
    old = None
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    if old == json.loads(text):
        print("same      %s" % rel)
        return
    target = path if (args.inplace or old is None and args.inplace) else os.path.join(args.out, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as f:
        f.write(text)
    print("%s %s -> %s" % ("new      " if old is None else "CHANGED  ", rel, target))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/golden", help="where changed or new files go without --inplace")
    ap.add_argument("--inplace", action="store_true", help="overwrite tests/golden/ files whose content changed")
    ap.add_argument("--only", default="randperm,sampler,lr,ddp_traj")
    ap.add_argument("--worlds", default="2,3")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--port", type=int, default=29650)
    args = ap.parse_args()
    torch.set_num_threads(1)
    only = set(args.only.split(","))
    if "randperm" in only:
        write("randperm.json", gen_randperm(), args)
    if "sampler" in only:
        write("sampler.json", gen_sampler(), args)
    if "lr" in only:
        lr_path = os.path.join(GOLDEN, "lr.json")
        write("lr.json", gen_lr(json.load(open(lr_path)) if os.path.exists(lr_path) else {}), args)
    if "ddp_traj" in only:
        port = args.port
        for model in args.models.split(","):
            for dtype in args.dtypes.split(","):
                for w in (int(x) for x in args.worlds.split(",")):
                    rel = "ddp_traj/%s_%s_W%d.json" % (model, dtype, w)
                    path = os.path.join(GOLDEN, rel)
                    existing = json.load(open(path)) if os.path.exists(path) else None
                    write(rel, gen_ddp_traj(model, dtype, w, port, existing), args)
                    port += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
