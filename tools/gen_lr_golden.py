#!/usr/bin/python3
"""Writes tests/golden/lr_extra.json: LR scheduler chains from torch 1.13, in the format of lr.json.

Run with Debian's torch only:  /usr/bin/python3 tools/gen_lr_golden.py [out.json]

Protocol (as lr.json): opt = SGD([p], lr); schedulers built in listed order (each constructor does its own
initial step); lrs[0] = lr after construction; per epoch: opt.step(); s.step() for each scheduler in order;
lrs.append(param_groups[0]['lr']). get_last_lr_per_scheduler[k] = [s.get_last_lr()[0] for s] after epoch k+1.
A case with "resume" first sets param_groups[0]['initial_lr'] and builds every scheduler with last_epoch.
"""
import json
import platform
import sys
import warnings

import torch

CLASSES = {
    "StepLR": torch.optim.lr_scheduler.StepLR,
    "MultiStepLR": torch.optim.lr_scheduler.MultiStepLR,
    "ExponentialLR": torch.optim.lr_scheduler.ExponentialLR,
    "CosineAnnealingLR": torch.optim.lr_scheduler.CosineAnnealingLR,
    "LinearLR": torch.optim.lr_scheduler.LinearLR,
}


def run(name, lr, scheds, epochs, resume=None):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    extra = {}
    if resume is not None:
        opt.param_groups[0]["initial_lr"] = resume["initial_lr"]
        extra["last_epoch"] = resume["last_epoch"]
    built = [CLASSES[s["type"]](opt, **s["kwargs"], **extra) for s in scheds]
    lrs = [opt.param_groups[0]["lr"]]
    per = []
    for _ in range(epochs):
        opt.step()
        for s in built:
            s.step()
        lrs.append(opt.param_groups[0]["lr"])
        per.append([s.get_last_lr()[0] for s in built])
    case = {"name": name, "optimizer": {"type": "SGD", "lr": lr}, "schedulers_in_step_order": scheds,
            "epochs": epochs, "lrs": lrs, "lrs_repr": [repr(x) for x in lrs], "get_last_lr_per_scheduler": per}
    if resume is not None:
        case["resume"] = resume
    return case


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/lr_extra.json"
    warnings.simplefilter("ignore")
    S = lambda t, **kw: {"type": t, "kwargs": kw}  # noqa: E731
    cases = [
        run("exp0.9_alone", 0.01, [S("ExponentialLR", gamma=0.9)], 40),
        run("cosine50_alone", 0.01, [S("CosineAnnealingLR", T_max=50, eta_min=0)], 120),
        run("cosine50_then_exp0.9", 0.01, [S("CosineAnnealingLR", T_max=50, eta_min=0),
                                            S("ExponentialLR", gamma=0.9)], 100),
        run("cosine10_eta0.001", 0.1, [S("CosineAnnealingLR", T_max=10, eta_min=0.001)], 35),
        run("cosine1_eta0.01", 0.1, [S("CosineAnnealingLR", T_max=1, eta_min=0.01)], 6),
        run("multistep_25_50_75_0.2", 0.01, [S("MultiStepLR", milestones=[25, 50, 75], gamma=0.2)], 100),
        run("multistep_repeated_milestone", 1.0, [S("MultiStepLR", milestones=[2, 4, 4, 7], gamma=0.3)], 10),
        run("linear_0.1_to_1_over5", 0.01, [S("LinearLR", start_factor=0.1, end_factor=1.0, total_iters=5)], 20),
        run("linear_defaults_lr0.1", 0.1, [S("LinearLR")], 10),
        run("linear_decay_to_0.05", 0.3, [S("LinearLR", start_factor=1.0, end_factor=0.05, total_iters=7)], 12),
        run("linear_warmup_then_cosine20", 0.05, [S("LinearLR", start_factor=0.25, total_iters=4),
                                                  S("CosineAnnealingLR", T_max=20, eta_min=1e-4)], 45),
        run("step3_0.5_then_linear", 0.2, [S("StepLR", step_size=3, gamma=0.5),
                                           S("LinearLR", start_factor=0.5, total_iters=4)], 15),
        run("three_chained", 0.01, [S("ExponentialLR", gamma=0.95), S("StepLR", step_size=4, gamma=0.7),
                                    S("CosineAnnealingLR", T_max=9, eta_min=0.0005)], 30),
        run("cosine_resume_at_7", 0.004, [S("CosineAnnealingLR", T_max=20, eta_min=1e-4)], 30,
            resume={"initial_lr": 0.01, "last_epoch": 7}),
        run("step_and_cosine_resume_at_11", 0.002, [S("StepLR", step_size=4, gamma=0.5),
                                                    S("CosineAnnealingLR", T_max=15, eta_min=0)], 25,
            resume={"initial_lr": 0.01, "last_epoch": 11}),
    ]
    doc = {"generator": "tools/gen_lr_golden.py", "torch_version": torch.__version__,
           "python": platform.python_version(),
           "protocol": "as lr.json; 'resume': param_groups[0]['initial_lr'] set and every scheduler built with "
                       "last_epoch", "cases": cases}
    with open(out, "w") as f:
        json.dump(doc, f)
        f.write("\n")


if __name__ == "__main__":
    main()
