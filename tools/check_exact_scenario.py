#!/usr/bin/python3
"""Proves that a scenario is exact by construction: every product and every sum of its DDP training run is
representable in float32, so any summation order (any W, any allreduce algorithm, any GEMM blocking) gives
the same bits.

Usage: /usr/bin/python3 tools/check_exact_scenario.py scenarios/exact_mlp.json [--worlds 1,2,4,8]

Scope: Sequential Linear/ReLU models, mse loss, SGD without momentum/weight decay, inline init and data,
no schedulers. Replays the run in exact rational arithmetic (fractions.Fraction) with the scenario's batch size
per rank, the DistributedSampler order (torch's, when torch is importable; otherwise the unshuffled order,
which is what "shuffle": false gives), and DDP's averaging (grad * (1/W), summed over ranks). A sum is
accepted when (sum of |terms|) * 2^d < 2^24, d being the finest binary exponent among its terms: then every
partial sum in every order is a float32. Prints, per W, the first step at which that fails; exits 1 if it
fails before the scenario's "steps". The loss (reported, never fed back) is checked too and its
exact steps printed, but it does not decide the exit code: r^2 doubles the binary depth, so it is the first
quantity to round.
"""
import json
import sys
from fractions import Fraction as F

MANT = 24  # float32 significand bits


def depth(v):
    """The binary exponent d with v * 2^d an odd integer (v dyadic), or None when v is not dyadic."""
    if v == 0:
        return 0
    den = v.denominator
    if den & (den - 1):
        return None
    return den.bit_length() - 1


class NotExact(Exception):
    pass


LOSS_INEXACT = [False]


def check_value(v, what):
    d = depth(v)
    if d is None:
        raise NotExact(f"{what}: {v} is not dyadic")
    m = abs(v.numerator)
    while m and m % 2 == 0:
        m //= 2
    if m >= 2**MANT:
        raise NotExact(f"{what}: {v} needs more than {MANT} bits")
    return v


def exact_sum(terms, what):
    for t in terms:
        check_value(t, what)
    d = max([depth(t) for t in terms] + [0])
    if sum(abs(t) for t in terms) * 2**d >= 2**MANT:
        raise NotExact(f"{what}: a sum of {len(terms)} terms needs more than {MANT} bits")
    return sum(terms, F(0))


def mul(a, b, what):
    return check_value(a * b, what)


def forward(model, params, x):
    """Returns the per-layer inputs and the output for one sample x (a list of Fractions)."""
    acts = [x]
    for i, layer in enumerate(model):
        h = acts[-1]
        if layer["type"] == "linear":
            w, b = params[f"{i}.weight"], params.get(f"{i}.bias")
            out = []
            for o in range(layer["out"]):
                terms = [mul(h[k], w[o][k], f"fwd {i}") for k in range(layer["in"])]
                if b is not None:
                    terms.append(b[o])
                out.append(exact_sum(terms, f"fwd {i}"))
            acts.append(out)
        elif layer["type"] == "relu":
            acts.append([v if v > 0 else F(0) for v in h])
        else:
            raise SystemExit(f"layer type {layer['type']} is outside this checker's scope")
    return acts


def local_grads(model, params, xs, ys):
    """mse over the local batch: loss = mean((out - y)^2); returns the gradients (torch's formulas)."""
    n = len(xs) * len(ys[0])
    grads = {k: None for k in params}
    acts_all = [forward(model, params, x) for x in xs]
    resid = [[exact_sum([a[-1][o], -y[o]], "residual") for o in range(len(y))] for a, y in zip(acts_all, ys)]
    try:  # the loss is reported, never fed back: its exactness is tracked apart from the state's
        exact_sum([mul(r, r, "loss") for row in resid for r in row], "loss")
    except NotExact:
        LOSS_INEXACT[0] = True
    norm = F(2, n)
    check_value(norm, "2/numel")
    deltas = [[mul(r, norm, "dloss") for r in row] for row in resid]
    for i in reversed(range(len(model))):
        layer = model[i]
        if layer["type"] == "relu":
            deltas = [[d if a[i][k] > 0 else F(0) for k, d in enumerate(row)] for row, a in zip(deltas, acts_all)]
            continue
        w = params[f"{i}.weight"]
        gw = [[exact_sum([mul(deltas[b][o], acts_all[b][i][k], f"dW {i}") for b in range(len(xs))], f"dW {i}")
               for k in range(layer["in"])] for o in range(layer["out"])]
        grads[f"{i}.weight"] = gw
        if f"{i}.bias" in params:
            grads[f"{i}.bias"] = [exact_sum([deltas[b][o] for b in range(len(xs))], f"db {i}")
                                  for o in range(layer["out"])]
        if i > 0:
            deltas = [[exact_sum([mul(row[o], w[o][k], f"dx {i}") for o in range(layer["out"])], f"dx {i}")
                       for k in range(layer["in"])] for row in deltas]
    return grads


def sampler_indices(n, world, rank, shuffle, seed, epoch, drop_last):
    try:
        import torch
        from torch.utils.data.distributed import DistributedSampler
    except ImportError:
        if shuffle:
            raise SystemExit("shuffle needs torch for the DistributedSampler order")
        torch = None
    if torch is not None:
        s = DistributedSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        return list(iter(s))
    total = -(-n // world) * world
    idx = list(range(n))
    idx += idx * (total // n)
    return idx[:total][rank:total:world]


def tree_map(f, a, b):
    if isinstance(a, list):
        return [tree_map(f, x, y) for x, y in zip(a, b)]
    return f(a, b)


def run(sc, world, steps):
    model = sc["model"]
    params = {k: tree_map(lambda v, _: F(v), v, v) for k, v in sc["init"]["values"].items()}
    for k, v in params.items():
        tree_map(lambda a, _: check_value(a, f"init {k}"), v, v)
    xs = [[F(v) for v in row] for row in sc["data"]["x"]]
    ys = [[F(v) for v in row] for row in sc["data"]["y"]]
    lr = F(sc["optimizer"]["lr"])
    bs, smp = sc["batch_size"], sc.get("sampler", {})
    inv_w = F(1, world)
    step = loss_steps = 0
    LOSS_INEXACT[0] = False
    for epoch in range(sc.get("epochs", 1)):
        shards = [sampler_indices(len(xs), world, r, smp.get("shuffle", True), smp.get("seed", 0),
                                  epoch if smp.get("set_epoch", True) else 0, smp.get("drop_last", False))
                  for r in range(world)]
        for start in range(0, len(shards[0]), bs):
            if step == steps:
                return step, loss_steps
            try:
                per_rank = []
                for r in range(world):
                    idx = shards[r][start:start + bs]
                    g = local_grads(model, params, [xs[i] for i in idx], [ys[i] for i in idx])
                    per_rank.append({k: tree_map(lambda a, _: mul(a, inv_w, "grad/W"), v, v) for k, v in g.items()})
                for k in params:
                    red = per_rank[0][k]
                    red = tree_map(lambda a, _: a, red, red)
                    flat = [tree_map(lambda a, _: a, pr[k], pr[k]) for pr in per_rank]

                    def reduce_at(path):
                        vals = []
                        for f_ in flat:
                            v = f_
                            for p in path:
                                v = v[p]
                            vals.append(v)
                        return exact_sum(vals, f"allreduce {k}")

                    def upd(p, path):
                        if isinstance(p, list):
                            return [upd(q, path + [j]) for j, q in enumerate(p)]
                        g = reduce_at(path)
                        return exact_sum([p, -mul(lr, g, f"lr*g {k}")], f"sgd {k}")

                    params[k] = upd(params[k], [])
            except NotExact as e:
                print(f"  W={world}: step {step} is not exact: {e}")
                return step, loss_steps
            step += 1
            if not LOSS_INEXACT[0]:
                loss_steps = step
    return step, loss_steps


def main():
    path = sys.argv[1]
    worlds = [1, 2, 4, 8]
    if len(sys.argv) > 3 and sys.argv[2] == "--worlds":
        worlds = [int(w) for w in sys.argv[3].split(",")]
    sc = json.load(open(path))
    opt = sc["optimizer"]
    assert opt.get("type", "sgd") == "sgd" and opt.get("momentum", 0) == 0 and opt.get("weight_decay", 0) == 0
    assert sc.get("loss", "mse") == "mse" and not sc.get("schedulers") and sc["init"]["kind"] == "inline"
    steps = sc.get("steps", -1)
    ok = True
    for w in worlds:
        n, nl = run(sc, w, steps if steps >= 0 else 10**9)
        print(f"W={w}: parameters, gradients and all-reduces exact for {n} steps, the loss for {nl} "
              f"(scenario runs {steps})")
        ok = ok and (steps < 0 or n >= steps)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
