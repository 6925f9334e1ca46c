#!/usr/bin/python3
"""Writes tests/golden/randperm_extra.json: torch.randperm on the CPU generator, from torch 1.13.

Run with Debian's torch only:  /usr/bin/python3 tools/gen_randperm_golden.py [out.json]

cases: full permutations for seeds torch reads modulo 2^32 or as two's complement (negative seeds).
big:   n = 1000003 for a few seeds: first20, last20, sha256 of the int64 little-endian bytes, and
       weighted_sum = sum((i + 1) * perm[i]) mod 2^64 (a checksum a C++ test computes in one line).
"""
import hashlib
import json
import platform
import sys

import torch


def perm(n, seed):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/randperm_extra.json"
    cases = []
    for n in (0, 1, 3, 16, 17, 257):
        for seed in (5, 2**32 + 5, 2**32 - 1, 2**63, 2**64 - 1, -1, -5, 2**40 + 3):
            g = torch.Generator().manual_seed(seed)
            cases.append({"n": n, "seed": seed, "initial_seed": g.initial_seed(),
                          "perm": torch.randperm(n, generator=g).tolist()})
    big = []
    for seed in (0, 42, 2**31 - 1):
        p = perm(1000003, seed)
        vals = p.tolist()
        weighted = sum((i + 1) * v for i, v in enumerate(vals)) % 2**64
        big.append({"n": len(vals), "seed": seed, "first20": vals[:20], "last20": vals[-20:],
                    "sha256_int64_le": hashlib.sha256(p.numpy().astype("<i8").tobytes()).hexdigest(),
                    "weighted_sum": weighted})
    doc = {"generator": "tools/gen_randperm_golden.py", "torch_version": torch.__version__,
           "python": platform.python_version(),
           "source": "torch.randperm(n, generator=torch.Generator().manual_seed(seed))",
           "cases": cases, "big": big}
    with open(out, "w") as f:
        json.dump(doc, f)
        f.write("\n")


if __name__ == "__main__":
    main()
