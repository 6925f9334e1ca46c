#!/usr/bin/python3
"""Swaps rank 0's and rank 1's local gradient bucket 0 of one step in a recording made by tools/ddpcheck_torch.py
(each rank's local buckets are in its own step archive): usage DUMP STEP. Their mean, the reduced gradient, is
unchanged, so only a rank-by-rank comparison of local gradients sees it (tests/torch_cross_check_test.cc)."""
import json, os, sys, zipfile
d, step = sys.argv[1], int(sys.argv[2])
def where(r):
    ix = json.load(open(os.path.join(d, "rank%d" % r, "index.json")))
    ref = ix["steps"][step]["buckets"][0]["local"]
    arch, _, entry = ref.partition(".npz/")
    return os.path.join(d, "rank%d" % r, arch + ".npz"), entry
def read(r):
    path, entry = where(r)
    with zipfile.ZipFile(path) as z:
        return z.read(entry)
def write(r, data):
    path, entry = where(r)
    with zipfile.ZipFile(path) as z:
        items, comment = [(i, z.read(i.filename)) for i in z.infolist()], z.comment
    with zipfile.ZipFile(path + ".new", "w", zipfile.ZIP_STORED) as out:
        out.comment = comment
        for i, b in items:
            out.writestr(i, data if i.filename == entry else b)
    os.replace(path + ".new", path)
a, b = read(0), read(1)
assert a != b
write(0, b)
write(1, a)
