#!/usr/bin/python3
"""Writes tests/golden/sampler_edge.json: DistributedSampler edge cases from torch 1.13, in the format of the
edge_cases_ok / error_cases lists of sampler.json (golden README section 1).

Run with Debian's torch only:  /usr/bin/python3 tools/gen_sampler_golden.py [out.json]

Covers what the shipped grid does not: n = 0, negative seeds (two's complement), seeds near 2^64, negative
epochs, seed + epoch crossing 0 or 2^64 or -2^63, tiny datasets with drop_last.
"""
import json
import platform
import sys

import torch
from torch.utils.data.distributed import DistributedSampler


class Dummy:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def run(n, w, rank, shuffle, seed, epoch, drop_last):
    rec = {"n": n, "num_replicas": w, "rank": rank, "shuffle": shuffle, "seed": seed, "epoch": epoch,
           "drop_last": drop_last}
    stage = "constructor"
    try:
        s = DistributedSampler(Dummy(n), num_replicas=w, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        stage = "iter"
        rec.update({"indices": list(iter(s)), "num_samples": s.num_samples, "total_size": s.total_size})
        return "ok", rec
    except Exception as e:  # noqa: BLE001
        rec.update({"error_type": type(e).__name__, "error": str(e), "raised_in": stage})
        return "error", rec


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/sampler_edge.json"
    grid = []
    for w in (1, 3):
        for drop_last in (False, True):
            grid.append((0, w, 0, True, 0, 0, drop_last))
    for seed, epoch in ((-1, 0), (-1, 1), (-1, 2), (-5, 3), (2**64 - 1, 0), (2**64 - 1, -1), (2**64 - 2, 1),
                        (0, -1), (0, -7), (3, -5), (2**63, 0), (2**63 - 1, 1), (-(2**63), 0), (-(2**63), -1),
                        (-(2**63) + 1, -1), (2**32 + 5, 0), (2**64 - 1, 1), (-1, -(2**63))):
        for rank in (0, 1):
            grid.append((7, 2, rank, True, seed, epoch, False))
    for n, w in ((1, 8), (3, 4), (5, 8), (7, 8), (9, 4), (2, 3)):
        for drop_last in (False, True):
            for rank in range(w):
                grid.append((n, w, rank, True, 11, 2, drop_last))
    grid += [(5, 2, 2, True, 0, 0, False), (5, 2, -2, True, 0, 0, False), (5, 0, -1, True, 0, 0, False),
             (5, -3, 0, True, 0, 0, False)]
    ok, errors = [], []
    for args in grid:
        kind, rec = run(*args)
        (ok if kind == "ok" else errors).append(rec)
    doc = {"generator": "tools/gen_sampler_golden.py", "torch_version": torch.__version__,
           "python": platform.python_version(),
           "source": "DistributedSampler(Dummy(n), num_replicas, rank, shuffle, seed, drop_last); set_epoch(epoch); "
                     "list(iter(s))",
           "edge_cases_ok": ok, "error_cases": errors}
    with open(out, "w") as f:
        json.dump(doc, f)
        f.write("\n")


if __name__ == "__main__":
    main()
