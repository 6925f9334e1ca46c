#!/usr/bin/python3
"""Writes tests/golden/optimizer.json: parameter trajectories of torch.optim SGD / Adam / AdamW on the CPU.

Run with Debian's torch only:  /usr/bin/python3 tools/gen_optimizer_golden.py [out.json]

Each case: one parameter tensor of n elements (n chosen so the CPU kernels run both their vectorized body and
their scalar tail), `steps` optimizer steps with fresh gradients each step and a per-step lr (set on the
param group before the step, as an LR scheduler would). Recorded: the initial parameter, every gradient, the
parameter after every step, and the optimizer state after the last step. float32 values are written as the
double equal to the float32, so (float)strtod(text) is exact; Python's json writes the shortest repr.
"""
import json
import platform
import sys

import torch

N = 37  # float32: 2 AVX2 chunks of 16 + a scalar tail of 5; float64: 4 chunks of 8 + 5


def make_case(name, dtype, opt_type, kwargs, lrs, seed, scale=1.0, grad_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    p0 = (torch.randn(N, generator=g, dtype=torch.float64) * scale).to(dtype)
    grads = [(torch.randn(N, generator=g, dtype=torch.float64) * grad_scale).to(dtype) for _ in lrs]
    p = torch.nn.Parameter(p0.clone())
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[opt_type]
    opt = cls([p], lr=lrs[0], foreach=False, **kwargs)
    params = []
    for lr, grad in zip(lrs, grads):
        opt.param_groups[0]["lr"] = lr
        p.grad = grad.clone()
        opt.step()
        params.append(p.detach().clone())
    st = opt.state[p]
    state = {}
    if opt_type == "sgd":
        buf = st.get("momentum_buffer")
        state["momentum_buffer"] = None if buf is None else buf.tolist()
    else:
        state["step"] = float(st["step"].item())
        state["exp_avg"] = st["exp_avg"].tolist()
        state["exp_avg_sq"] = st["exp_avg_sq"].tolist()
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    spec = {"type": opt_type, "momentum": group.get("momentum", 0.0), "dampening": group.get("dampening", 0.0),
            "weight_decay": group["weight_decay"], "nesterov": group.get("nesterov", False),
            "maximize": group.get("maximize", False)}
    if opt_type != "sgd":
        spec.update({"beta1": group["betas"][0], "beta2": group["betas"][1], "eps": group["eps"]})
    return {"name": name, "dtype": str(dtype).replace("torch.", ""), "optimizer": spec, "lrs": lrs,
            "p0": p0.tolist(), "grads": [x.tolist() for x in grads], "params": [x.tolist() for x in params],
            "state": state}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/optimizer.json"
    torch.set_num_threads(1)
    lrs5 = [0.1, 0.1, 0.05, 0.05, 0.025]
    lrs_small = [1e-3, 1e-3, 9e-4, 8.1e-4, 7.29e-4]
    sgd = [
        ("sgd_plain", {}),
        ("sgd_momentum", {"momentum": 0.9}),
        ("sgd_momentum_dampening", {"momentum": 0.9, "dampening": 0.3}),
        ("sgd_nesterov", {"momentum": 0.9, "nesterov": True}),
        ("sgd_weight_decay", {"weight_decay": 1e-2}),
        ("sgd_momentum_wd_dampening", {"momentum": 0.7, "dampening": 0.1, "weight_decay": 5e-4}),
        ("sgd_nesterov_wd_maximize", {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3, "maximize": True}),
        ("sgd_maximize", {"maximize": True}),
    ]
    adam = [
        ("adam_default", "adam", {}),
        ("adam_wd_betas", "adam", {"weight_decay": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6}),
        ("adam_maximize", "adam", {"maximize": True}),
        ("adamw_default", "adamw", {}),
        ("adamw_wd_maximize", "adamw", {"weight_decay": 0.1, "betas": (0.85, 0.995), "maximize": True}),
    ]
    cases = []
    seed = 1000
    for dtype in (torch.float32, torch.float64):
        for name, kw in sgd:
            seed += 1
            cases.append(make_case(f"{name}_{str(dtype)[6:]}", dtype, "sgd", kw, lrs5, seed))
        for name, kind, kw in adam:
            seed += 1
            cases.append(make_case(f"{name}_{str(dtype)[6:]}", dtype, kind, kw, lrs_small, seed))
        seed += 1
        # Tiny gradients: v = (1-beta2) g^2 is near the bottom of the float range and eps dominates the denom.
        cases.append(make_case(f"adam_tiny_grads_{str(dtype)[6:]}", dtype, "adam", {}, lrs_small, seed,
                               grad_scale=1e-5))
    doc = {
        "generator": "tools/gen_optimizer_golden.py",
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "protocol": "p = Parameter(p0); opt = <type>([p], lr=lrs[0], foreach=False, **kwargs); for each step k: "
                    "param_groups[0]['lr'] = lrs[k]; p.grad = grads[k]; opt.step(); params[k] = p. "
                    "state = the optimizer state after the last step. torch.set_num_threads(1).",
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(doc, f)
        f.write("\n")


if __name__ == "__main__":
    main()
