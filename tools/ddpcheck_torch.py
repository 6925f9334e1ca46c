"""ddpcheck_torch: record a real PyTorch DDP training loop so `ddpcheck torch-compare` can check and replay it.

Needs only torch and numpy (where Debian's libisal2 is installed, its CRC-32 checksums the archives faster).
Format: docs/torch.md. Usage, in each rank's process:

    import ddpcheck_torch
    local = ddpcheck_torch.snapshot(model)               # optional: this rank's init before DDP
    ddp = DistributedDataParallel(model, ...)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    with ddpcheck_torch.DdpRecorder(ddp, opt, sampler=sampler, loss_fn=nn.MSELoss(), out_dir="dump",
                                    schedulers=[sched], local_init=local) as rec:
        rec.set_dataset(X, Y)                            # optional: else rebuilt from the recorded batches
        for epoch in range(E):
            sampler.set_epoch(epoch)
            for xb, yb, idx in loader:
                opt.zero_grad(); loss = loss_fn(ddp(xb), yb); loss.backward(); opt.step()
                rec.step(idx, xb, yb, loss)              # after optimizer.step()
            sched.step()

Any nn.Module is recorded for the protocol check (its DDP hooks and the float64 reference live in
ddpcheck_torch_protocol.py); the models describe_model knows are also replayed. (This file is about 760 lines:
it is the one module users import, holding the recorder, its archive writer and the replay's description of the
run.)

Each rank writes OUT_DIR/rank<r>/index.json plus one archive per step (s<k>.npz: an uncompressed zip of .npy
files, np.load reads it) and init.npz, dataset.npz. An exception inside the `with` block is recorded in the index
("error") before it propagates, so a rank that failed (a collective timeout) still leaves a dump. A step's archive
is written by a background thread from the recorder's own copies (close() waits for it; a failed write is raised
by a later rec.step() or by close(), and recorded like an error at the step it belongs to).
"""
import collections
import io
import errno
import json
import math
import mmap
import os
import struct
import sys
import threading
import time
import zlib

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddpcheck_torch_protocol as _protocol  # noqa: E402

FORMAT = "ddpcheck-torch-dump"
# 3: a rank's tensor may be another rank's archive entry ("../rank0/s3.npz/s3.param.0.weight.npy", bitwise what this
# rank held) and a bucket's reduced gradient the step's grads ("reduced_is_grads"); 2: the tensors in per-step
# archives; 1: one .npy file per tensor. ddpcheck reads all three.
VERSION = 3
# An archive (a stored zip without zip64, docs/torch.md) stays below 4 GiB; a tensor that would take it past
# this is written as a .npy file of its own (the index names each tensor's file, so both layouts mix).
ARCHIVE_LIMIT = (1 << 32) - (1 << 24)
# How long a rank's writer waits for rank 0's archive of the same step (to name rank 0's entries it holds bitwise
# instead of writing them again) before it writes its own and stops looking (rank 0 on another host).
PEER_WAIT_S = 10.0
# Direct (O_DIRECT) writes go through an aligned staging buffer of this size, in blocks of _ALIGN bytes.
STAGE = 8 << 20
_ALIGN = 4096


def _flat(t):
    """A tensor's elements, dense, contiguous and flat (a copy only where it is not already)."""
    t = t.detach()
    return (t.to_dense() if t.layout != torch.strided else t).reshape(-1).contiguous()


def _raw_bytes(t):
    """A tensor's bytes as a flat uint8 numpy array."""
    return _flat(t).cpu().view(torch.uint8).numpy()


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _device_hash(t):
    """A checksum of a tensor's bits computed where it lives (a CUDA parameter is not copied to the host three times
    a step): the int64 sum of its elements read as integers of their size. Any one element's change changes it;
    changes that cancel are left to chance, which a checkpoint load or weight clipping does not play."""
    flat = _flat(t)
    as_int = torch.uint8 if flat.dtype == torch.bool else _INT_OF_SIZE.get(flat.element_size(), torch.uint8)
    return int(flat.view(as_int).sum(dtype=torch.int64))


def _tensor_digest(t):
    """A tensor's checksum as text: the CRC-32 of its bytes on the CPU, its _device_hash elsewhere."""
    return "%08x" % _crc32(_raw_bytes(t)) if t.device.type == "cpu" else "sum %x" % _device_hash(t)


def _isal_crc32():
    """ISA-L's CRC-32 (libisal.so.2, Debian's libisal2: the zip/zlib polynomial with carry-less multiplies, about
    ten times zlib's speed here) as f(crc, address, size), or None where the library is absent."""
    try:
        import ctypes
        f = ctypes.CDLL("libisal.so.2").crc32_gzip_refl
    except (OSError, AttributeError, ImportError):
        return None
    f.restype, f.argtypes = ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64]
    return f if f(0, b"123456789", 9) == zlib.crc32(b"123456789") else None  # the zip CRC, or not used


_ISAL_CRC32 = _isal_crc32()


def _crc32(piece, crc=0):
    """zlib.crc32(piece, crc) of bytes or a contiguous numpy array (ISA-L's for arrays where it is installed; the
    call releases the GIL either way)."""
    if _ISAL_CRC32 is not None and isinstance(piece, np.ndarray) and piece.nbytes >= 4096:
        return _ISAL_CRC32(crc, piece.ctypes.data, piece.nbytes)
    return zlib.crc32(piece, crc)

_SCHEDULERS = {
    "StepLR": ("step", {"step_size": "step_size", "gamma": "gamma"}),
    "MultiStepLR": ("multistep", {"milestones": "milestones", "gamma": "gamma"}),
    "ExponentialLR": ("exponential", {"gamma": "gamma"}),
    "CosineAnnealingLR": ("cosine", {"T_max": "t_max", "eta_min": "eta_min"}),
    "LinearLR": ("linear", {"start_factor": "start_factor", "end_factor": "end_factor",
                            "total_iters": "total_iters"}),
}


class UnsupportedModel(ValueError):
    """The model uses a module ddpcheck cannot replay (it is then recorded for the protocol check only)."""


UnsupportedDtype = _protocol.UnsupportedDtype


def _layer(i, m):
    if isinstance(m, nn.Linear):
        return {"type": "linear", "in": m.in_features, "out": m.out_features, "bias": m.bias is not None}
    if isinstance(m, nn.ReLU):
        return {"type": "relu"}
    if isinstance(m, nn.Tanh):
        return {"type": "tanh"}
    if isinstance(m, nn.Dropout):
        return {"type": "dropout", "p": float(m.p)}
    if isinstance(m, nn.SyncBatchNorm):
        raise UnsupportedModel(
            "module %d is nn.SyncBatchNorm, which ddpcheck cannot record or replay from torch: torch 1.13 runs "
            "SyncBatchNorm only on CUDA (DDP raises 'SyncBatchNorm layers only work with GPU modules' on CPU) and "
            "torch-compare replays CPU dumps; check the model with `ddpcheck run` on a scenario with a "
            "\"syncbatchnorm1d\" layer instead (docs/scenario.md)" % i)
    if isinstance(m, nn.BatchNorm1d):
        return {"type": "batchnorm1d", "features": m.num_features, "eps": float(m.eps),
                "momentum": None if m.momentum is None else float(m.momentum), "affine": bool(m.affine),
                "track_running_stats": bool(m.track_running_stats)}
    raise UnsupportedModel(
        "ddpcheck cannot replay module %d (%s); supported: nn.Linear, nn.ReLU, nn.Tanh, nn.BatchNorm1d, "
        "nn.Dropout inside nn.Sequential, or a bare nn.Linear" % (i, type(m).__name__))


def describe_model(module):
    """The model as ddpcheck layers, and the map torch state name -> ddpcheck name ("weight" -> "0.weight")."""
    if isinstance(module, nn.Linear):
        return [_layer(0, module)], lambda n: "0." + n
    if not isinstance(module, nn.Sequential):
        raise UnsupportedModel("ddpcheck cannot replay a %s; wrap supported layers in nn.Sequential"
                               % type(module).__name__)
    return [_layer(i, m) for i, m in enumerate(module)], lambda n: n


def describe_loss(loss_fn):
    if isinstance(loss_fn, str):
        return loss_fn
    if loss_fn is nn.functional.mse_loss:
        return "mse"
    if loss_fn is nn.functional.cross_entropy:
        return "cross_entropy"
    if getattr(loss_fn, "reduction", "mean") != "mean":
        raise UnsupportedModel("ddpcheck replays losses with reduction='mean' only")
    if isinstance(loss_fn, nn.MSELoss):
        return "mse"
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        if loss_fn.weight is not None or loss_fn.ignore_index != -100 or loss_fn.label_smoothing != 0:
            raise UnsupportedModel("the replay's cross_entropy has no weight, ignore_index or label_smoothing")
        return "cross_entropy"
    raise UnsupportedModel("unsupported loss %s; use nn.MSELoss or nn.CrossEntropyLoss" % type(loss_fn).__name__)


def snapshot(model):
    """A detached copy of the model's parameters and buffers (call before wrapping in DDP)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _optimizer(opt):
    if len(opt.param_groups) != 1:
        raise UnsupportedModel("ddpcheck replays one optimizer param group, got %d" % len(opt.param_groups))
    g = opt.param_groups[0]
    kind = type(opt).__name__.lower()
    # The base lr: a scheduler built before the recorder has already applied its first factor to g["lr"]
    # (LinearLR's start_factor) and kept the base as initial_lr; the replay applies the schedule from the base.
    lr = g.get("initial_lr", g["lr"])
    if kind == "sgd":
        return {"type": "sgd", "lr": lr, "momentum": g["momentum"], "dampening": g["dampening"],
                "weight_decay": g["weight_decay"], "nesterov": g["nesterov"], "maximize": g.get("maximize", False)}
    if kind in ("adam", "adamw"):
        if g.get("amsgrad"):
            raise UnsupportedModel("ddpcheck does not replay amsgrad")
        return {"type": kind, "lr": lr, "betas": list(g["betas"]), "eps": g["eps"],
                "weight_decay": g["weight_decay"], "maximize": g.get("maximize", False)}
    raise UnsupportedModel("unsupported optimizer %s; use SGD, Adam or AdamW" % type(opt).__name__)


_GROUP_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "betas", "eps", "amsgrad",
               "alpha", "centered", "rho", "lr_decay", "initial_accumulator_value", "initial_lr")


def _param_groups(opt, index):
    """Every param group: its hyper-parameters and its parameters as indices in DDP's order."""
    out = []
    for g in opt.param_groups:
        d = {k: (list(g[k]) if k == "betas" else g[k]) for k in _GROUP_KEYS if k in g}
        d["params"] = [index.get(id(p), -1) for p in g["params"]]
        out.append(d)
    return out


def _scheduler(s):
    name = type(s).__name__
    if name not in _SCHEDULERS:
        raise UnsupportedModel("unsupported scheduler %s; supported: %s" % (name, ", ".join(sorted(_SCHEDULERS))))
    kind, keys = _SCHEDULERS[name]
    out = {"type": kind}
    for attr, key in keys.items():
        v = getattr(s, attr)
        v = sorted(v.elements()) if attr == "milestones" else v
        if key in ("step_size", "t_max", "total_iters", "milestones"):  # counts of steps: torch takes 1.0 for 1
            whole = [x for x in (v if isinstance(v, list) else [v]) if float(x) == int(x)]
            if len(whole) != (len(v) if isinstance(v, list) else 1):
                raise UnsupportedModel("%s %s=%r is not a whole number of steps" % (name, attr, v))
            v = [int(x) for x in v] if isinstance(v, list) else int(v)
        out[key] = v
    return out


class _Writer:
    """Writes the recorder's files on a background thread, so a step does not wait on the file system.
    put() hands over a batch: an archive path and the (entry name, array) pairs it holds, plus (path, array)
    pairs written as .npy files of their own, arrays nobody changes any more (the recorder's own copies), with the
    step they belong to and what to call once they are written (`done`, on the writer thread); at most `limit`
    bytes wait to be written (put blocks beyond that). The first failed write is kept in `failure` as
    (step, exception) and raised by the next put(); close() writes what is left, joins the thread and raises
    nothing (the recorder decides). An archive is an uncompressed zip (np.load reads it as an .npz): each entry
    is byte for byte the .npy file np.save writes, and the whole archive goes out in one writev per 1024 pieces
    (headers and the arrays' own memory, nothing copied). A C-contiguous array is its .npy header (made once per
    dtype and shape by numpy's own writer) followed by its memory; anything else is np.save's bytes.

    run: this recording's id, the comment of every archive ("ddpcheck-run <id>"). peer (rank r > 0): (rank 0's
    folder, its name from this rank's folder, the time this recorder started). An entry the batch marks shared (a
    tensor DDP keeps equal on every rank: parameters, gradients, optimizer state, broadcast buffers) whose bytes have
    the size and CRC-32 of rank 0's entry of that name (rank 0's archive of the same name, its central directory
    only) is not written again (_dedupe): `aliases` maps "<archive>/<entry>" to
    "../rank0/<archive>/<entry>" (the recorder renames it in the index) and `peer_run` is rank 0's run id. Rank 0's
    run id is read from its run.json (written when its recorder started, before its first step, so before this
    rank's first step's archive is written; an older one is ignored), and only a complete archive of that run is
    named (its end record read, its comment that run's): a dump an earlier run left in the folder never is, and
    ddpcheck checks the id against rank 0's index. The writer waits for rank 0's archive up to PEER_WAIT_S (less
    once rank 0's index is written), then writes everything itself from then on (rank 0 on another machine)."""

    def __init__(self, limit=256 << 20, run="", peer=None):
        self._cv = threading.Condition()
        self._queue = collections.deque()  # (batch, step, done, bytes)
        self._pending = 0  # bytes queued or being written
        self._limit = limit
        self._closing = False
        self._thread = None
        self._headers = {}
        self.failure = None  # (step, exception) of the first failed write
        self.raised = False  # whether put() raised it
        self._comment = ("ddpcheck-run " + run).encode("ascii")
        self._peer = peer
        self.peer_run = None  # rank 0's run id, once read
        self._stage = None  # the aligned staging buffer of direct writes
        self._direct_dirs = {}  # folder -> whether its files are written past the page cache
        self.aliases = {}  # "<archive>/<entry>" -> "../rank0/<archive>/<entry>" (written by the writer thread)

    @staticmethod
    def _bytes(batch):
        return sum(a.nbytes for _, a in batch[1]) + sum(a.nbytes for _, a in batch[2])

    def put(self, batch, step, done=None):
        size = self._bytes(batch)
        with self._cv:
            self._raise()
            while self._pending and self._pending + size > self._limit:
                self._cv.wait()
                self._raise()
            if not batch[1] and not batch[2]:
                return
            self._start()
            self._queue.append((batch, step, done, size))
            self._pending += size
            self._cv.notify_all()

    def close(self, batch, step):
        """Writes `batch` and whatever is queued, then joins the thread."""
        with self._cv:
            if batch[1] or batch[2]:
                self._queue.append((batch, step, None, 0))
            if self._queue:
                self._start()
            self._closing = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cv:
            self._thread, self._closing = None, False

    def _start(self):
        """Starts the writer thread unless it runs (self._cv held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ddpcheck-writer", daemon=True)
            self._thread.start()

    def _raise(self):
        if self.failure is not None and not self.raised:
            self.raised = True
            raise self.failure[1]

    def _run(self):
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                (archive, entries, files, shared), step, done, size = self._queue[0]
            try:
                crcs = None
                if shared and self._peer is not None:
                    try:
                        entries, crcs = self._dedupe(archive, entries, shared)
                    except Exception:  # noqa: BLE001 - naming rank 0's entries is an optimisation: write them all
                        self._peer, self.aliases = None, {k: v for k, v in self.aliases.items()
                                                          if not k.startswith(os.path.basename(archive) + "/")}
                if entries:
                    self._write(archive, self._zip(entries, crcs))
                for path, array in files:
                    self._write(path, self._npy(array))
            except BaseException as e:  # noqa: BLE001 - handed to the recording thread
                with self._cv:
                    self.failure = self.failure or (step, e)
            else:
                if done is not None:
                    done()
            with self._cv:
                self._queue.popleft()
                self._pending -= size
                self._cv.notify_all()

    def _dedupe(self, archive, entries, shared):
        """(the entries left to write, {entry: CRC-32} computed on the way): an entry DDP keeps equal on every rank
        whose .npy bytes have the size and CRC-32 of rank 0's entry of that name in rank 0's archive of the same
        name is named there instead (a tensor that differs from rank 0's in any way a run shows, one bit, one
        element, a burst of up to 32 bits, changes the CRC; two different tensors share it with probability 2^-32).
        Rank 0's archive is not read, only its central directory (the CRC and size of each entry)."""
        base = os.path.basename(archive)
        found = self._peer_archive(os.path.join(self._peer[0], base))
        if found is None:
            return entries, None
        keep, crcs = [], {}
        for name, a in entries:
            theirs = found.get(name) if name in shared else None
            if theirs is not None:
                pieces = self._npy(a)
                if sum(len(d) if isinstance(d, bytes) else d.nbytes for d in pieces) == theirs[1]:
                    crcs[name] = self._crc(pieces)
                    if crcs[name] == theirs[0]:
                        self.aliases[base + "/" + name] = "%s/%s/%s" % (self._peer[1], base, name)
                        continue
            keep.append((name, a))
        return keep, crcs

    def _peer_archive(self, path):
        """{entry: (CRC-32, size)} of rank 0's complete archive `path` of rank 0's run (its central directory),
        waiting for it up to PEER_WAIT_S (then None, and no archive of rank 0 is looked for again; at once when rank
        0's folder holds no run.json of this recording)."""
        deadline = time.monotonic() + PEER_WAIT_S
        pause = 0.0005
        folder, _, started = self._peer
        if self.peer_run is None:
            # Rank 0's recorder wrote run.json before its first step, so before this rank's first archive comes
            # here: none (or one of an earlier run) means rank 0 writes elsewhere (another machine or folder).
            try:
                run = os.path.join(folder, "run.json")
                if os.stat(run).st_mtime >= started - 60:
                    with open(run) as f:
                        self.peer_run = str(json.load(f)["run"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
            if self.peer_run is None:
                self._peer = None
                return None
        while True:
            try:
                if os.path.exists(path):
                    found = _zip_directory(path)
                    if found is not None and found[0] == b"ddpcheck-run " + self.peer_run.encode("ascii"):
                        return found[1]  # (an archive of an earlier run is waited past: rank 0 rewrites it)
                index = os.path.join(folder, "index.json")
                if os.path.exists(index) and os.stat(index).st_mtime >= started:
                    deadline = min(deadline, time.monotonic() + 0.05)  # rank 0 closed: it will not come
            except (OSError, ValueError, KeyError, UnicodeError):
                pass
            if time.monotonic() > deadline:
                self._peer = None
                return None
            time.sleep(pause)
            pause = min(2 * pause, 0.01)

    def _buffer(self, attr, size):
        """A page-aligned buffer of at least `size` bytes (an anonymous mapping), kept in self.<attr> and reused."""
        buf = getattr(self, attr)
        if buf is None or len(buf) < size:
            buf = mmap.mmap(-1, max(size, 2 * len(buf) if buf is not None else 0))
            setattr(self, attr, buf)
        return memoryview(buf)[:size]

    def _direct_ok(self, folder):
        """Whether files in `folder` are written and read past the page cache (O_DIRECT): on Linux, on a local
        disk file system (ext4, xfs, btrfs), where copying every page into the page cache and flushing it later
        costs the training's cores more than the device's own transfer (tmpfs is its page cache: never)."""
        if folder not in self._direct_dirs:
            self._direct_dirs[folder] = _direct_fs(folder)
        return self._direct_dirs[folder]

    def _npy(self, a):
        """The bytes np.save writes for a, as pieces: [header, memory] or [np.save's bytes]."""
        if not a.flags.c_contiguous or a.dtype.hasobject or a.dtype.fields is not None:
            buf = io.BytesIO()
            np.save(buf, a)
            return [buf.getvalue()]
        key = (a.dtype, a.shape)
        header = self._headers.get(key)
        if header is None:
            buf = io.BytesIO()
            np.lib.format.write_array(buf, a, allow_pickle=False)
            header = self._headers[key] = buf.getvalue()[:buf.tell() - a.nbytes]
        return [header, a.reshape(-1).view(np.uint8)]

    def _crc(self, pieces):
        crc = 0
        for d in pieces:
            crc = _crc32(d, crc)
        return crc

    def _zip(self, entries, crcs=None):
        """A stored (uncompressed) zip of the entries, as pieces: each entry's local header and .npy bytes, then the
        central directory and its end record. Fixed timestamps (1980-01-01), so equal tensors give equal bytes;
        no zip64: the recorder keeps an archive under 4 GiB and 65535 entries (ARCHIVE_LIMIT). crcs: {entry: its
        CRC-32} already computed."""
        pieces, central, offset = [], [], 0
        for name, a in entries:
            data = self._npy(a)
            size = sum(len(d) if isinstance(d, bytes) else d.nbytes for d in data)
            crc = crcs.get(name) if crcs else None
            if crc is None:
                crc = self._crc(data)
            raw = name.encode("utf-8")
            flags = 0 if raw.isascii() else 0x800  # bit 11: the name is UTF-8
            pieces.append(_ZIP_LOCAL.pack(0x04034B50, 20, flags, 0, 0, _ZIP_DATE, crc, size, size, len(raw), 0) + raw)
            pieces.extend(data)
            central.append(_ZIP_CENTRAL.pack(0x02014B50, 0x0314, 20, flags, 0, 0, _ZIP_DATE, crc, size, size, len(raw),
                                              0, 0, 0, 0, 0o100644 << 16, offset) + raw)
            offset += len(pieces[-1 - len(data)]) + size
        directory = b"".join(central)
        pieces.append(directory + _ZIP_END.pack(0x06054B50, 0, 0, len(entries), len(entries), len(directory), offset,
                                                len(self._comment)) + self._comment)
        return pieces

    def _write(self, path, pieces):
        """Writes the pieces as the file `path`: past the page cache (O_DIRECT, through an aligned staging buffer of
        STAGE bytes, the tail padded to the block and the file cut back to its size) on a local disk file system
        (_direct_ok) for a file of at least 64 KiB, else in one writev per 1024 pieces."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)
        folder = os.path.dirname(path)
        if size >= (64 << 10) and self._direct_ok(folder):
            try:
                fd = os.open(path, flags | os.O_DIRECT, 0o666)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._direct_dirs[folder] = False
            else:
                try:
                    self._write_direct(fd, pieces, size)
                    return
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    self._direct_dirs[folder] = False  # the file system refused the alignment: written again below
                finally:
                    os.close(fd)
        fd = os.open(path, flags, 0o666)
        try:
            views = [v for v in (memoryview(p).cast("B") for p in pieces) if len(v)]
            while views:
                chunk = views[:1024]  # IOV_MAX
                done = os.writev(fd, chunk) if hasattr(os, "writev") else os.write(fd, chunk[0])
                if done <= 0:
                    raise OSError("writing %s: the file system took no bytes" % path)
                while done:  # drop what was written; a short write resumes inside a piece
                    if done >= len(views[0]):
                        done -= len(views[0])
                        views.pop(0)
                    else:
                        views[0] = views[0][done:]
                        done = 0
        finally:
            os.close(fd)

    def _write_direct(self, fd, pieces, size):
        stage = self._buffer("_stage", STAGE)
        fill = 0
        for p in pieces:
            view = memoryview(p).cast("B")
            at = 0
            while at < len(view):
                n = min(len(view) - at, STAGE - fill)
                stage[fill:fill + n] = view[at:at + n]
                fill, at = fill + n, at + n
                if fill == STAGE:
                    self._write_all(fd, stage)
                    fill = 0
        if fill:
            padded = -(-fill // _ALIGN) * _ALIGN
            stage[fill:padded] = bytes(padded - fill)
            self._write_all(fd, stage[:padded])
        os.ftruncate(fd, size)

    @staticmethod
    def _write_all(fd, view):
        while len(view):
            done = os.write(fd, view)
            if done <= 0:
                raise OSError("the file system took no bytes")
            view = view[done:]


# Words in the names of DDP communication hooks that round or approximate the all-reduce (torch's default_hooks
# fp16/bf16 compression and its wrappers, PowerSGD, quantization): such a run is checked by protocol, not replayed.
COMPRESSING_HOOKS = ("fp16", "bf16", "compress", "powersgd", "quantiz")


class _Rows:
    """The latest row of every dataset index the batches showed (the dataset rebuilt when set_dataset was not
    called), in index arrays: a batch is copied once and kept while a row of it is the latest of its index."""

    def __init__(self, what):
        self.what = what  # "xb" or "yb": rec.step()'s argument, for the note
        self._bid = np.full(0, -1, np.int64)  # dataset row -> id of the batch holding its latest value (-1: none)
        self._pos = np.zeros(0, np.int64)  # dataset row -> its row in that batch
        self._batches = {}  # batch id -> [the batch's copy, how many of its rows are the latest of their index]
        self.first = None  # the first dataset row seen (its batch gives the rows' shape and dtype)
        self.note = None  # why the rows are not kept (then nothing more is): not one tensor of rows of one shape
        # rows drawn again by a later batch, and of them those whose value changed (augmentation, sampled actions):
        # a rank's rows are its dataset's only where none changed
        self.redrawn = 0
        self.changed = 0

    def _unusable(self, batch, rows):
        """Why `batch` cannot be kept as the rows `rows` of one dataset tensor, or None."""
        if not (torch.is_tensor(batch) or isinstance(batch, np.ndarray)):
            return "rec.step()'s %s is a %s, not one tensor of rows" % (self.what, type(batch).__name__)
        shape = tuple(batch.shape)
        if not shape or shape[0] != rows.size:
            return "rec.step()'s %s has shape %s, not one row per batch index (%d)" % (self.what, shape, rows.size)
        if self._batches:
            first = next(iter(self._batches.values()))[0]
            if tuple(first.shape[1:]) != shape[1:] or first.dtype != torch.as_tensor(batch).dtype:
                return ("rec.step()'s %s rows changed from shape %s, %s to %s, %s between batches (padded to each "
                        "batch's length?)" % (self.what, tuple(first.shape[1:]), first.dtype, shape[1:],
                                              torch.as_tensor(batch).dtype))
        return None

    def put(self, bid, rows, batch):
        """rows: the batch's dataset rows (non-negative int64 array), in order; a later row of an index wins. A batch
        that is not one tensor of rows of the shape and dtype of the first (a tuple of inputs, text padded per
        batch) sets `note` and drops what was kept: the dataset is then not recorded, never an exception."""
        if self.note is not None:
            return
        self.note = self._unusable(batch, rows)
        if self.note is not None:
            self._batches.clear()
            self.first = None
            return
        if rows.max() >= self._bid.size:
            grow = max(int(rows.max()) + 1, 2 * self._bid.size) - self._bid.size
            self._bid = np.concatenate([self._bid, np.full(grow, -1, np.int64)])
            self._pos = np.concatenate([self._pos, np.zeros(grow, np.int64)])
        if self.first is None:
            self.first = int(rows[0])
        copy = torch.as_tensor(batch).detach().clone()
        again = np.nonzero(self._bid[rows] >= 0)[0]
        if again.size:  # rows an earlier batch showed: the same values, or the data changes from draw to draw
            before = torch.stack([self._batches[int(self._bid[rows[j]])][0][int(self._pos[rows[j]])] for j in again])
            differ = (before != copy[torch.from_numpy(again)]).reshape(again.size, -1).any(1)
            self.redrawn += int(again.size)
            self.changed += int(differ.sum())
        unique = np.unique(rows).size == rows.size
        if unique:  # the common case: one pass, and only the batches it takes rows from are looked at
            old = self._bid[rows]
            if old.max() >= 0:
                for b, c in zip(*np.unique(old[old >= 0], return_counts=True)):
                    entry = self._batches[int(b)]
                    entry[1] -= int(c)
                    if entry[1] == 0:
                        del self._batches[int(b)]
            self._batches[bid] = [copy, rows.size]
            self._bid[rows] = bid
            self._pos[rows] = np.arange(rows.size)
            return
        self._batches[bid] = [copy, 0]
        for part in [rows[j:j + 1] for j in range(rows.size)]:  # repeats: one at a time
            old = self._bid[part]
            for b, c in zip(*np.unique(old[old >= 0], return_counts=True)):
                self._batches[int(b)][1] -= int(c)
            self._bid[part] = bid
            self._batches[bid][1] += part.size
        for j, i in enumerate(rows.tolist()):
            self._pos[i] = j
        for b in [b for b, e in self._batches.items() if e[1] == 0]:
            del self._batches[b]

    def seen(self):
        """The dataset rows seen, ascending."""
        return np.nonzero(self._bid >= 0)[0]

    def tensor(self, n):
        """(n, *row shape) zeros holding every row seen; the row shape and dtype are the first seen row's batch's."""
        first = self._batches[int(self._bid[self.first])][0]
        out = torch.zeros((n,) + tuple(first.shape[1:]), dtype=first.dtype)
        rows = self.seen()
        for bid, (batch, _) in self._batches.items():
            mine = rows[self._bid[rows] == bid]
            out[torch.from_numpy(mine)] = batch[torch.from_numpy(self._pos[mine])].to(out.dtype)
        return out


_ZIP_LOCAL = struct.Struct("<IHHHHHIIIHH")
_ZIP_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_ZIP_END = struct.Struct("<IHHHHIIH")
_ZIP_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest date a zip holds


def _zip_directory(path):
    """(comment, {entry name: (CRC-32, size)}) of the file `path`, a stored zip as _Writer._zip writes it (a comment
    of at most 64 bytes, no zip64), read from its end (its central directory and end record only), or None when it
    is not (yet) one: the end record is written last, and a direct write's padding is cut off after it."""
    with open(path, "rb", buffering=0) as f:
        def read(n, at):
            f.seek(at)
            return f.read(n)
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - (64 << 10))
        tail = read(size - start, start)
        at = tail.rfind(b"PK\x05\x06", max(0, len(tail) - _ZIP_END.size - 64))
        if at < 0 or at + _ZIP_END.size > len(tail):
            return None
        sig, _, _, _, count, cd_size, cd_offset, comment_len = _ZIP_END.unpack_from(tail, at)
        end = start + at
        if at + _ZIP_END.size + comment_len != len(tail) or cd_offset + cd_size != end:
            return None
        comment = tail[at + _ZIP_END.size:]
        if cd_offset >= start:
            directory = tail[cd_offset - start:at]
        else:
            directory = read(cd_size, cd_offset)
            if len(directory) != cd_size:
                return None
    out, at = {}, 0
    for _ in range(count):
        if at + _ZIP_CENTRAL.size > len(directory):
            return None
        fields = _ZIP_CENTRAL.unpack_from(directory, at)
        method, crc, size, stored, name_len, extra_len, comment_len, local = (
            fields[4], fields[7], fields[8], fields[9], fields[10], fields[11], fields[12], fields[16])
        if fields[0] != 0x02014B50 or method != 0 or size != stored or extra_len or comment_len:
            return None
        name = directory[at + _ZIP_CENTRAL.size:at + _ZIP_CENTRAL.size + name_len].decode("utf-8")
        if local + _ZIP_LOCAL.size + name_len + size > cd_offset:
            return None
        out[name] = (crc, size)
        at += _ZIP_CENTRAL.size + name_len
    return comment, out


_DIRECT_FS = ("ext2", "ext3", "ext4", "xfs", "btrfs")


def _direct_fs(folder):
    """Whether `folder` lies on a local disk file system that O_DIRECT writes past the page cache (Linux)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "O_DIRECT"):
        return False
    path, best, kind = os.path.realpath(folder), "", None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return False
    return kind in _DIRECT_FS


def _renamed(v, names):
    """v (the steps' records) with every tensor name in `names` replaced by its value."""
    if isinstance(v, dict):
        return {k: _renamed(x, names) for k, x in v.items()}
    if isinstance(v, list):
        return [_renamed(x, names) for x in v]
    return names.get(v, v) if isinstance(v, str) else v


# Why a run whose optimizer.step saw gradients other than DDP's reduced ones is checked by protocol only.
CHANGED_GRADS = ("the gradients optimizer.step saw are not DDP's reduced gradients (changed between the backward and "
                 "optimizer.step, e.g. by clip_grad_norm_); the replay steps on the reduced ones")

# Why a run that all-reduced a bucket more than once in a step (a synced backward per micro-batch) is not replayed.
SEVERAL_REDUCTIONS = ("a bucket was all-reduced more than once between two optimizer steps (several synced backwards "
                      "per step); the replay models one backward per step, or micro-batches under no_sync()")

# The note of a step reference="auto" leaves to ddpcheck's replay (core/dump_protocol.h, kAutoReferenceNote).
AUTO_NOTE = ("reference='auto': not recomputed, the run is replayed: ddpcheck's own float64 replay is its "
             "single-process reference")


_TAPS = _protocol._TAPS  # the objects whose methods the recorder taps (tests look at it)
_OPEN_DIRS = set()  # the rank folders open recorders write into (one recorder per folder)
_tap = _protocol.tap


def _fresh_counts():
    """A step's counts of forwards: through DDP, of the module, under autocast, and each training forward's record."""
    return {"ddp": 0, "module": 0, "autocast": 0, "fwds": [], "in_step": 0}


def _first_grad_tensor(x, depth=0):
    """The first tensor requiring grad in a module's output (a tensor, or one inside a tuple, list or dict)."""
    if torch.is_tensor(x):
        return x if x.requires_grad else None
    if depth > 3:
        return None
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    for v in items:
        t = _first_grad_tensor(v, depth + 1)
        if t is not None:
            return t
    return None


def _autocast_enabled():
    """Whether a forward now runs under torch.autocast (CPU or CUDA)."""
    return bool(torch.is_autocast_enabled() or getattr(torch, "is_autocast_cpu_enabled", lambda: False)())


def _ddp_registered(ddp):
    """ids of the parameters DDP put in its buckets when it was built (those that required grad then: a backbone
    frozen after DDP(...) but before the recorder is still DDP's), or None where the reducer does not say (not DDP,
    another torch) or need not be asked (every parameter requires grad now: asking allocates the buckets' size of
    zeros, on the parameters' device)."""
    reducer = getattr(ddp, "reducer", None)
    if reducer is None or all(q.requires_grad for q in ddp.parameters()):
        return None
    try:
        buckets = reducer._get_zeros_like_grad_buckets()
    except Exception:  # noqa: BLE001 - not a DDP of this torch: the recorder's requires_grad stands
        return None
    return {id(q) for b in buckets for q in b.parameters()}


class DdpRecorder:
    """Records one rank of a DDP run. Construct right after DDP (params are then post-broadcast), before the first
    forward. Any nn.Module is recorded for the protocol check; the models describe_model knows are also replayed.

    reference: the float64 single-process reference (one more forward and backward per micro-batch, in float64).
    "auto" (the default) computes it where ddpcheck cannot replay the run (a module, loss, optimizer or scheduler
    cadence it does not replay, Dropout(p > 0), several micro-batches per step, no sampler or batch indices) and
    for autocast and GradScaler runs (replayed too, but kept safe); for a replayed run ddpcheck's replay is the
    reference. A step is decided at the next one
    (a scheduler stepped per iteration shows only then): the reference of the step before is computed then, and
    once one step needs it every later step has it. True: every step; False: none."""

    def __init__(self, ddp_model, optimizer, sampler=None, loss_fn="mse", out_dir="ddpcheck_dump", scaler=None,
                 schedulers=(), local_init=None, batch_size=None, reference="auto"):
        import torch.distributed as dist
        if reference not in (True, False, "auto"):
            raise ValueError("reference must be True, False or 'auto', got %r" % (reference,))
        self.ddp = ddp_model
        self.module = getattr(ddp_model, "module", ddp_model)
        _protocol.check_dtypes(self.module)
        self.opt = optimizer
        self.sampler = sampler
        self.scaler = scaler
        self.schedulers = list(schedulers)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.dir = os.path.join(out_dir, "rank%d" % self.rank)
        key = os.path.realpath(self.dir)
        if key in _OPEN_DIRS:
            # one recording per folder: a second recorder (the generator's beside the discriminator's) would write
            # over the first's files and index
            raise ValueError("DdpRecorder: out_dir %r is already being recorded into by another DdpRecorder in this "
                             "process; give each recorder its own folder (out_dir='dump/D', out_dir='dump/G')" % out_dir)
        os.makedirs(self.dir, exist_ok=True)
        _OPEN_DIRS.add(key)
        self._dir_key = key
        # An earlier recording in the same folder: its files go now, so a run that then dies before close() leaves
        # no index of the earlier one to be read with this one's archives. Only the recorder's own file names.
        for name in os.listdir(self.dir):
            if name == "index.json" or name == "run.json" or name.endswith((".npz", ".npy", ".tmp")):
                try:
                    os.remove(os.path.join(self.dir, name))
                except OSError:
                    pass  # not ours to insist on: the run id still keeps the recordings apart
        self.run_id = os.urandom(16).hex()  # this recording's: rank r > 0 names rank 0's entries of this run only
        if self.rank == 0:
            with open(os.path.join(self.dir, "run.json.tmp"), "w") as f:
                json.dump({"run": self.run_id}, f)
            os.replace(os.path.join(self.dir, "run.json.tmp"), os.path.join(self.dir, "run.json"))
        peer = (os.path.join(out_dir, "rank0"), "../rank0", time.time()) if self.rank > 0 else None
        self._writer = _Writer(run=self.run_id, peer=peer)
        # What the writer gets at the end of __init__, step() and close(): the archive those tensors go to
        # ("init.npz", "s<k>.npz", "dataset.npz") with its [(entry, array)], [(path, array)] of .npy files of
        # their own (a tensor that would take the archive past ARCHIVE_LIMIT) and the entries that hold tensors DDP
        # keeps equal on every rank (which the writer may name in rank 0's archive instead).
        self._archive, self._entries, self._files, self._archive_bytes, self._shared = "init.npz", [], [], 0, set()
        self.no_replay = []  # why this run can only be checked by protocol
        self.layers, self.name = self._describe(lambda: describe_model(self.module), (None, lambda n: n))
        self.loss = self._describe(lambda: describe_loss(loss_fn), None)
        self._loss_fn = loss_fn  # its settings, taken at every step (loss_state: the ranks must agree)
        self._model_digests = {}  # model_state's checksums of the module's attribute tensors, kept while unchanged
        self.optimizer = self._describe(lambda: _optimizer(optimizer), None)
        self.sched = self._describe(lambda: [_scheduler(s) for s in self.schedulers], [])
        if sampler is None:
            self.no_replay.append("no DistributedSampler was passed to the recorder (the replay draws its batches)")
        elif not isinstance(sampler, torch.utils.data.distributed.DistributedSampler):
            self.no_replay.append("the sampler is a %s, not a DistributedSampler (the replay draws DistributedSampler's "
                                  "shards)" % type(sampler).__name__)
        self.batch_size = batch_size
        self.steps = []
        self.error = None
        self.broken = None  # why the recorder stopped recording (it failed), with its step
        self._join_rounds = []  # DDP's join configs seen, one per `with Join(...)` the steps ran in
        self._warned_empty = False  # a rec.step() with nothing since the last was ignored (said once)
        self._partial_at = None  # the first step whose batch was shorter than batch_size
        self.dataset = None
        self.x_rows, self.y_rows = _Rows("xb"), _Rows("yb")
        self.set_epoch_calls = []
        self._max_index = -1  # the largest batch index rec.step() was given
        self._sched_steps = 0
        self._sched_total = 0
        self._counts = _fresh_counts()
        self._closure_steps = set()  # steps whose module forwards ran inside optimizer.step() more than once (LBFGS)
        self._fwd_buffers = None
        # forwards of the module since the last rec.step() (zero_grad drops none of them), and whether the forward
        # buffers were taken at the first: then nothing but the loop itself changed the buffers in between
        self._fwds_since_step = 0
        self._fwd_buffers_first = False
        self._ref_grads = []  # reference gradients written with this step, reused by the reference once written
        self._auto = reference == "auto"
        self._ref_needed = None if self._auto else "reference=True"  # why every step from now on needs it
        self._ref_pending = None  # auto: (step record, captured inputs, yb) of the step before, not computed
        self._ref_from = 0  # auto: the first step with a reference
        named = list(self.module.named_parameters())
        self._pindex = {id(q): i for i, (_, q) in enumerate(named)}
        # DDP's expect_sparse_gradient: an Embedding(Bag)'s weight with sparse=True gets a bucket of its own
        sparse = {id(q) for m in self.module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
                  for q in m.parameters(recurse=False)}
        buffers = [n for n, _ in self.module.named_buffers()]
        registered = _ddp_registered(self.ddp)
        self.index = {
            "format": FORMAT, "version": VERSION, "run": self.run_id, "rank": self.rank, "world_size": self.world,
            "torch_version": torch.__version__, "model": self.layers, "loss": self.loss,
            "dtype": str(next(self.module.parameters()).dtype).replace("torch.", ""),
            "params": [{"name": self.name(n), "torch_name": n, "shape": list(q.shape), "numel": q.numel(),
                        "dtype": str(q.dtype).replace("torch.", ""), "requires_grad": q.requires_grad,
                        **({"sparse": True} if id(q) in sparse else {}),
                        **({"ddp_registered": id(q) in registered} if registered is not None else {})}
                       for n, q in named],
            "buffers": [{"name": self.name(n), "torch_name": n} for n in buffers],
            "ddp": self._ddp_options(), "optimizer": self.optimizer, "schedulers": self.sched,
            "optimizer_type": type(optimizer).__name__.lower(),
            "param_groups": _param_groups(optimizer, self._pindex),
            "scheduler_types": [type(s).__name__ for s in self.schedulers],
            "module_type": type(self.module).__name__,
            # the submodules whose forward depends on train/eval mode: a rank running only others in eval mode
            # computes what the training ranks compute (the protocol check compares the modes of these)
            "mode_dependent": _protocol.mode_dependent(self.module),
        }
        self.index["init"] = self._save_state("init", self.module.state_dict())
        # An optimizer with state already (loaded from a checkpoint: a resumed run; Adagrad's initial sums): the
        # protocol check steps from it. A resumed one (a step taken, or SGD's momentum) is not replayed: the replay
        # starts from a fresh optimizer.
        init_state, init_counts = self._optimizer_state("init", named, shared=False)
        if init_state or init_counts:
            self.index["init_optimizer_state"], self.index["init_optimizer_step_counts"] = init_state, init_counts
        if any(c > 0 for c in init_counts.values()) or any(
                "step" not in self.opt.state.get(q, {"step": 0}) for _, q in named if self.opt.state.get(q)):
            self.no_replay.append("the optimizer had state when the recorder started (a resumed run: loaded from a "
                                  "checkpoint); the replay starts from a fresh optimizer")
        if local_init is not None:
            self.index["init_local"] = self._save_state("init_local", local_init)
        self._unwraps = []  # undo the wrappers and taps at close
        if sampler is not None:
            self._wrap_sampler(sampler)
        for sch in self.schedulers:
            self._wrap_scheduler(sch)
        self.ref = _protocol.Reference(self.module, loss_fn) if reference else None
        self.buckets = _protocol.BucketTap(ddp_model, self._pindex, self.world) if ddp_model is not self.module \
            else None
        self.step_tap = _protocol.StepTap(optimizer, lambda: self._sched_total, self.buckets, self._fingerprints)
        self.step_tap.mark()  # a change from here to the first optimizer.step() (a checkpoint loaded) is noticed
        # The DDP object, the user's module and loss are watched by one global forward pre-hook that picks them out
        # by identity, and DDP's forward and zero_grad through taps on their classes (_protocol.tap), never by
        # anything stored on the objects: a hook stored on a module goes with it wherever the user copies it, and a
        # bound method of the recorder drags the recorder (its threads, locks and files) along: torch.save(model.module),
        # torch.save(ddp) and copy.deepcopy(model.module) for an EMA copy failed ("cannot pickle '_thread.RLock'").
        self._in_ddp = 0  # DDP forwards under way (the module's forward inside one runs after DDP's buffer broadcast)
        # What DDP's training forwards were called with beside the batch (the most positional arguments, the
        # keywords): each rank's own, unchecked, and the report says so (the index's forward_inputs)
        self._forward_positional, self._forward_keywords = 0, set()
        self._hooks = [torch.nn.modules.module.register_module_forward_pre_hook(self._on_any_forward),
                       torch.nn.modules.module.register_module_forward_hook(self._on_any_output)]
        if self.buckets is not None:
            self._unwraps.append(self.buckets.untap)
        self._wrap_ddp_forward(ddp_model)
        for owner in (optimizer, ddp_model) if ddp_model is not self.module else (optimizer,):
            self._wrap_zero_grad(owner)  # never the user's own module
        self._hand_over(0, archive="s0.npz")  # the init archive: the writer thread starts here

    def _optimizer_state(self, prefix, named, shared=True):
        """The optimizer's per-parameter state tensors, saved ({state: {param: file}}), and its step counts.
        shared: rank r > 0 may name rank 0's entry (only the steps' entries are renamed so, not the init's)."""
        state, counters = {}, {}
        for n, q in named:
            for key, v in self.opt.state.get(q, {}).items():
                if key == "step":
                    counters[self.name(n)] = float(v)
                elif torch.is_tensor(v):
                    state.setdefault(key, {})[self.name(n)] = self._save("%s.opt.%s.%s" % (prefix, key, self.name(n)),
                                                                         v, shared=shared)
        return state, counters

    def _fingerprints(self, params):
        """{id(param): CRC-32 of its bytes and of its optimizer state's} (StepTap: parameters changed outside
        optimizer.step()). ISA-L's CRC where installed: about 1 ms for 10M float32 parameters."""
        out = {}
        for q in params:
            tensors = [q] + [v for _, v in sorted(self.opt.state.get(q, {}).items(), key=lambda kv: str(kv[0]))]
            crc = 0
            for v in tensors:
                if not torch.is_tensor(v):
                    crc = zlib.crc32(repr(v).encode(), crc)
                elif v.device.type == "cpu":
                    crc = _crc32(_raw_bytes(v), crc)
                else:  # (a GPU run: hashed on the device)
                    crc = zlib.crc32(repr(_device_hash(v)).encode(), crc)
            out[id(q)] = crc
        return out

    def _describe(self, fn, fallback):
        try:
            return fn()
        except UnsupportedModel as e:
            self.no_replay.append(str(e))
            return fallback

    def _wrap_scheduler(self, sch):
        def count(step, *args, **kwargs):
            self._sched_steps += 1
            self._sched_total += 1
            out = step(*args, **kwargs)
            self.step_tap.scheduled()  # (made after the schedulers are tapped, before any step of theirs)
            return out
        self._unwraps.append(_tap(sch, "step", count))

    # -- capture -------------------------------------------------------------------------------------------
    def _ddp_options(self):
        d = self.ddp
        cap = getattr(d, "bucket_bytes_cap", None)
        return {"wrapped": d is not self.module,
                "bucket_cap_mb": cap / (1024 * 1024) if cap else 25.0,
                "broadcast_buffers": bool(getattr(d, "broadcast_buffers", False)),
                "find_unused_parameters": bool(getattr(d, "find_unused_parameters", False)),
                "gradient_as_bucket_view": bool(getattr(d, "gradient_as_bucket_view", False)),
                # training forwards DDP ran before the recorder (one created mid-run): its buckets are then rebuilt
                # from the ready order at the recorder's first step, not torch's initial assignment
                "iterations_before": int(getattr(d, "num_iterations", 0) or 0)}

    def _wrap_ddp_forward(self, ddp_model):
        """DDP's forward, tapped (undone at close): it says when the module's forward runs inside DDP's (after its
        buffer broadcast: the buffers a forward starts from are taken there, not at an evaluation through
        ddp.module), and, torch 1.13's forward pre-hooks seeing positional arguments only, hands its keyword
        arguments (`ddp(x, with_aux=True)`) to the reference, which calls the module with them."""
        if ddp_model is self.module:
            return
        ref = self.ref

        def forward(original, *args, **kwargs):
            if torch.is_grad_enabled():
                self._forward_positional = max(self._forward_positional, len(args))
                self._forward_keywords.update(kwargs)
            self._in_ddp += 1
            if ref is not None:
                ref.kwargs = kwargs
            try:
                return original(*args, **kwargs)
            finally:
                self._in_ddp -= 1
                if ref is not None:
                    ref.kwargs = None
        self._unwraps.append(_tap(ddp_model, "forward", forward))

    def _wrap_zero_grad(self, owner):
        """zero_grad of the optimizer and of the DDP object: gradients a backward through DDP made (buckets were
        all-reduced) and that are zeroed before this step's optimizer.step() drop what the step recorded so far
        (forwards, buckets): a GAN's generator step runs the discriminator through its DDP wrapper and backward, and
        the discriminator's next step zeroes those gradients before its own. A forward whose backward is still to
        come (the generator's output the discriminator's step made) stays; a zero_grad after optimizer.step()
        (before rec.step) drops nothing."""
        if getattr(owner, "zero_grad", None) is None:
            return

        def zero_grad(original, *args, **kwargs):
            if self.step_tap.calls == 0 and self.buckets is not None and self.buckets.buckets:
                self._counts = _fresh_counts()
                self._fwd_buffers = None
                if self.ref is not None:
                    self.ref.take()
                if self.buckets is not None:
                    self.buckets.buckets = []
            return original(*args, **kwargs)
        self._unwraps.append(_tap(owner, "zero_grad", zero_grad))

    def _wrap_sampler(self, s):
        calls = self.set_epoch_calls

        def set_epoch(original, *args, **kwargs):
            epoch = int(args[0] if args else kwargs.get("epoch", 0))
            if not calls and epoch != 0:  # resumed: the replay draws epochs from 0
                why = "the sampler's first set_epoch was %d, not 0 (a resumed run): the replay draws epochs from 0" % epoch
                if why not in self.no_replay:
                    self.no_replay.append(why)
            calls.append(epoch)
            return original(*args, **kwargs)
        if callable(getattr(type(s), "set_epoch", None)):  # a RandomSampler or WeightedRandomSampler has none
            self._unwraps.append(_tap(s, "set_epoch", set_epoch))

    def _on_ddp_forward(self, module, inputs):
        self._counts["ddp"] += 1
        if self.buckets is not None:
            self.buckets.arm()

    def _on_any_forward(self, module, inputs):
        """The global forward pre-hook (every module's forward calls it): DDP, the user's module and loss module.
        A failure of the recorder's here stops the recording, never the user's forward."""
        if module is not self.ddp and module is not self.module and (self.ref is None or module is not self.ref.user_loss):
            return
        try:
            if module is self.ddp:
                self._on_ddp_forward(module, inputs)
            if module is self.module:
                self._counts["in_step"] += self.step_tap.inside > 0
                self._on_module_forward(module, inputs)
            elif self.ref is not None and module is self.ref.user_loss:
                self.ref.on_loss(module, inputs)
        except Exception as e:  # noqa: BLE001 - the recorder's own failure: recording stops, training goes on
            self._break(len(self.steps), e)

    def _on_any_output(self, module, _inputs, output):
        """The global forward hook: marks a training forward of the user's module whose output a backward goes
        through; the value of the user's loss module (what the reference's loss stands for)."""
        if module is self.module and torch.is_grad_enabled() and self._counts["fwds"]:
            try:
                out = _first_grad_tensor(output)
                if out is not None:
                    entry = self._counts["fwds"][-1]
                    out.register_hook(lambda g: entry.__setitem__("backward", True))
            except Exception as e:  # noqa: BLE001 - the recorder's own failure: recording stops, training goes on
                self._break(len(self.steps), e)
        if self.ref is not None and module is self.ref.user_loss:
            try:
                self.ref.on_loss_output(module, output)
            except Exception as e:  # noqa: BLE001 - as above
                self._break(len(self.steps), e)

    def _on_module_forward(self, module, inputs):
        # Runs inside DDP's forward after its buffer broadcast: the buffers this forward starts from.
        self._counts["module"] += 1
        self._fwds_since_step += 1
        if torch.is_grad_enabled() and _autocast_enabled():
            self._counts["autocast"] += 1  # a forward with a gradient to come, under torch.autocast
        if torch.is_grad_enabled():
            # How this forward ran: its submodules in eval mode, the parameters it trains ("<count>:<crc32 of their
            # names>") and autocast. The step's record takes the forwards a backward went through (marked by a hook
            # on their output, _on_any_output): the ranks must agree on those; an evaluation with grad enabled on one
            # rank (a logging forward without torch.no_grad) has no backward and is not one of them.
            names = "\n".join(n for n, q in module.named_parameters() if q.requires_grad)
            self._counts["fwds"].append({
                "eval": [n or "(the model)" for n, m in module.named_modules() if not m.training],
                "trainable": "%d:%08x" % (names.count("\n") + 1 if names else 0, zlib.crc32(names.encode("utf-8"))),
                "autocast": _autocast_enabled(), "backward": False})
        if self._fwd_buffers is None and (self._in_ddp > 0 or self.ddp is self.module):
            self._fwd_buffers = {k: v.detach().clone() for k, v in module.named_buffers()}
            self._fwd_buffers_first = self._fwds_since_step == 1
        if self.ref is not None:
            self.ref.on_forward(module, inputs)

    def _save(self, stem, t, owned=False, shared=False):
        """Queues t as <stem>.npy, an entry of the current archive (OUT_DIR/rank<r>/<archive>.npz), and returns
        how the index names it: "<archive>.npz/<stem>.npy"; a tensor that would take the archive past
        ARCHIVE_LIMIT goes to OUT_DIR/rank<r>/<stem>.npy instead, named "<stem>.npy". owned: t is the recorder's
        own copy, which nothing changes any more; else t is copied now, in the memory order np.save would write
        it in."""
        name = stem + ".npy"
        if torch.is_tensor(t) and t.layout != torch.strided:
            t, owned = t.detach().to_dense(), True  # a sparse gradient (nn.Embedding(sparse=True)): dense on disk
        a = t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t)
        # C order always (ddpcheck reads C-ordered .npy files): a tensor with other strides (the orthogonal
        # parametrization's `base` buffer is a transposed view) is copied into it, owned or not
        if not owned or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a) if owned else np.array(a, order="C")
        size = a.nbytes + 2 * len(name.encode("utf-8")) + 4096  # the entry, its headers and its .npy header
        if self._archive_bytes + size > ARCHIVE_LIMIT or len(self._entries) >= 65535:
            self._files.append((os.path.join(self.dir, name), a))
            return name
        self._archive_bytes += size
        self._entries.append((name, a))
        if shared:
            self._shared.add(name)
        return self._archive + "/" + name

    def _hand_over(self, step, done=None, archive=None):
        """What _save queued since the last call goes to the writer thread as one batch: step's archive (that of
        __init__ counts as step 0's: without it no step is usable); done() runs once it is written. The next
        tensors go to `archive`."""
        batch = (os.path.join(self.dir, self._archive), self._entries, self._files, self._shared)
        self._archive, self._entries, self._files, self._archive_bytes, self._shared = archive, [], [], 0, set()
        self._writer.put(batch, step, done)

    def _save_state(self, prefix, state, owned=False, shared=False):
        return {self.name(k): self._save("%s.%s" % (prefix, self.name(k)), v, owned, shared)
                for k, v in state.items()}

    def set_dataset(self, x, y):
        """The full dataset (rows indexed by the sampler); else it is rebuilt from the recorded batches."""
        self.dataset = (torch.as_tensor(x), torch.as_tensor(y))

    def step(self, batch_indices=None, xb=None, yb=None, loss=None):
        """Call once per optimizer step, after optimizer.step() (and scaler.update()). batch_indices: the batch's
        dataset rows (needed for the replay and the sampler check; without them only the protocol is checked)."""
        s = len(self.steps)
        if self.broken is not None:
            return
        if self.step_tap.calls == 0 and self._counts["ddp"] == 0 and self._counts["module"] == 0 and self.steps:
            # no forward and no optimizer.step() since the last rec.step(): a second call for the same step (the
            # loop calls it twice), not a step of its own; recording it would shift every later step
            if not self._warned_empty:
                self._warned_empty = True
                sys.stderr.write("ddpcheck_torch: rank %d: rec.step() called again with no forward and no "
                                 "optimizer.step() since the last call (step %d): ignored; call it once per "
                                 "optimizer step\n" % (self.rank, s - 1))
            return
        try:
            self._step(batch_indices, xb, yb, loss)
        except Exception as e:  # noqa: BLE001 - a failure of the recorder itself never breaks the user's training
            self._break(s, e)
        finally:  # the step's files are written by the writer thread while training goes on
            refs, self._ref_grads = self._ref_grads, []
            self._hand_over(s, (lambda: [self.ref.recycle(r) for r in refs]) if refs else None, "s%d.npz" % (s + 1))

    def _break(self, step, e):
        """The recorder failed on something of the run it does not handle (a bug of the recorder's): the training
        goes on unrecorded from `step`; the steps before are kept and close() still writes them, and the index says
        why it stopped ("recorder_error"). Its hooks come off now, so nothing more is captured."""
        import traceback
        where = traceback.extract_tb(e.__traceback__)[-1]
        self.broken = {"step": step, "type": type(e).__name__,
                       "message": (str(e).splitlines() or [""])[0][:300],
                       "at": "%s:%d" % (os.path.basename(where.filename), where.lineno)}
        sys.stderr.write("ddpcheck_torch: rank %d: the recorder failed at step %d (%s: %s, at %s); training goes on, "
                         "unrecorded from this step (please report this to ddpcheck)\n"
                         % (self.rank, step, self.broken["type"], self.broken["message"], self.broken["at"]))
        for h in self._hooks:
            h.remove()
        for undo in self._unwraps:
            undo()
        if self.buckets is not None:
            self.buckets.stopped, self.buckets.buckets = True, []
        if self.ref is not None:
            self.ref.take()

    def _note_comm_hook(self):
        """The user's DDP communication hook by name (None without one); one that rounds or approximates the
        all-reduce makes the run protocol-only, known from the first step on (registered before the first forward),
        so that reference='auto' computes the float64 reference of every step."""
        hook = self.buckets.hook_name() if self.buckets is not None else None
        if hook is not None and any(k in hook.lower() for k in COMPRESSING_HOOKS):
            why = ("a DDP communication hook (%s) rounds or approximates the all-reduce; the replay models DDP's own "
                   "(the protocol check allows for the hook's rounding)" % hook)
            if why not in self.no_replay:
                self.no_replay.append(why)
        return hook

    def _step(self, batch_indices, xb, yb, loss):
        s = len(self.steps)
        self._note_comm_hook()
        if batch_indices is None:
            idx = torch.zeros(0, dtype=torch.int64)
            if "rec.step() got no batch indices" not in self.no_replay:
                self.no_replay.append("rec.step() got no batch indices")
        else:
            idx = torch.as_tensor(batch_indices).to(torch.int64).reshape(-1)
        if self.batch_size is None and idx.numel():
            self.batch_size = int(idx.numel())
        if self._partial_at is None and self.batch_size and 0 < idx.numel() < self.batch_size:
            self._partial_at = s  # the first batch shorter than the others: the DataLoader keeps its last batch
        # One copy of the batch (kept while a row of it is the latest of its index).
        if idx.numel():
            self._max_index = max(self._max_index, int(idx.max()))
        rows = idx.numpy() if (xb is not None or yb is not None) and idx.numel() else None
        if rows is not None and rows.min() < 0:
            rows = None
            if "rec.step() got negative batch indices" not in self.no_replay:
                self.no_replay.append("rec.step() got negative batch indices")
        for kept, batch in ((self.x_rows, xb), (self.y_rows, yb)):
            if batch is not None and rows is not None:
                kept.put(s, rows, batch)
                why = kept.note and kept.note + ": the dataset is not recorded"
                if why and why not in self.no_replay:
                    self.no_replay.append(why)
        p = "s%d" % s
        opt_steps, lrs, step_grads, sched_before, hyper, lr_edit = self.step_tap.take()
        # Parameters (or their optimizer state) changed outside optimizer.step(): before it (since the last
        # rec.step(): a checkpoint loaded on every rank, a rollback) or after it (weights clipped, p.data edited).
        # Their update at this step is not the optimizer's: the protocol check skips it, and the replay, which
        # steps from the parameters recorded at the step before, cannot stand for the run.
        ids = {id(q): n for n, q in self.module.named_parameters()}
        edited = {}
        for key, changed in (("edited_before_step", self.step_tap.take_edited()),
                             ("edited_after_step", self.step_tap.mark())):
            names = sorted(self.name(ids[i]) for i in changed if i in ids)
            if not names:
                continue
            edited[key] = names
            if not any(r.startswith("parameters changed outside optimizer.step()") for r in self.no_replay):
                self.no_replay.append(
                    "parameters changed outside optimizer.step() (first at step %d: %s): a checkpoint loaded, weights "
                    "clipped or p.data edited; the replay steps from the parameters recorded at the step before"
                    % (s, ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")))
        lrs = lrs or [float(g["lr"]) for g in self.opt.param_groups]
        rec = {"step": s, "indices": self._save(p + ".indices", idx),
               "epoch": int(getattr(self.sampler, "epoch", 0)) if self.sampler is not None else 0,
               "loss": float(loss.detach()) if torch.is_tensor(loss) else loss,
               "lr": lrs[0], "lrs": lrs, "optimizer_steps": opt_steps, "scheduler_steps": self._sched_steps,
               "scheduler_steps_before": self._sched_total if sched_before is None else sched_before,
               "ddp_forwards": self._counts["ddp"], "module_forwards": self._counts["module"],
               # every step says whether its forwards ran under autocast, reference or not: the ranks must agree
               "autocast": self._counts["autocast"] > 0}
        rec.update(edited)
        state = self._walked(_protocol.loss_state, self._loss_fn, self.module, _tensor_digest)
        if state is not None:
            rec["loss_state"] = state
        state = self._walked(_protocol.model_state, self.module, _tensor_digest, self._model_digests)
        if state is not None:
            rec["model_state"] = state
        state = self._outside_params()
        if state:
            rec["outside_params"] = state
        trained = [f for f in self._counts["fwds"] if f["backward"]]  # the forwards a backward went through
        if trained:  # the ranks must agree (BatchNorm in eval or a backbone unfrozen on one rank, a penalty forward)
            rec["eval_modules"] = trained[0]["eval"]
            rec["trainable"] = trained[0]["trainable"]
            rec["train_forwards"] = len(trained)
            rec["autocast"] = any(f["autocast"] for f in trained)
        join = getattr(self.ddp, "_join_config", None)
        if join is not None and getattr(join, "enable", False):
            # inside torch.distributed.algorithms.Join: the ranks may run uneven numbers of steps. Each `with Join`
            # makes DDP a new config: its ordinal numbers the round, within which the ranks' steps align
            if not self._join_rounds or self._join_rounds[-1] is not join:
                self._join_rounds.append(join)
            rec["join"] = True
            rec["join_round"] = len(self._join_rounds) - 1
        self._sched_steps = 0
        if lr_edit is not None:
            # The optimizer stepped with an lr no scheduler given to the recorder set: the loop set it by hand (a
            # warmup, adjust_learning_rate()) or a scheduler built after the recorder or not passed to it did. The
            # protocol check then holds the lr from this step on to no schedule (still the same on every rank), and
            # the replay, which follows the given schedulers, cannot stand for the run.
            rec["lr_edited"] = True
            why = ("the lr changed without a scheduler given to the recorder stepping (first at step %d: %s -> %s): "
                   "set by hand (a warmup in the loop, adjust_learning_rate()) or by a scheduler not passed as "
                   "DdpRecorder(schedulers=[...]); the replay follows the given schedulers only"
                   % (s, lr_edit[0], lr_edit[1]))
            if not any(r.startswith("the lr changed without a scheduler") for r in self.no_replay):
                self.no_replay.append(why)
        if hyper is not None:
            rec["groups"] = hyper
        # Tensors DDP keeps equal on every rank are marked shared: rank r > 0 names rank 0's entry where it holds
        # the same bytes (_Writer). Buffers only when DDP broadcasts them.
        bcast = bool(getattr(self.ddp, "broadcast_buffers", False))
        if self._fwd_buffers is not None:
            rec["forward_buffers"] = self._save_state(p + ".fwd", self._fwd_buffers, owned=True, shared=bcast)
            if self._fwd_buffers_first:
                # taken at the module's first forward since the last rec.step(): with broadcast_buffers, rank 0's
                # buffers recorded then (ddpcheck compares them bitwise)
                rec["forward_buffers_first"] = True
        named = list(self.module.named_parameters())
        grads = {n: (step_grads.get(id(q)) if step_grads is not None else q.grad) for n, q in named}
        rec["grads"] = {self.name(n): self._save("%s.grad.%s" % (p, self.name(n)), g, step_grads is not None, True)
                        for n, g in grads.items() if g is not None}
        rec["params"] = {self.name(n): self._save("%s.param.%s" % (p, self.name(n)), q, shared=True)
                         for n, q in named}
        rec["buffers"] = self._save_state(p + ".buf", dict(self.module.named_buffers()), shared=bcast)
        rec["optimizer_state"], rec["optimizer_step_counts"] = self._optimizer_state(p, named)
        if self.buckets is not None:
            taken = self.buckets.take()
            last = {b["index"]: k for k, b in enumerate(taken)}
            if len(last) < len(taken) and SEVERAL_REDUCTIONS not in self.no_replay:
                self.no_replay.append(SEVERAL_REDUCTIONS)  # a bucket all-reduced twice in one step
            rec["buckets"] = []
            for k, b in enumerate(taken):
                e = {"index": b["index"], "params": b["params"],
                     "local": self._save("%s.b%d.%d.local" % (p, b["index"], k), b["local"], True)}
                if b["reduced_is_grads"] and last[b["index"]] == k:
                    e["reduced_is_grads"] = True  # bitwise the grads optimizer.step saw (grads_at_step): not written
                elif b["reduced"] is None:
                    e["reduced"] = None
                else:
                    e["reduced"] = self._save("%s.b%d.%d.reduced" % (p, b["index"], k), b["reduced"], True, True)
                    if b["grads_differ"] is not False and last[b["index"]] == k and step_grads is not None \
                            and CHANGED_GRADS not in self.no_replay \
                            and not (self.scaler is not None and self.scaler.is_enabled()):
                        # The loop changed the reduced gradients before optimizer.step (clip_grad_norm_, a
                        # manual scale): the replay, which steps on DDP's reduced gradients, does not know how.
                        self.no_replay.append(CHANGED_GRADS)
                rec["buckets"].append(e)
        if self._counts["in_step"] > 1:  # (one call, SGD's or Adam's step(closure), runs at the step's start)
            self._closure_steps.add(s)
        if self.ref is not None:
            captured = self.ref.take()
            if self._ref_needed is None:
                self._ref_needed = self._not_replayed(rec, captured, yb)
                self._ref_from = rec["step"] if self._ref_pending is None else self._ref_pending[0]["step"]
                for st in self.steps[:self._ref_from] if self._ref_needed else ():  # not replayed after all
                    st["ref_note"] = ("reference='auto': not recomputed before step %d, the first that showed the "
                                      "run is not replayed (%s)" % (self._ref_from, self._ref_needed))
            if self._ref_needed is None:  # auto, replayed so far: decided at the next step
                rec["ref_note"] = AUTO_NOTE
                self._ref_pending = (rec, captured, yb)
            else:
                if self._ref_pending is not None:  # the step before, now that the run turns out not replayed
                    self._reference(*self._ref_pending)
                    self._ref_pending = None
                self._reference(rec, captured, yb)
        if self.scaler is not None and self.scaler.is_enabled():
            rec["scaler"] = {"scale": float(self.scaler.get_scale()),
                             "growth_tracker": int(self.scaler.state_dict().get("_growth_tracker", 0))}
        self.steps.append(rec)
        self._counts = _fresh_counts()
        self._fwd_buffers = None
        self._fwds_since_step = 0

    @staticmethod
    def _walked(walk, *args):
        """walk(*args): what parameterises the loss now (_protocol.loss_state) or what the module's submodules hold
        that DDP does not broadcast (_protocol.model_state), or None where there is nothing to walk (a loss named by
        a string) or the walk failed on an object of the user's (that step is then not compared; training goes
        on)."""
        try:
            return walk(*args)
        except Exception:  # noqa: BLE001 - an object of the user's that will not be looked at
            return None

    def _outside_params(self):
        """The parameters the optimizer steps that DDP's module does not hold (a learnable loss weight, an
        uncertainty-weighting module beside the model), as they are after the step: "group<g>[<i>]" -> "tensor
        <dtype>[<shape>] <values>" (up to 8 elements) or "... crc <digest>". DDP never all-reduces their gradients, so
        the ranks must agree on them by other means; {} when there are none."""
        return {"param:group%d[%d]" % (g, i): _protocol.tensor_text(q, _tensor_digest)
                for g, group in enumerate(self.opt.param_groups) for i, q in enumerate(group["params"])
                if torch.is_tensor(q) and id(q) not in self._pindex}

    def _reference(self, rec, captured, yb):
        """The float64 reference of the step `rec` records, from its captured forwards, into the current archive."""
        if rec["step"] in self._closure_steps:
            # A closure optimizer.step() calls (LBFGS) evaluates the loss at parameters the optimizer moves between its
            # calls: no gradient of the step's starting parameters stands for them
            rec["ref_note"] = ("no single-process reference: the step's forwards ran inside optimizer.step(), more "
                               "than once (a closure evaluated at parameters the optimizer moves between its calls, "
                               "as LBFGS does)")
            return
        ref, why = self.ref.compute(captured, yb, rec.get("loss"))
        rec.pop("ref_note", None)
        if ref is None:
            rec["ref_note"] = why
            return
        self._ref_grads.append(ref)
        rec["ref_grads"] = {self.name(n): self._save("s%d.ref.%s" % (rec["step"], self.name(n)), g, True)
                            for n, g in ref.items()}
        rec.update({"ref_rows": why["rows"], "microbatches": why["microbatches"], "autocast": why["autocast"],
                    "ref_loss": why["loss"]})
        if "loss_ratio" in why:
            # the loss passed to rec.step() is not the loss module's value: ref_grads is the module's gradient, which
            # ddpcheck holds the local gradient to only as ref_loss_ratio times it (a pure scaling)
            rec["ref_loss_ratio"] = why["loss_ratio"]
            rec["ref_note"] = why["changed"]
        if why.get("objective") == "sum":
            rec["ref_objective"] = "sum"  # the forwards' losses summed (rec.step's loss is their sum): not averaged

    def _not_replayed(self, rec, captured, yb=None):
        """Why ddpcheck will not replay the run, as far as this step shows (None: it replays it so far)."""
        if self.no_replay:
            return self.no_replay[0]
        outs = [l["out"] for l in self.layers or [] if l.get("type") == "linear"]
        targets = captured.targets or ([yb] if torch.is_tensor(yb) else [])
        if self.loss == "mse" and outs and any(tuple(t.shape[1:]) != (outs[-1],) for t in targets):
            # torch broadcast outputs (B, 1) against targets (B,) into a (B, B) loss (it only warns): ddpcheck's
            # replay does not (core/dump.cc says the same from the recorded dataset)
            return "MSELoss got targets of shape %s for outputs (B, %d)" % (tuple(targets[0].shape), outs[-1])
        if any(l["type"] == "dropout" and l["p"] > 0 for l in self.layers or []):
            return "Dropout(p > 0)"
        if self.scaler is not None and self.scaler.is_enabled():
            return "a GradScaler"
        if captured.autocast:
            return "a forward under torch.autocast"
        if len(captured.inputs) > 1:
            return "%d micro-batches in step %d" % (len(captured.inputs), rec["step"])
        prev = self.steps[-1] if self.steps else None
        if not self._cadence_ok(rec["scheduler_steps"], rec["step"], rec.get("epoch"),
                                prev.get("epoch") if prev is not None else None):
            return "a scheduler stepped %d time(s) before step %d" % (rec["scheduler_steps"], rec["step"])
        return None

    def _cadence_ok(self, k, s, epoch=None, prev_epoch=None):
        """k scheduler steps before step s: none, or every scheduler once at an epoch's start (what the replay does):
        the first step of an epoch the sampler was moved to (set_epoch; a DataLoader(drop_last=True) ends an epoch
        a batch early), or, without epochs recorded, every ceil(len(sampler) / batch) steps (floor while every batch
        up to step s was full: DataLoader(drop_last=True) drops the short last batch of each epoch)."""
        if k == 0:
            return True
        if k != len(self.schedulers):
            return False
        if epoch is not None and prev_epoch is not None and epoch != prev_epoch:
            return True
        per_epoch = None
        if self.sampler is not None and self.batch_size:
            whole = self._partial_at is None or self._partial_at > s
            per_epoch = max(1, (len(self.sampler) // self.batch_size) if whole else
                            math.ceil(len(self.sampler) / self.batch_size))
        return bool(per_epoch and s % per_epoch == 0)

    # -- output --------------------------------------------------------------------------------------------
    def close(self):
        _OPEN_DIRS.discard(getattr(self, "_dir_key", None))
        if getattr(self, "buckets", None) is not None:  # training may go on after close(): keep nothing more
            self.buckets.stopped, self.buckets.buckets = True, []
        for h in self._hooks:
            h.remove()
        for undo in getattr(self, "_unwraps", []):
            undo()
        self._archive = "dataset.npz"  # the dataset's tensors (after the last step's archive was handed over)
        ix = self.index
        n_sampled = len(self.sampler.dataset) if self.sampler is not None and hasattr(self.sampler, "dataset") else None
        if n_sampled is not None and self._max_index >= n_sampled:
            # Row ids of a bigger dataset (a random_split Subset's original rows), not the positions the sampler
            # draws from its dataset: neither the shards nor the replay can be read from them.
            why = ("rec.step() got batch index %d, but the sampler's dataset has %d rows: pass the positions the "
                   "sampler drew (its dataset's indices 0..%d), not row ids of a larger dataset (a Subset from "
                   "random_split?)" % (self._max_index, n_sampled, n_sampled - 1))
            if why not in self.no_replay:
                self.no_replay.append(why)
        if self.sampler is not None:
            s = self.sampler
            ix["sampler"] = {"type": type(s).__name__, "len": len(s.dataset) if hasattr(s, "dataset") else None,
                             "num_replicas": getattr(s, "num_replicas", self.world), "rank": getattr(s, "rank", self.rank),
                             "shuffle": bool(getattr(s, "shuffle", False)), "seed": int(getattr(s, "seed", 0)),
                             "drop_last": bool(getattr(s, "drop_last", False)),
                             "set_epoch_called": bool(self.set_epoch_calls), "set_epoch_calls": self.set_epoch_calls,
                             **({"indices_outside": True} if n_sampled is not None and self._max_index >= n_sampled
                                else {})}
        ix["batch_size"] = self.batch_size
        if self._forward_positional or self._forward_keywords:
            ix["forward_inputs"] = {"positional": self._forward_positional,
                                    "keywords": sorted(str(k) for k in self._forward_keywords)}
        if self.dataset is not None:
            ix["dataset"] = {"x": self._save("dataset.x", self.dataset[0]), "y": self._save("dataset.y", self.dataset[1]),
                             "complete": True}
        elif self.x_rows.first is not None and self.y_rows.first is not None:
            seen = self.x_rows.seen()
            n = max(int(seen[-1]) + 1, (ix.get("sampler") or {}).get("len") or 0)
            try:  # the recording's index is written whatever its dataset does
                x, y = self.x_rows.tensor(n), self.y_rows.tensor(n)
            except Exception as e:  # noqa: BLE001 - the dataset is optional: the protocol check does not need it
                x = None
                note = "the dataset could not be assembled from rec.step()'s batches (%s: %s)" % (
                    type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                if note not in self.no_replay:
                    self.no_replay.append(note)
            if x is not None:
                ix["dataset"] = {"x": self._save("dataset.x", x), "y": self._save("dataset.y", y),
                                 "complete": seen.size == n, "rows_seen": seen.tolist(),
                                 "rows_redrawn": self.x_rows.redrawn,
                                 "rows_changed": self.x_rows.changed + self.y_rows.changed}
        batch = (os.path.join(self.dir, self._archive), self._entries, self._files, self._shared)
        self._entries, self._files, self._archive_bytes, self._shared = [], [], 0, set()
        self._writer.close(batch, len(self.steps))  # every file is on disk before the index that names them
        if self._writer.aliases:  # entries rank 0 holds bitwise: named there
            self.steps = _renamed(self.steps, self._writer.aliases)
            ix["peer_run"] = self._writer.peer_run
        failed = self._writer.failure  # (step, exception) of a write that failed, the step's files incomplete
        if failed is not None:
            step, e = failed
            del self.steps[step:]  # as a synchronous write would have left it: the run stopped at that step
            lost = "s%d.npz/" % step  # a deferred reference of the step before went to the failed archive
            for st in self.steps:
                if any(f.startswith(lost) for f in st.get("ref_grads", {}).values()):
                    for k in ("ref_grads", "ref_rows", "microbatches", "ref_loss"):
                        st.pop(k, None)
                    st["ref_note"] = "its reference was written with step %d, whose write failed" % step
            if self.error is None or step < self.error["step"]:
                self.error = {"step": step, "type": type(e).__name__,
                              "message": str(e).splitlines()[0] if str(e) else type(e).__name__}
            else:
                failed = None  # the run's own exception came first and is the one that propagates
        ix["steps"] = self.steps
        if any(st.get("join") for st in self.steps):
            ix["join"] = True
        if self.broken is not None:
            ix["recorder_error"] = self.broken
        ix["ddp"]["comm_hook"] = self._note_comm_hook()
        self._scheduler_cadence()
        ix["replay"] = {"possible": not self.no_replay, "reasons": self.no_replay}
        ix["protocol"] = {"buckets": self.buckets is not None and self.buckets.note is None,
                          "buckets_note": self.buckets.note if self.buckets is not None else "not wrapped in DDP",
                          "reference": "float64 recomputation of the user's module and loss"
                          if self.ref is not None and self.ref.note is None and self._ref_needed is not None else None,
                          "reference_note": "reference=False" if self.ref is None else self.ref.note or
                          (AUTO_NOTE if self._ref_needed is None else "reference='auto': computed from step %d (%s)"
                           % (self._ref_from, self._ref_needed) if self._auto else None)}
        if self.error is not None:
            ix["error"] = self.error
        with open(os.path.join(self.dir, "index.json.tmp"), "w") as f:
            json.dump(ix, f, indent=1)
        os.replace(os.path.join(self.dir, "index.json.tmp"), os.path.join(self.dir, "index.json"))
        if failed is not None and not self._writer.raised:
            self._writer.raised = True
            raise failed[1]

    def _scheduler_cadence(self):
        """The replay steps schedulers once per epoch: any other cadence is checked by protocol only."""
        if not self.schedulers or not self.steps:
            return
        prev = None
        for st in self.steps:
            k, s = st["scheduler_steps"], st["step"]
            ok = self._cadence_ok(k, s, st.get("epoch"), prev.get("epoch") if prev is not None else None)
            prev = st
            if ok:
                continue
            self.no_replay.append("a scheduler was stepped %d time(s) before step %d, not once per epoch; the replay "
                                  "steps schedulers per epoch (the lr is checked as recorded)" % (k, s))
            return

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            self.error = {"step": len(self.steps), "type": exc_type.__name__, "message": str(exc).splitlines()[0]
                          if str(exc) else exc_type.__name__}
        self.close()
        return False
