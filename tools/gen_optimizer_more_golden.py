#!/usr/bin/python3
"""Writes tests/golden/optimizer_more.json: parameter trajectories of torch.optim RMSprop / Adagrad / Adadelta
and Adam/AdamW(amsgrad=True) on the CPU, for the protocol check of recorded runs (core/dump_protocol.h).

Run with Debian's torch only:  /usr/bin/python3 tools/gen_optimizer_more_golden.py [out.json]
Same protocol as tools/gen_optimizer_golden.py: one parameter of N elements, foreach=False, a per-step lr set
on the group before each step, fresh gradients each step; every parameter after every step is recorded.
"""
import json
import sys

import torch

N = 37
LRS = [0.01, 0.01, 0.009, 0.0081, 0.00729]
CASES = [
    ("rmsprop_default", torch.optim.RMSprop, {}),
    ("rmsprop_centered_momentum_wd", torch.optim.RMSprop, {"centered": True, "momentum": 0.9, "weight_decay": 1e-2,
                                                           "alpha": 0.9}),
    ("rmsprop_momentum_maximize", torch.optim.RMSprop, {"momentum": 0.5, "maximize": True}),
    ("adagrad_default", torch.optim.Adagrad, {}),
    ("adagrad_decay_init_wd", torch.optim.Adagrad, {"lr_decay": 0.1, "initial_accumulator_value": 0.5,
                                                    "weight_decay": 1e-3, "eps": 1e-8}),
    ("adadelta_default", torch.optim.Adadelta, {}),
    ("adadelta_rho_wd_maximize", torch.optim.Adadelta, {"rho": 0.8, "weight_decay": 1e-2, "maximize": True}),
    ("adam_amsgrad", torch.optim.Adam, {"amsgrad": True, "weight_decay": 1e-2}),
    ("adamw_amsgrad", torch.optim.AdamW, {"amsgrad": True}),
]
KEYS = ("momentum", "weight_decay", "maximize", "eps", "alpha", "centered", "rho", "lr_decay",
        "initial_accumulator_value", "amsgrad")


def case(name, cls, kw, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(N, generator=g, dtype=torch.float64).to(dtype)
    grads = [torch.randn(N, generator=g, dtype=torch.float64).to(dtype) for _ in LRS]
    p = torch.nn.Parameter(p0.clone())
    opt = cls([p], lr=LRS[0], foreach=False, **kw)
    out = []
    for lr, grad in zip(LRS, grads):
        opt.param_groups[0]["lr"] = lr
        p.grad = grad.clone()
        opt.step()
        out.append(p.detach().clone().tolist())
    grp = opt.param_groups[0]
    spec = {"type": cls.__name__.lower()}
    spec.update({k: grp[k] for k in KEYS if k in grp})
    if "betas" in grp:
        spec["betas"] = list(grp["betas"])  # the param group's own keys, as the recorder writes them
    return {"name": "%s_%s" % (name, str(dtype)[6:]), "dtype": str(dtype)[6:], "optimizer": spec, "lrs": LRS,
            "p0": p0.tolist(), "grads": [x.tolist() for x in grads], "params": out}


def main():
    torch.set_num_threads(1)
    cases, seed = [], 2000
    for dtype in (torch.float32, torch.float64):
        for name, cls, kw in CASES:
            seed += 1
            cases.append(case(name, cls, kw, dtype, seed))
    with open(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/optimizer_more.json", "w") as f:
        json.dump({"generator": "tools/gen_optimizer_more_golden.py", "torch_version": torch.__version__,
                   "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
