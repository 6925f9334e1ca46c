#!/usr/bin/env python3
"""Writes scenarios/faults/<NAME>.json: one scenario per BUGS.md fault that reproduces it (the model, data and
options it needs). Run from the repository root: python3 tools/gen_fault_scenarios.py"""
import copy
import json
import os

BASE = {
    "name": "",
    "description": "",
    "model": [
        {"type": "linear", "in": 8, "out": 16},
        {"type": "batchnorm1d", "features": 16},
        {"type": "relu"},
        {"type": "linear", "in": 16, "out": 16},
        {"type": "relu"},
        {"type": "linear", "in": 16, "out": 4},
    ],
    "loss": "mse",
    "init": {"kind": "seed", "seeds": [0, 1, 2, 3]},
    "data": {"kind": "regression", "samples": 64, "seed": 7},
    "world": 4,
    "batch_size": 4,
    "sampler": {"shuffle": True, "seed": 0, "drop_last": False, "set_epoch": True},
    "ddp": {"timeout_ms": 3000},
    "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0001},
    "precision": "fp64",
    "epochs": 2,
}

# name -> (fault spec, what the user did wrong, overrides)
FAULTS = {
    "skip-set-epoch": ("skip-set-epoch", "sampler.set_epoch(e) never called: epoch 1 replays epoch 0", {}),
    "sampler-seed-per-rank": ("sampler-seed-per-rank", "each rank seeds its sampler with seed + rank", {"epochs": 1}),
    "eval-padding-counted": ("eval-padding-counted", "an eval metric counts DistributedSampler's padded duplicates",
                             {"data": {"kind": "regression", "samples": 70, "seed": 7}, "epochs": 1}),
    "no-buffer-broadcast": ("no-buffer-broadcast", "broadcast_buffers=False with BatchNorm", {"epochs": 1, "steps": 4}),
    "buffer-outside-ddp": ("buffer-outside-ddp@1", "a buffer-only module outside DDP, initialised differently on rank 1",
                           {"epochs": 1, "steps": 2}),
    "no-initial-broadcast": ("no-initial-broadcast", "ranks seeded differently, initial state never broadcast",
                             {"epochs": 1, "steps": 2}),
    "bypass-ddp": ("bypass-ddp@1", "rank 1 runs forward through model.module.f(...)", {"epochs": 1, "steps": 2}),
    "unused-param": ("unused-param", "a layer's output is unused while find_unused_parameters=False",
                     {"epochs": 1, "steps": 3}),
    "nosync-unused": ("nosync-unused", "no_sync accumulation with a layer used only in the first micro-step "
                      "(find_unused_parameters=True, before PyTorch PR #124193)",
                      {"epochs": 1, "steps": 3, "ddp": {"timeout_ms": 3000, "find_unused_parameters": True, "no_sync_steps": 2},
                       "model_patch": {3: {"only_micro_step": 0}}}),
    "different-forward-path": ("different-forward-path@1", "rank 1 takes a branch the others don't (find_unused=False)",
                               {"epochs": 1, "steps": 3}),
    "scaler-state": ("scaler-state@1", "rank 1's GradScaler restored with another scale",
                     {"epochs": 1, "steps": 4, "precision": "fp32", "amp": {"enabled": True, "dtype": "fp16"}}),
    "clip-before-unscale": ("clip-before-unscale", "clip_grad_norm_ before scaler.unscale_",
                            {"epochs": 1, "steps": 4, "precision": "fp32",
                             "amp": {"enabled": True, "dtype": "fp16", "clip_grad_norm": 0.5}}),
    "skip-step": ("skip-step@1:2", "rank 1 skips optimizer.step() at step 2 on its own", {"epochs": 1, "steps": 4}),
    "uneven-batches": ("uneven-batches@1", "rank 1 has one batch fewer and leaves the loop without Join",
                       {"epochs": 1}),
    "param-order": ("param-order@1", "rank 1 registers its parameters in another order", {"epochs": 1, "steps": 2}),
    "loss-times-world": ("loss-times-world", "loss multiplied by W, thinking DDP sums gradients", {"epochs": 1, "steps": 3}),
    "grad-accum-normalisation": ("grad-accum-normalisation", "loss divided by the accumulation window, then DDP averages",
                                 {"epochs": 1, "steps": 3, "ddp": {"timeout_ms": 3000, "no_sync_steps": 2}}),
    "lr-not-scaled": ("lr-not-scaled", "W changed without the learning-rate rule the run assumes", {"epochs": 1, "steps": 3}),
    "same-dropout-seed": ("same-dropout-seed", "every rank seeds its dropout generator identically",
                          {"epochs": 1, "steps": 3, "model_insert": (5, {"type": "dropout", "p": 0.25})}),
    "drop-bucket": ("drop-bucket@1", "rank 1 skips a bucket's all-reduce", {"epochs": 1, "steps": 3}),
    "uneven-shard-mean": ("uneven-shard-mean", "ranks hold unequal sample counts: the mean of per-rank means is not "
                          "the global mean (DDP's documented semantics)",
                          {"epochs": 1, "data": {"kind": "regression", "samples": 62, "seed": 7}}),
    # 62 samples over 4 ranks: the uneven split leaves rank 0 a last batch of 4 and the others 3, so the merge's
    # weights matter at the last step; uneven_split keeps that split under --no-faults, where the count-weighted
    # merge must pass.
    "syncbn-unequal-counts": ("syncbn-unequal-counts", "SyncBatchNorm over unequal per-rank batches merged by a "
                              "plain average of the ranks' statistics instead of weighting each by its count",
                              {"epochs": 1, "data": {"kind": "regression", "samples": 62, "seed": 7},
                               "sampler": {"shuffle": True, "seed": 0, "drop_last": False, "set_epoch": True,
                                           "uneven_split": True},
                               "model_patch": {1: {"type": "syncbatchnorm1d"}}}),
}


def build(name):
    spec, what, over = FAULTS[name]
    s = copy.deepcopy(BASE)
    s["name"] = "fault-" + name
    s["description"] = f"Reproduces BUGS.md '{name}': {what}. Run with --no-faults to see the same scenario pass."
    over = dict(over)
    patch = over.pop("model_patch", {})
    insert = over.pop("model_insert", None)
    for k, v in over.items():
        s[k] = v
    for idx, fields in patch.items():
        s["model"][idx].update(fields)
    if insert:
        s["model"].insert(insert[0], insert[1])
    s["faults"] = [spec]
    return s


def main():
    out = os.path.join("scenarios", "faults")
    os.makedirs(out, exist_ok=True)
    for name in FAULTS:
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(build(name), f, indent=2)
            f.write("\n")
    print(f"wrote {len(FAULTS)} scenarios to {out}")


if __name__ == "__main__":
    main()
