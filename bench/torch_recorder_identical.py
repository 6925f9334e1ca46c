#!/usr/bin/python3
"""Byte-for-byte check of what tools/ddpcheck_torch.py records: record a fixed, seeded corpus of DDP runs with the
recorder of one tools folder, then compare two such recordings tensor by tensor (names, bytes and permission bits).

    /usr/bin/python3 bench/torch_recorder_identical.py record --tools OLD_TOOLS --out /tmp/a
    /usr/bin/python3 bench/torch_recorder_identical.py record --tools tools --out /tmp/b
    /usr/bin/python3 bench/torch_recorder_identical.py compare /tmp/a /tmp/b [--ignore-reference]

Either recording may use any layout (docs/torch.md, "Dump format"): a tensor is a .npy file of its own
("s3.param.0.weight.npy"), an entry of a rank's archive ("s3.npz/s3.param.0.weight.npy") or (version 3) rank 0's
entry a rank holds bitwise ("../rank0/s3.npz/s3.param.0.weight.npy", read from rank 0's archive as this rank's
tensor), and a bucket marked "reduced_is_grads" (version 3) is compared as the reduced tensor it stands for (the
step's grads of its parameters one after another, as the .npy np.save writes, named as the recorder names a written
one); the comparison is by the tensor's .npy name inside its rank's folder, its bytes (the .npy file's, or the
archive entry's) and its permission bits (the archive's), and the index.json files are compared as JSON with each
tensor named by its .npy name (and without "version", which says the layout, and the recording's ids "run" and
"peer_run"). --ignore-reference leaves out the float64 reference tensors
that only one side recorded (reference="auto" records it only where ddpcheck's own replay does not cover the run)
and the index keys the reference sets, and counts the tensors it left out; those both recorded are compared.

The corpus: every tests/real_scripts/ script with each of its manifest cases (W=2), tools/examples/ddp_example.py
(bn, mlp, float64 linear, no set_epoch) and the overhead bench's MLP (width 32, batch 16, with and without the
float64 reference). The scripts import ddpcheck_torch from ../tools, so each is run from a scratch tree holding a
copy of --tools (examples_ddp_series.py gets a torch.manual_seed before its unseeded model). Used to check that
a change to the recorder's speed leaves its output unchanged (issue 16: identical before and after).
"""
import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PY = "/usr/bin/python3"

BENCH_RUN = r'''
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
sys.path.insert(0, sys.argv[1])
import ddpcheck_torch

def worker(rank, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for ref in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(rank)
        with ddpcheck_torch.DdpRecorder(ddp, opt, loss_fn=loss_fn, out_dir=os.path.join(out, "ref%d" % ref),
                                        reference=ref) as rec:
            for s in range(6):
                x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
                idx = torch.arange(16) + 16 * (2 * s + rank)
                opt.zero_grad(); loss = loss_fn(ddp(x), y); loss.backward(); opt.step()
                rec.step(idx, x, y, loss)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[2], sys.argv[3]), nprocs=2)
'''


def record(tools, out):
    os.makedirs(out, exist_ok=True)
    manifest = json.load(open(os.path.join(ROOT, "tests", "real_scripts", "manifest.json")))
    with tempfile.TemporaryDirectory() as tree:
        shutil.copytree(tools, os.path.join(tree, "tools"), ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(os.path.join(ROOT, "tools", "examples"), os.path.join(tree, "tools", "examples"),
                        dirs_exist_ok=True)
        shutil.copytree(os.path.join(ROOT, "tests", "real_scripts"), os.path.join(tree, "tests", "real_scripts"))
        series = os.path.join(tree, "tests", "real_scripts", "examples_ddp_series.py")
        with open(series) as f:  # its model's init is unseeded, like the example it copies: seed it here
            text = f.read()
        with open(series, "w") as f:
            f.write(text.replace("model = torch.nn.Linear(20, 1)",
                                 "torch.manual_seed(0); model = torch.nn.Linear(20, 1)"))
        runs = []
        for k, s in enumerate(manifest["scripts"]):
            cases = ",".join(["none"] + list(s["mistakes"]))
            runs.append((s["script"], [PY, os.path.join(tree, "tests", "real_scripts", s["script"]), "--out",
                                       os.path.join(out, s["script"]), "--world", "2", "--port", str(29700 + k),
                                       "--mistakes", cases]))
        example = os.path.join(tree, "tools", "examples", "ddp_example.py")
        for k, extra in enumerate((["--model", "bn"], ["--model", "mlp", "--no-set-epoch"],
                                   ["--model", "linear", "--dtype", "float64"])):
            name = "ddp_example_" + "_".join(a.strip("-") for a in extra)
            runs.append((name, [PY, example, "--out", os.path.join(out, name), "--port", str(29740 + k)] + extra))
        with open(os.path.join(tree, "bench_run.py"), "w") as f:
            f.write(BENCH_RUN)
        runs.append(("bench_mlp", [PY, os.path.join(tree, "bench_run.py"), os.path.join(tree, "tools"),
                                   os.path.join(out, "bench_mlp"), "29750"]))
        for name, cmd in runs:
            for attempt in range(3):  # gloo on a loaded box now and then aborts at exit: rerun from scratch
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
                r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                print("%-40s rc=%d" % (name, r.returncode), flush=True)
                if r.returncode == 0:
                    break
            else:
                print(r.stdout[-4000:])
                sys.exit(1)


REF_STEP_KEYS = ("ref_grads", "ref_rows", "microbatches", "autocast", "ref_loss", "ref_note")


def is_reference(name):
    """A float64 reference tensor's .npy name: s<k>.ref.<param>.npy."""
    parts = name.split(".")
    return len(parts) > 2 and parts[0][:1] == "s" and parts[0][1:].isdigit() and parts[1] == "ref"


def npy_bytes(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def as_version2(rel, ix, out):
    """The index of rank folder `rel` as version 2 writes it: another rank's entries it names become its own (their
    bytes added to `out` under its folder), a reduced_is_grads bucket a reduced tensor of its own."""
    folder = os.path.dirname(rel)

    def own(v):
        if isinstance(v, dict):
            return {k: own(x) for k, x in v.items()}
        if isinstance(v, list):
            return [own(x) for x in v]
        if isinstance(v, str) and v.startswith("../") and v.endswith(".npy"):
            peer, archive, entry = v[3:].split("/")
            bytes_, mode = out[os.path.join(peer, entry) if not folder else
                               os.path.join(os.path.dirname(folder), peer, entry)]
            out[os.path.join(folder, entry)] = (bytes_, mode)
            return archive + "/" + entry
        return v
    ix = own(ix)
    names = [p["name"] for p in ix.get("params", [])]
    for st in ix.get("steps", []):
        for k, b in enumerate(st.get("buckets") or []):
            if b.pop("reduced_is_grads", False):
                parts = [np.load(io.BytesIO(out[os.path.join(folder, st["grads"][names[i]].split("/")[-1])][0]))
                         for i in b["params"]]
                archive, entry = st["indices"].split("/")[0], "s%d.b%d.%d.reduced.npy" % (st["step"], b["index"], k)
                mode = out[os.path.join(folder, st["indices"].split("/")[-1])][1]
                out[os.path.join(folder, entry)] = (npy_bytes(np.concatenate([p.reshape(-1) for p in parts])), mode)
                b["reduced"] = archive + "/" + entry
    return ix


def tensors(root):
    """{path of the tensor's .npy name under root: (bytes, st_mode)} for every layout, and {index path: JSON}."""
    out, indexes = {}, {}
    for d, _, names in os.walk(root):
        for n in names:
            path = os.path.join(d, n)
            rel = os.path.relpath(path, root)
            mode = os.stat(path).st_mode
            if n.endswith(".npz"):
                with zipfile.ZipFile(path) as z:
                    for e in z.infolist():
                        out[os.path.join(os.path.dirname(rel), e.filename)] = (z.read(e), mode)
            elif n == "index.json":
                with open(path) as f:
                    indexes[rel] = (json.load(f), mode)
            elif n != "run.json":
                with open(path, "rb") as f:
                    out[rel] = (f.read(), mode)
    for rel, (ix, mode) in list(indexes.items()):
        indexes[rel] = (as_version2(rel, ix, out), mode)
    return out, indexes


def by_npy_name(v):
    """The index with every tensor named by its .npy name ("s3.npz/s3.x.npy" -> "s3.x.npy")."""
    if isinstance(v, dict):
        return {k: by_npy_name(x) for k, x in v.items()}
    if isinstance(v, list):
        return [by_npy_name(x) for x in v]
    if isinstance(v, str) and v.endswith(".npy") and ".npz/" in v:
        return v.split("/", 1)[1]
    return v


def without_reference(ix):
    ix = dict(ix)
    ix["steps"] = [{k: v for k, v in st.items() if k not in REF_STEP_KEYS} for st in ix.get("steps", [])]
    if isinstance(ix.get("protocol"), dict):
        ix["protocol"] = {k: v for k, v in ix["protocol"].items() if k not in ("reference", "reference_note")}
    return ix


def compare(a, b, ignore_reference=False):
    (ta, ia), (tb, ib) = tensors(a), tensors(b)
    ignored = 0
    if ignore_reference:  # a reference tensor one side has and the other does not; those both have are compared
        for p in set(ta) ^ set(tb):
            if is_reference(os.path.basename(p)):
                (ta if p in ta else tb).pop(p)
                ignored += 1
    bad = sorted(set(ta) ^ set(tb)) + sorted(set(ia) ^ set(ib))
    for p in bad[:20]:
        print("only in %s: %s" % (a if p in ta or p in ia else b, p))
    differ = [p for p in sorted(set(ta) & set(tb)) if ta[p] != tb[p]]
    for p in sorted(set(ia) & set(ib)):
        (ja, ma), (jb, mb) = ia[p], ib[p]
        ja, jb = by_npy_name(ja), by_npy_name(jb)
        for j in (ja, jb):
            for key in ("version", "run", "peer_run"):  # the layout's number; the recording's ids
                j.pop(key, None)
        if ignore_reference:
            ja, jb = without_reference(ja), without_reference(jb)
        if ja != jb or ma != mb:
            differ.append(p)
    for p in differ[:20]:
        print("differs: %s" % p)
    print("%d tensors and %d indexes compared, %d only on one side, %d differ%s"
          % (len(set(ta) & set(tb)), len(set(ia) & set(ib)), len(bad), len(differ),
             ", %d reference tensors of one side left out" % ignored if ignore_reference else ""))
    return 0 if not bad and not differ else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--tools", default=os.path.join(ROOT, "tools"), help="folder holding ddpcheck_torch*.py")
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--ignore-reference", action="store_true",
                   help="leave the float64 reference tensors and index keys out of both sides")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.tools, args.out)
    else:
        sys.exit(compare(args.a, args.b, args.ignore_reference))


if __name__ == "__main__":
    main()
