#!/usr/bin/python3
"""Writes tests/golden/syncbn.json: what SyncBatchNorm must compute, from torch's BatchNorm1d over the GLOBAL batch.

Run with Debian's torch only:  /usr/bin/python3 tools/gen_syncbn_golden.py [out.json]

torch 1.13 on the CPU refuses SyncBatchNorm itself (it needs CUDA), but its definition (SEMANTICS.md 4.4, and
torch's test_DistributedDataParallel_SyncBatchNorm_Diff_Input_Sizes_Running_Value) is BatchNorm over the
concatenation of every rank's rows: ranks hold unequal numbers of rows (some none), and the layer must give
each rank its rows of the global batch's output and input gradient, running statistics updated with the
global mean and the unbiased variance over the global count, and weight/bias gradients that sum over ranks
to the global ones. Each case: one nn.BatchNorm1d with non-trivial weight and bias, `steps` training-mode
forwards of a fresh global batch, each split into `counts[s]` rows per rank (in rank order), then backward of
(y * dy).sum() with a fixed random dy. Recorded per step: x, dy, y, x.grad, weight.grad, bias.grad (grads
zeroed before each step), and running_mean, running_var, num_batches_tracked after it. float32 values are
written as the double equal to the float32 (Python's json writes the shortest repr of the double).
"""
import json
import platform
import sys

import torch


def make_case(name, dtype, channels, counts, momentum, affine, eps, seed, offset=0.5, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    bn = torch.nn.BatchNorm1d(channels, eps=eps, momentum=momentum, affine=affine).to(dtype)
    bn.train()
    weight = bias = None
    if affine:
        with torch.no_grad():
            bn.weight.copy_(torch.rand(channels, generator=g, dtype=torch.float64) + 0.5)
            bn.bias.copy_(torch.randn(channels, generator=g, dtype=torch.float64) * 0.1)
        weight, bias = bn.weight.tolist(), bn.bias.tolist()
    steps = []
    for step_counts in counts:
        n = sum(step_counts)
        x = (torch.randn(n, channels, generator=g, dtype=torch.float64) * scale + offset).to(dtype)
        dy = torch.randn(n, channels, generator=g, dtype=torch.float64).to(dtype)
        x.requires_grad_(True)
        if affine:
            bn.weight.grad = None
            bn.bias.grad = None
        y = bn(x)
        (y * dy).sum().backward()
        steps.append({
            "counts": step_counts,
            "x": x.detach().tolist(),
            "dy": dy.tolist(),
            "y": y.detach().tolist(),
            "dx": x.grad.tolist(),
            "dweight": bn.weight.grad.tolist() if affine else None,
            "dbias": bn.bias.grad.tolist() if affine else None,
            "running_mean": bn.running_mean.tolist(),
            "running_var": bn.running_var.tolist(),
            "num_batches_tracked": int(bn.num_batches_tracked.item()),
        })
    return {"name": name, "dtype": str(dtype).replace("torch.", ""), "channels": channels, "eps": eps,
            "momentum": momentum, "affine": affine, "weight": weight, "bias": bias, "steps": steps}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/syncbn.json"
    cases = [
        # W=3, unequal counts, one rank with a single row, one with none.
        make_case("w3_f64_momentum", torch.float64, 3, [[4, 2, 3], [5, 1, 0], [2, 6, 1]], 0.1, True, 1e-5, 0),
        # W=4, momentum=None (cumulative average), float32.
        make_case("w4_f32_cumulative", torch.float32, 4, [[3, 1, 2, 5], [4, 4, 4, 3], [1, 2, 1, 2], [6, 0, 3, 1]],
                  None, True, 1e-5, 1),
        # W=2, no affine parameters, a larger eps, float32.
        make_case("w2_f32_noaffine", torch.float32, 2, [[7, 2], [3, 3]], 0.3, False, 1e-3, 2),
        # W=5, float64, equal and unequal counts.
        make_case("w5_f64_mixed", torch.float64, 5, [[2, 2, 2, 2, 2], [3, 1, 4, 1, 5]], 0.1, True, 1e-5, 3),
    ]
    doc = {"generator": "tools/gen_syncbn_golden.py", "torch_version": torch.__version__,
           "python": platform.python_version(),
           "what": "nn.BatchNorm1d over the concatenated global batch; counts[r] rows per rank in rank order",
           "cases": cases}
    with open(out, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
