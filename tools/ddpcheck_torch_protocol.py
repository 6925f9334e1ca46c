"""What ddpcheck_torch records for the model-agnostic protocol check (docs/torch.md, "Protocol check").

Works for any nn.Module: nothing here needs to understand the model.
  * BucketTap: a DDP communication hook wrapping the default all-reduce (or the user's own hook): per bucket
    of every synced backward, this rank's local gradients (before any division) and the reduced result.
  * StepTap: optimizer.step wrapped: how often it ran, the lr of each param group and the gradients it saw.
  * Reference: the float64 gradient of this rank's micro-batches on a deep copy of the user's module and loss,
    from the step's starting parameters and buffers; ddpcheck averages it over ranks into the single-process
    gradient of the global batch (BatchNorm in train mode sees each rank's shard, as under DDP; dropout masks
    are reproduced by restoring the RNG state each forward started from).
"""
import collections
import contextlib
import copy
import dis
import functools
import math
import re
import threading
import types
import weakref

import numpy as np
import torch
import torch.distributed as _dist
from torch import nn

_DTYPES = (torch.float32, torch.float64)


class UnsupportedDtype(ValueError):
    """The model holds a parameter or buffer of a dtype ddpcheck cannot record."""


def check_dtypes(module):
    """Raises UnsupportedDtype naming the first module whose floating state is not float32/float64."""
    for mname, m in module.named_modules():
        for pname, t in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
            if t.is_floating_point() and t.dtype not in _DTYPES:
                raise UnsupportedDtype(
                    "ddpcheck cannot record module '%s' (%s): its tensor '%s' is %s; ddpcheck records float32 "
                    "and float64 models. Keep the parameters in float32 and compute in %s under "
                    "torch.autocast(device_type='cpu', dtype=%s) instead of model.to(%s)"
                    % (mname or "<root>", type(m).__name__, pname, t.dtype, t.dtype, t.dtype, t.dtype))


def same_bits(a, b):
    """Whether the 1-D tensors a and b (same dtype and device) hold the same bits: -0.0 is not 0.0, a NaN equals
    only the same NaN."""
    if a.dtype != b.dtype or a.device != b.device or a.shape != b.shape:
        return False
    size = a.element_size()
    if a.device.type == "cpu" and size in (4, 8) and a.dtype in (torch.float32, torch.float64):
        kind = np.uint32 if size == 4 else np.uint64
        return bool(np.array_equal(a.detach().numpy().view(kind), b.detach().numpy().view(kind)))
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(size)
    return ints is not None and torch.equal(a.detach().view(ints), b.detach().view(ints))


_TAPS = {}  # (class, method name) -> {id(obj): (weakref to obj, around)} of the objects a recorder taps
_TAPS_LOCK = threading.Lock()
_ABSENT = object()


def untapped(obj, name):
    """obj.<name> as the class defines it, without a tap (another recorder's may be on the class); None if absent."""
    if name in vars(obj):
        return getattr(obj, name)
    m = getattr(type(obj), name, None)
    while m is not None and hasattr(m, "_ddpcheck_own"):
        m = m.__wrapped__
    return m.__get__(obj, type(obj)) if m is not None else None


def tap(obj, name, around):
    """obj.<name>(*args, **kwargs) becomes around(original, *args, **kwargs) (original: the bound method) until the
    returned undo() is called.

    The method is patched on obj's class (once per class, counted), never stored on obj: what lives in an object's
    __dict__ goes wherever the object goes. A scheduler's state_dict() is its __dict__ (a wrapper there made
    torch.save({'scheduler': sched.state_dict()}) fail, "Can't pickle local object"), and torch.save(sampler),
    torch.save(ddp) and copy.deepcopy pickle or copy it. Objects of the class that are not tapped call the method
    unchanged. An object with its own attribute of that name (the user wrapped it) is wrapped on the object."""
    if name in vars(obj):
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            return around(original, *args, **kwargs)
        setattr(obj, name, wrapper)
        return lambda: vars(obj).pop(name, None) if vars(obj).get(name) is wrapper else None
    cls = type(obj)
    key = (cls, name)
    with _TAPS_LOCK:
        watch = _TAPS.get(key)
        if watch is None:
            watch = _TAPS[key] = {}
            own = cls.__dict__.get(name, _ABSENT)
            inherited = getattr(cls, name)

            def tapped(self, *args, **kwargs):
                seen = watch.get(id(self))
                if seen is not None and seen[0]() is self:
                    return seen[1](inherited.__get__(self, type(self)), *args, **kwargs)
                return inherited(self, *args, **kwargs)
            tapped.__name__, tapped.__doc__, tapped.__wrapped__ = name, getattr(inherited, "__doc__", None), inherited
            tapped._ddpcheck_own = own
            setattr(cls, name, tapped)
        watch[id(obj)] = (weakref.ref(obj), around)

    def undo():
        with _TAPS_LOCK:
            seen = watch.get(id(obj))
            if seen is not None and seen[0]() is obj:
                del watch[id(obj)]
            if not watch and _TAPS.get(key) is watch:
                del _TAPS[key]
                own = cls.__dict__[name]._ddpcheck_own
                if own is _ABSENT:
                    delattr(cls, name)
                else:
                    setattr(cls, name, own)
    return undo


class BucketTap:
    """Registers itself as DDP's comm hook at the first forward through DDP, wrapping a hook the user
    registers later with ddp.register_comm_hook (a hook registered before the recorder cannot be seen).

    The reduced bucket of DDP's own all-reduce (no user hook, gradient_as_bucket_view=False) is not copied when the
    all-reduce completes: it is DDP's bucket buffer, which nothing writes until the next backward after the next
    forward through DDP. At optimizer.step (grads_at_step) the step's grads are copied into one flat tensor per
    bucket and compared with it: bitwise equal (the common case), the bucket is marked reduced_is_grads and never
    copied; else (grads unscaled or clipped since) it is copied then. Whatever is still uncopied is copied at the
    next forward through DDP (arm) or at take()."""

    def __init__(self, ddp, param_index, world):
        self.ddp, self.param_index, self.world = ddp, param_index, world
        self.user = None  # (state, hook) the user registered through the patched method
        self._before = ""  # the name of a hook registered before the recorder (DDP's logging data), if any
        self.registered = False
        self.stopped = False  # set when the recorder closes or fails: the hook then keeps nothing
        self.note = None
        self.buckets = []  # this step's entries: index, params (indices), tensors, local copy, reduced
        self._lazy = not bool(getattr(ddp, "gradient_as_bucket_view", False))
        self._original = untapped(ddp, "register_comm_hook")
        self.untap = lambda: None  # undoes the tap of ddp.register_comm_hook (the recorder's close)
        if self._original is not None:
            self.untap = tap(ddp, "register_comm_hook", lambda _orig, state, hook: self._user_register(state, hook))

    def hook_name(self):
        """The name of the user's DDP communication hook (default_hooks.fp16_compress_hook: "fp16_compress_hook"),
        whether registered through the recorder or before it (then as DDP's logging data names it); None without
        one."""
        if self.user is not None:
            hook = self.user[1]
            return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or repr(hook)
        if self.note is not None:
            return self._before or "a hook registered before"
        return None

    def _user_register(self, state, hook):
        if self.registered:
            raise RuntimeError("register_comm_hook after the first forward: DDP allows one hook, registered "
                               "before backward; register yours before the first forward")
        self.user = (state, hook)

    def arm(self):
        self._copy_pending()  # the backward this forward leads to rewrites DDP's bucket buffers
        if self.registered or self._original is None:
            return
        self.registered = True
        try:  # a hook registered before the recorder, as DDP's logging data names it (before ours is tried)
            self._before = str(self.ddp._get_ddp_logging_data().get("comm_hook") or "")
        except Exception:  # noqa: BLE001 - torch's private logging data: a name is a nicety
            self._before = ""
        try:
            self._original(None, self._hook)
        except RuntimeError as e:  # a hook was registered before the recorder existed
            self.note = ("buckets not recorded: a DDP comm hook was registered before DdpRecorder (%s); construct "
                         "the recorder first and register the hook after it" % str(e).splitlines()[0])

    def _copy_pending(self, keep_last_grads=False):
        """Copies the reduced buckets still held as DDP's buffers; keep_last_grads: not those of the last entry of
        their bucket marked reduced_is_grads (the step's grads hold them)."""
        last = {e["index"]: e for e in self.buckets} if keep_last_grads else {}
        for e in self.buckets:
            if e["pending"] and not (e["reduced_is_grads"] and last.get(e["index"]) is e):
                e["reduced"], e["pending"] = e["reduced"].detach().clone(), False

    def _hook(self, _state, bucket):
        if self.stopped:  # the recorder stopped (closed, or failed): DDP's own all-reduce, nothing kept
            if self.user is not None:
                return self.user[1](self.user[0], bucket)
            buf = bucket.buffer()
            buf.mul_(1.0 / self.world)
            return _dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])
        tensors = list(bucket.parameters())
        idx = [self.param_index.get(id(p), -1) for p in tensors]
        buf = bucket.buffer()
        entry = {"index": int(bucket.index()), "params": idx, "tensors": tensors, "local": buf.detach().clone(),
                 "reduced": None, "pending": False, "reduced_is_grads": False, "grads_differ": False}
        self.buckets.append(entry)
        lazy = self._lazy and self.user is None

        def keep(f):  # the reduced bucket, kept as the future completes (one callback: it runs on gloo's thread)
            out = f.value()
            out = out[0] if isinstance(out, (list, tuple)) else out
            if lazy and out is buf:  # DDP's own buffer: compared with the grads at optimizer.step, copied if needed
                entry["reduced"], entry["pending"] = out, True
            else:
                entry["reduced"] = out.detach().clone()
            return out
        if self.user is not None:
            return self.user[1](self.user[0], bucket).then(keep)
        # the reducer's default: mul by 1/W in place (copy_grad_to_bucket), then all-reduce SUM
        buf.mul_(1.0 / self.world)
        return _dist.all_reduce(buf, async_op=True).get_future().then(keep)

    def grads_at_step(self, params):
        """{id(param): a copy of its grad} for the params (those with a grad), as optimizer.step sees them, each
        bucket's (of this step's last synced backward) compared with its reduced result: grads_differ is whether
        they differ (None: not comparable, taken as changed), reduced_is_grads whether every parameter's grad is
        the bucket bitwise (one flat copy then holds them all); the reduced result is copied where it is still
        DDP's buffer and not the grads. Any other param's grad is copied alone."""
        out, last = {}, {}
        for e in self.buckets:
            last[e["index"]] = e
        for e in last.values():
            grads = [p.grad for p in e["tensors"]]
            red = e["reduced"]
            if red is None or red.dim() != 1 or sum(p.numel() for p in e["tensors"]) != red.numel() or any(
                    g is not None and (g.dtype != red.dtype or g.device != red.device) for g in grads):
                e["grads_differ"] = None
                continue
            if all(g is not None for g in grads):
                flat = torch.cat([g.detach().reshape(-1) for g in grads]) if len(grads) > 1 else \
                    grads[0].detach().reshape(-1).clone()
                e["grads_differ"] = not same_bits(flat, red)  # changed since the all-reduce (clipped, scaled)
                e["reduced_is_grads"] = min(e["params"]) >= 0 and not e["grads_differ"]
                parts = flat.split([g.numel() for g in grads])
            else:  # a parameter without a grad (unused): each grad against its own part of the bucket
                parts = [None if g is None else g.detach().reshape(-1).clone() for g in grads]
                e["grads_differ"] = any(c is not None and not same_bits(c, r) for c, r in
                                        zip(parts, red.split([p.numel() for p in e["tensors"]])))
            for p, g, c in zip(e["tensors"], grads, parts):
                if c is not None:
                    out[id(p)] = c.view(g.shape)
            if e["pending"] and not e["reduced_is_grads"]:
                e["reduced"], e["pending"] = red.detach().clone(), False
        for p in params:
            if p.grad is not None and id(p) not in out:
                out[id(p)] = p.grad.detach().clone()
        return out

    def take(self):
        self._copy_pending(keep_last_grads=True)
        out, self.buckets = self.buckets, []
        return out


class StepTap:
    """optimizer.step wrapped (a bound method, so lr schedulers created later can still wrap it).

    fingerprint (optional): params -> {id(param): checksum of its bytes and its optimizer state's}. With it the tap
    notices parameters (or their optimizer state) changed outside optimizer.step(): a checkpoint loaded on every
    rank, weights clipped after the step (WGAN), `p.data` edited. torch's version counter would miss the last:
    `p.data` has a counter of its own. The recorder takes one at each rec.step() (mark()); the tap one before
    and one after each optimizer.step(), so a change between rec.step() and the next optimizer.step() lands in
    `edited_before`, one between optimizer.step() and rec.step() in what mark() returns.

    It also notices an lr set outside the schedulers given to the recorder: the lrs it can explain are the groups'
    at its start and after each of those schedulers' step() (scheduled()); an optimizer.step() that runs with
    other lrs ran with lrs set by hand (a warmup written in the loop, adjust_learning_rate()) or by a scheduler
    the recorder was not given. take() returns the first such change since the last take(): (before, after)."""

    def __init__(self, opt, scheduler_count=lambda: 0, buckets=None, fingerprint=None):
        self.opt = opt
        self.calls = 0
        self.scheduler_count = scheduler_count
        self.schedulers_before = None  # scheduler.step() calls so far, at the last step
        self.lrs = None  # each group's lr at the last step
        self.hyper = None  # each group's hyper-parameters at the last step (OneCycleLR cycles momentum/betas)
        self.grads = None  # {id(param): grad copy} at the last step
        self.fingerprint = fingerprint
        self.last = None  # the latest fingerprints (at mark() or after an optimizer.step())
        self.edited_before = set()  # ids of params changed before an optimizer.step() since the last take()
        self.inside = 0  # optimizer.step() calls under way (a closure's forwards run inside one: LBFGS)
        self.lrs_explained = self._lrs()  # the lrs the recorder's start or a given scheduler's step() set
        self.lr_edit = None  # (lrs explained, lrs at the step) of the first lr set otherwise since the last take()
        original = opt.step

        def step(_self, *args, **kwargs):
            if self.fingerprint is not None:
                self.edited_before |= self._changed()
            self.calls += 1
            self.schedulers_before = scheduler_count()
            self.lrs = self._lrs()
            if self.lrs != self.lrs_explained:
                if self.lr_edit is None:
                    self.lr_edit = (self.lrs_explained, self.lrs)
                self.lrs_explained = self.lrs
            self.hyper = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
                           if k != "params" and isinstance(v, (int, float, bool, tuple))} for g in opt.param_groups]
            params = [p for g in opt.param_groups for p in g["params"]]
            if buckets is not None:
                self.grads = buckets.grads_at_step(params)
            else:
                self.grads = {id(p): p.grad.detach().clone() for p in params if p.grad is not None}
            self.inside += 1
            try:
                out = original(*args, **kwargs)
            finally:
                self.inside -= 1
            if self.fingerprint is not None:
                self.last = self._take(params)
            return out
        if getattr(original, "_with_counter", False):
            step._with_counter = True
        opt.step = types.MethodType(step, opt)

    def _params(self):
        return [p for g in self.opt.param_groups for p in g["params"]]

    def _lrs(self):
        return [float(g["lr"]) for g in self.opt.param_groups]

    def scheduled(self):
        """After a step() of a scheduler given to the recorder: the lrs it set are explained."""
        self.lrs_explained = self._lrs()

    def _take(self, params):
        """The fingerprints of params, or None: a failure of the recorder's own (a tensor it cannot read) turns
        the watch off rather than raising into the user's optimizer.step()."""
        if self.fingerprint is None:
            return None
        try:
            return self.fingerprint(params)
        except Exception:  # noqa: BLE001 - never into the user's loop
            self.fingerprint, self.last = None, None
            return None

    def _differ(self, now):
        """ids of the params whose fingerprint in `now` differs from the latest taken (none before the first)."""
        if now is None or self.last is None:
            return set()
        return {i for i, c in now.items() if i in self.last and self.last[i] != c}

    def _changed(self):
        return set() if self.last is None else self._differ(self._take(self._params()))

    def mark(self):
        """At rec.step() (and when the recorder starts): the ids of params changed since the last optimizer.step()
        (or the last mark), and a new fingerprint to compare the next optimizer.step()'s start with."""
        now = self._take(self._params())
        changed = self._differ(now)
        if now is not None:
            self.last = now
        return changed

    def take(self):
        out = (self.calls, self.lrs, self.grads, self.schedulers_before, self.hyper, self.lr_edit)
        self.calls, self.grads, self.lrs, self.schedulers_before, self.hyper = 0, None, None, None, None
        self.lr_edit = None
        return out

    def take_edited(self):
        out, self.edited_before = self.edited_before, set()
        return out


# torch.nn's modules whose own forward reads no self.training: a rank running one in eval mode computes what a
# training rank computes (containers, linear maps, convolutions, embeddings, activations but RReLU, pools, paddings,
# resampling and reshaping, the norms that keep no running statistics). BatchNorm, InstanceNorm, Dropout, RNNs and
# attention are judged by their settings (mode_dependence); any other torch module is taken to depend on the mode.
_MODE_FREE = tuple(c for c in (getattr(nn, n, None) for n in (
    "Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "Identity", "Linear",
    "LazyLinear", "Bilinear", "Embedding", "EmbeddingBag", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
    "ConvTranspose2d", "ConvTranspose3d", "LazyConv1d", "LazyConv2d", "LazyConv3d", "LazyConvTranspose1d",
    "LazyConvTranspose2d", "LazyConvTranspose3d", "Fold", "Unfold", "LayerNorm", "GroupNorm", "LocalResponseNorm",
    "CrossMapLRN2d", "ReLU", "ReLU6", "LeakyReLU", "PReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid",
    "Tanh", "Softmax", "Softmax2d", "LogSoftmax", "Softmin", "Softplus", "Softsign", "Softshrink", "Hardshrink",
    "Hardtanh", "Hardswish", "Hardsigmoid", "Tanhshrink", "Threshold", "GLU", "LogSigmoid", "MaxPool1d",
    "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "LPPool1d", "LPPool2d",
    "FractionalMaxPool2d", "FractionalMaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d", "ReflectionPad1d",
    "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "ZeroPad2d",
    "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d",
    "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Flatten", "Unflatten", "CosineSimilarity",
    "PairwiseDistance")) if c is not None)


def _reads_training(code):
    """Whether a code object, or one nested in it, names `training` (self.training, getattr(self, "training"))."""
    if "training" in code.co_names or "training" in code.co_consts:
        return True
    return any(_reads_training(c) for c in code.co_consts if isinstance(c, types.CodeType))


def _codes(klass):
    """The code of the functions a class defines itself (methods, static and class methods, properties)."""
    for v in vars(klass).values():
        if isinstance(v, (staticmethod, classmethod)):
            v = v.__func__
        elif isinstance(v, property):
            v = v.fget
        code = getattr(v, "__code__", None)
        if isinstance(code, types.CodeType):
            yield code


def mode_dependence(m):
    """Why module m's own forward computes another function in eval mode than in train mode (its submodules are
    judged on their own), or None where it computes the same: BatchNorm and InstanceNorm with running statistics,
    Dropout with p > 0, an RNN's dropout between layers, attention's dropout, RReLU; a torch module not known to
    ignore the mode; a class of the user's (or another library's) whose own code reads self.training."""
    name = type(m).__name__
    if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
        return "%s with running statistics" % name if m.track_running_stats else None
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return "%s(p=%g)" % (name, m.p) if m.p > 0 else None
    if isinstance(m, nn.MultiheadAttention):
        return "%s(dropout=%g)" % (name, m.dropout) if m.dropout > 0 else None
    if isinstance(m, nn.RNNBase):
        return "%s(dropout=%g)" % (name, m.dropout) if m.dropout > 0 and m.num_layers > 1 else None
    if isinstance(m, nn.RReLU):
        return "RReLU (random slopes in training)"
    for klass in type(m).__mro__:
        if klass is object or klass in _MODE_FREE:
            break  # (a torch module known to ignore the mode: its own bases are torch's, covered by it)
        if klass.__module__.split(".")[0] == "torch":
            return "%s (a torch module ddpcheck does not know to ignore the mode)" % klass.__name__
        if any(_reads_training(c) for c in _codes(klass)):
            return "%s (its code reads self.training)" % klass.__name__
    return None


def mode_dependent(module):
    """{submodule name ("(the model)" for the module itself): why its forward depends on train/eval mode}."""
    out = {}
    for n, m in module.named_modules():
        why = mode_dependence(m)
        if why is not None:
            out[n or "(the model)"] = why
    return out


_LOSSES = {"mse": nn.MSELoss, "cross_entropy": nn.CrossEntropyLoss}


def _to64(x):
    if torch.is_tensor(x):
        return x.detach().double() if x.is_floating_point() else x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_to64(v) for v in x)
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    return x


def _attributes_to64(module):
    """The floating tensors the copy's modules hold as plain attributes (a graph's edge weights, a cached table:
    neither parameters nor buffers, so .double() leaves them float32) made float64 like the rest of the copy."""
    for m in module.modules():
        for k, v in list(vars(m).items()):
            if torch.is_tensor(v) and v.is_floating_point() and v.dtype != torch.float64:
                vars(m)[k] = v.detach().double()


@contextlib.contextmanager
def _float32_casts_kept_float64():
    """While the float64 reference retries a forward: a float64 tensor cast to float32 (the AMP idiom
    `loss_fn(out.float(), y)`, `x.to(torch.float32)`) stays float64. The reference computes the user's function
    in float64; the cast is about the run's precision, and done here it meets float64 targets and weights."""
    to, to_float = torch.Tensor.to, torch.Tensor.float

    def keep_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if self.dtype == torch.float64 and out.dtype == torch.float32:
            return to(self, device=out.device)
        return out

    def keep_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else to_float(self, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.float = keep_to, keep_float
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float = to, to_float


_DRAWS = ("randn", "rand", "randn_like", "rand_like")
_DRAWS_IN_PLACE = ("normal_", "uniform_", "exponential_", "log_normal_", "cauchy_", "geometric_")


@contextlib.contextmanager
def _random_draws_in(dtype):
    """While the float64 reference recomputes a forward of a run in `dtype` (float32): a random draw asked for in
    float64 (torch.randn_like(mu) on the copy's float64 mu, a VAE's reparameterization; torch.randn(shape) under a
    float64 default dtype; x.normal_() on a float64 tensor) is drawn in `dtype` and widened. torch's generators
    draw other numbers for float64 than for float32 from the same state (randn of 16 elements or more, torch 1.13):
    drawn in float64 the reference's noise would not be the run's."""
    if dtype is None or dtype == torch.float64:
        yield
        return
    saved = {name: getattr(torch, name) for name in _DRAWS}
    saved_in_place = {name: getattr(torch.Tensor, name) for name in _DRAWS_IN_PLACE}

    def wide(name):
        f = saved[name]
        like = name.endswith("_like")

        def draw(*args, **kwargs):
            want = kwargs.get("dtype") or (args[0].dtype if like and args and torch.is_tensor(args[0])
                                           else torch.get_default_dtype())
            if want != torch.float64 or kwargs.get("out") is not None:
                return f(*args, **kwargs)
            grad = kwargs.pop("requires_grad", False)
            out = f(*args, **dict(kwargs, dtype=dtype)).to(torch.float64)
            return out.requires_grad_(grad) if grad else out
        return draw

    def wide_in_place(name):
        f = saved_in_place[name]

        def draw(self, *args, **kwargs):
            if self.dtype != torch.float64:
                return f(self, *args, **kwargs)
            with torch.no_grad():
                self.copy_(f(torch.empty(self.shape, dtype=dtype, device=self.device), *args, **kwargs))
            return self
        return draw

    for name in _DRAWS:
        setattr(torch, name, wide(name))
    for name in _DRAWS_IN_PLACE:
        setattr(torch.Tensor, name, wide_in_place(name))
    try:
        yield
    finally:
        for name, f in saved.items():
            setattr(torch, name, f)
        for name, f in saved_in_place.items():
            setattr(torch.Tensor, name, f)


def _clone(x):
    if torch.is_tensor(x):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _drop_user_hooks(module):
    """Removes from the reference's copy the forward and backward hooks the user put on the module (a feature
    extractor that keeps what it sees): run on the copy they would act on the user's state twice a step. Hooks of
    torch's own (the old spectral_norm and weight_norm, which compute the weight before each forward) stay."""
    def ours(h):
        where = getattr(h, "__module__", None) or type(h).__module__ or ""
        return where == "torch" or where.startswith("torch.")
    for m in module.modules():
        for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            hooks = getattr(m, name, None)
            if hooks:
                for key in [k for k, h in hooks.items() if not ours(h)]:
                    del hooks[key]


def _changed_loss(user_loss, outputs, forwards):
    """Why the reference cannot stand for the loop's objective, or None: the loss the loop passed to rec.step() is
    neither the loss module's value (summed or averaged over the step's forwards, or one forward's) nor a clean
    multiple of it (a
    whole factor, p/q with q <= 8, or 1/q: a scaled loss, whose factor the checks read), so the loop adds terms (a
    regularizer, a penalty) the reference, which computes the loss module's gradient, does not know."""
    if not isinstance(user_loss, float) or not math.isfinite(user_loss) or not outputs or None in outputs \
            or len(outputs) != forwards:
        return None
    whole = sum(outputs)
    # the step's objective, summed or averaged over its forwards, or one forward's value (a loop with micro-batches
    # passes the last micro-batch's loss, divided by the window or not)
    for base in [whole, whole / len(outputs)] + list(outputs):
        if base == 0:
            continue
        r = user_loss / base
        for q in range(1, 9):
            p = round(r * q)
            if p != 0 and abs(r - p / q) <= 1e-5 * abs(r):
                return None
        # 1/q for any whole q (a loss divided by the accumulation window times the world size: 1/12 at 4 x 3), where
        # the loop's float division leaves r within a few float32 roundings of it: a loss with added terms lands
        # that close to some 1/q with odds of about 2e-6 / |r|
        q = round(1 / r) if r != 0 and math.isfinite(1 / r) else 0
        if 8 < abs(q) <= 1 << 24 and abs(r - 1 / q) <= 1e-6 * abs(r):
            return None
    return ("the loss passed to rec.step() (%.9g) is not the loss module's value (%.9g over %d forward(s)) or a "
            "clean multiple of it: the loop adds terms (a regularizer, a penalty) that the reference, the loss "
            "module's gradient, does not know; pass loss_fn= a function of (output, target) computing the whole "
            "loss" % (user_loss, whole, len(outputs)))


def _holds_state(module):
    """Whether a module (a loss) has parameters or buffers of its own: a network in it (a discriminator)."""
    return isinstance(module, nn.Module) and (any(True for _ in module.parameters()) or
                                              any(True for _ in module.buffers()))


_MODULE_OWN = None


def _module_own():
    """The attributes torch's Module keeps itself (its hooks, its parameter and buffer dicts), but its mode."""
    global _MODULE_OWN
    if _MODULE_OWN is None:
        _MODULE_OWN = set(vars(nn.Module())) - {"training"}
    return _MODULE_OWN


def _settings(module):
    """Each submodule's train/eval mode and plain settings (attributes holding an int, float, bool or str that
    torch's Module does not keep itself: a temperature, a loss weight) as they are now."""
    if not isinstance(module, nn.Module):
        return None
    own = _module_own()
    return [None if isinstance(m, torch.jit.ScriptModule) else
            {k: v for k, v in vars(m).items() if k not in own and type(v) in (bool, int, float, str)}
            for m in module.modules()]


def _apply_settings(copy_, settings):
    """Gives the reference's copy the settings _settings() took from the user's module (the same structure)."""
    if settings is None:
        return
    copies = list(copy_.modules())
    if len(copies) != len(settings):
        return
    for m, s in zip(copies, settings):
        for k, v in (s or {}).items():
            if type(vars(m).get(k)) is type(v):
                vars(m)[k] = v


# What loss_state() takes of a loss: a tensor of at most LOSS_TENSOR_LIMIT elements (a larger one, and every
# tensor of a network of more elements than that in all, such as a teacher, is left out: hashed at every step it
# would cost more than the step), at most LOSS_TENSOR_BUDGET elements in all, at most LOSS_ITEMS values, through
# at most LOSS_DEPTH levels of modules, functions and objects. A tensor of at most LOSS_SHOWN elements is recorded
# by its values, a larger one by a checksum.
LOSS_TENSOR_LIMIT = 1 << 20
LOSS_TENSOR_BUDGET = 4 << 20
LOSS_ITEMS = 256
LOSS_DEPTH = 4
LOSS_SHOWN = 8
# Values that differ between ranks by design and are no setting of the loss: an int or a str named after the rank,
# its device or its seed (y.to(rank), a per-rank seed for sampling), a bool saying whether this rank logs
# (is_master, verbose; not KLDivLoss's log_target), a device string ("cuda:1") and a path (a per-rank log file).
_PER_RANK_NAME = re.compile(r"rank|gpu|device|cuda|seed", re.I)
_PER_RANK_FLAG = re.compile(r"rank|master|main|leader|chief|primary|verbose|^(do_|should_|is_)?(log|print)(ging)?$",
                            re.I)
_DEVICE_STR = re.compile(r"^(cpu|cuda|xpu|mps|hpu|npu|meta)(:\d+)?$")
_WRITTEN = {}  # id(code) -> (code, names the code itself stores to: a counter or an accumulator, not a setting)


def _nested(code):
    """A function's code and the code nested in it (a comprehension, a lambda, an inner function)."""
    todo = [code]
    while todo:
        c = todo.pop()
        yield c
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]


def _written(code):
    """The global, nonlocal and attribute names a function's code assigns (its own and its nested code's)."""
    hit = _WRITTEN.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    names = {i.argval for c in _nested(code) for i in dis.get_instructions(c) if i.opname in (
        "STORE_GLOBAL", "STORE_DEREF", "STORE_ATTR", "DELETE_GLOBAL", "DELETE_DEREF")}
    _WRITTEN[id(code)] = (code, names)
    return names


def _code_globals(code):
    """The global names a function's code (and its nested code: a comprehension, a lambda) reads."""
    return [n for c in _nested(code) for n in c.co_names]


def tensor_head(t):
    """How a recorded state names a tensor's kind: "tensor <dtype>[<shape>]"."""
    return "tensor %s%s" % (str(t.dtype).replace("torch.", ""), list(t.shape))


def tensor_text(t, digest):
    """A tensor as a recorded state holds it: its head and values where it has at most LOSS_SHOWN elements (a
    non-finite float as its repr), else its head and "crc <digest(t)>"."""
    if t.numel() <= LOSS_SHOWN:
        return "%s %r" % (tensor_head(t), [x if not isinstance(x, float) or math.isfinite(x) else repr(x)
                                            for x in t.detach().reshape(-1).tolist()])
    return "%s crc %s" % (tensor_head(t), digest(t.detach()))


def _library(f):
    """Whether f is torch's, numpy's or Python's own (F.cross_entropy): no setting of the user's in it."""
    mod = getattr(f, "__module__", None) or ""
    return mod.split(".")[0] in ("torch", "numpy", "builtins", "functools", "math", "operator", "_operator")


def loss_state(loss_fn, model, digest):
    """{name: value} of everything that parameterises the loss now (the recorder's loss_state, compared between
    ranks at each step: a pos_weight or class weights from a rank's own shard, a distillation alpha set per rank).
    For an nn.Module: its plain settings (int, float, bool, str attributes; not its train/eval mode), its buffers,
    parameters and tensor attributes, over its submodules. For a function, lambda, functools.partial or bound
    method: the numbers, bools, strings and tensors in its closure cells, its defaults, the globals its code reads,
    the partial's arguments and keywords, the bound object's attributes (modules and functions among them are
    followed the same way). Left out: the trained model (any module holding its parameters), names the function
    itself assigns (global or nonlocal counters; attributes its code sets), ints and strs named after the rank,
    device or seed, bools saying whether the rank logs, device strings, paths, and tensors over the limits above. Names say where a value came from:
    "attr:pos_weight", "attr:kd.T", "closure:alpha", "global:alpha", "default:T", "partial:alpha",
    "partial:args[0]", "self:alpha". A tensor is "tensor <dtype>[<shape>] [values]" or "... crc <digest>";
    a non-finite float its repr. digest(tensor) is the checksum. None for a loss named by a string."""
    if loss_fn is None or isinstance(loss_fn, str):
        return None
    return _walk_state(loss_fn, {id(q) for q in model.parameters()}, digest)


# What model_state() takes of the model: its plain attribute tensors up to MODEL_TENSOR_LIMIT elements each, and
# MODEL_TENSOR_BUDGET elements hashed a step (a tensor whose _version and storage did not change since the step
# before is not hashed again: a graph held as an attribute costs one checksum for the run).
MODEL_TENSOR_LIMIT = 1 << 24
MODEL_TENSOR_BUDGET = 1 << 26
MODEL_ITEMS = 1024


def model_state(model, digest, cache=None):
    """{name: value} of what the DDP-wrapped module's submodules hold that DDP does not broadcast (the recorder's
    model_state, compared between ranks at each step: a graph's edge_index or a mask built from a per-rank seed and
    held as a plain attribute, self.edge_index = ..., gives each rank another model). Each submodule's plain
    settings (int, float, bool, str attributes) and the tensors it holds as plain attributes (in vars(m): not its
    parameters, not its buffers, which DDP broadcasts, nor a tensor that is one of them). Left out as in
    loss_state (per-rank names, device strings, paths), and also: attributes the module's forward (or a method of
    its class that forward calls) assigns (the last batch's cache, a counter), functions and other objects, and
    tensors over MODEL_TENSOR_LIMIT elements. Names "attr:<submodule path>.<attribute>". cache: a dict kept between
    calls (id -> tensor, _version, storage, digest) so an unchanged tensor is not hashed again."""
    if not isinstance(model, nn.Module):
        return None
    broadcast = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    return _walk_state(model, broadcast, digest, model=True, cache=cache)


def _forward_written(klass):
    """The attribute names a module class's forward assigns, with those of the methods of its class that forward
    calls (self.propagate(...) setting self.cache), followed through their calls too."""
    fwd = getattr(getattr(klass, "forward", None), "__code__", None)
    if fwd is None:
        return ()
    names, todo, done = set(), [fwd], set()
    while todo:
        code = todo.pop()
        if id(code) in done:
            continue
        done.add(id(code))
        names |= _written(code)
        for n in _code_globals(code):
            f = getattr(getattr(klass, n, None), "__code__", None)
            if isinstance(f, types.CodeType) and n not in ("__init__", "forward"):
                todo.append(f)
    return names


def _walk_state(root, trained, digest, model=False, cache=None):
    """loss_state's and model_state's walk of root (a module or a function). model: root is the trained module
    (its parameters and buffers are left out, functions are not followed, larger tensors are hashed)."""
    seen, out = set(), {}
    budget = [MODEL_TENSOR_BUDGET if model else LOSS_TENSOR_BUDGET]
    limit = MODEL_TENSOR_LIMIT if model else LOSS_TENSOR_LIMIT
    kept = {}  # this call's cache: only the tensors seen now

    def put(name, v):
        if name not in out and (model or len(out) < LOSS_ITEMS):
            out[name] = v

    def value(name, v, depth, tensors=True, skip=()):
        leaf = name.rsplit(".", 1)[-1].split(":")[-1]
        if leaf in skip:
            return
        if type(v) in (bool, int, str, float) or isinstance(v, np.generic) and v.size == 1:
            v = v.item() if isinstance(v, np.generic) else v
            if type(v) in (int, str) and _PER_RANK_NAME.search(leaf) or type(v) is bool and _PER_RANK_FLAG.search(
                    leaf) or type(v) is str and (_DEVICE_STR.match(v) or "/" in v or "\\" in v or len(v) > 200):
                return
            put(name, v if type(v) is not float or math.isfinite(v) else repr(v))
        elif isinstance(v, (tuple, list)) and 0 < len(v) <= 64 and all(type(e) in (bool, int, float) for e in v):
            put(name, repr(tuple(v)))  # class weights as a list of floats; repr of a float is exact
        elif torch.is_tensor(v):
            if not tensors or id(v) in trained or v.numel() > limit or v.layout != torch.strided:
                return
            if v.numel() <= LOSS_SHOWN:
                put(name, tensor_text(v, digest))
                return
            key = (v._version, v.data_ptr(), v.dtype, tuple(v.shape), tuple(v.stride()))
            hit = (cache or {}).get(id(v))
            if hit is not None and hit[0] is v and hit[1] == key:
                d = hit[2]
            elif v.numel() > budget[0]:
                return
            else:
                budget[0] -= v.numel()
                d = digest(v)
            kept[id(v)] = (v, key, d)
            put(name, "%s crc %s" % (tensor_head(v), d))
        elif model:
            return  # the model's functions and other objects: not its state
        elif depth < LOSS_DEPTH and id(v) not in seen:
            if isinstance(v, nn.Module):
                module(name + ".", v, depth + 1, tensors)
            elif callable(v) and not isinstance(v, type):
                function(name, v, depth + 1, tensors)

    sizes = {}

    def size(m):
        """The elements of m's own tensors and of its submodules that are no network (LOSS_TENSOR_LIMIT)."""
        if id(m) not in sizes:
            sizes[id(m)] = 0  # (a module that holds itself)
            own = sum(t.numel() for t in list(m._parameters.values()) + list(m._buffers.values())
                      if t is not None and id(t) not in trained)
            sizes[id(m)] = own + sum(n for n in (size(c) for c in m.children()) if n <= LOSS_TENSOR_LIMIT)
        return sizes[id(m)]

    def module(prefix, m, depth, tensors=True):
        seen.add(id(m))
        if isinstance(m, torch.jit.ScriptModule):
            return  # compiled
        if not model:
            params = [id(q) for q in m.parameters()]
            if params and all(q in trained for q in params):
                return  # the model itself (a loss holding it for a penalty: DDP keeps it equal)
            # a network (a teacher, a perceptual loss's backbone) has its settings recorded only; a loss holding one
            # still has its own tensors and its other submodules' recorded
            tensors = tensors and size(m) <= LOSS_TENSOR_LIMIT
        skip = _forward_written(type(m))  # attributes its forward sets (a counter, the last batch's cache)
        own = _module_own()
        for k, v in vars(m).items():
            if k not in own and k != "training" and not k.startswith("__") and not k.startswith("_ddp"):
                value(prefix + k, v, depth, tensors, skip)
        for k, t in [] if model else list(m._parameters.items()) + list(m._buffers.items()):
            if t is not None:
                value(prefix + k, t, depth, tensors, skip)
        for k, c in m._modules.items():
            if c is not None and id(c) not in seen:
                module(prefix + k + ".", c, depth + 1, tensors)

    def function(name, f, depth, tensors=True):
        seen.add(id(f))
        sub = (name + ".") if name else ""
        if isinstance(f, functools.partial):
            for i, a in enumerate(f.args):
                value("%spartial:args[%d]" % (sub, i), a, depth, tensors)
            for k, a in f.keywords.items():
                value("%spartial:%s" % (sub, k), a, depth, tensors)
            if id(f.func) not in seen:
                function(name, f.func, depth, tensors)
            return
        if isinstance(f, types.MethodType):
            if isinstance(f.__self__, nn.Module):
                if id(f.__self__) not in seen:
                    module(sub + "self:", f.__self__, depth, tensors)
            else:
                self_vars(sub + "self:", f.__self__, depth, tensors, f.__func__)
            f = f.__func__
        code = getattr(f, "__code__", None)
        if code is None:  # a callable object of the user's (a class with __call__)
            call = getattr(type(f).__call__, "__code__", None)
            if not isinstance(f, types.BuiltinFunctionType) and not _library(type(f)):
                self_vars(sub + "self:", f, depth, tensors, type(f).__call__ if call is not None else None)
            return
        if _library(f):
            return
        skip = _written(code)
        for var, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:  # a cell not yet filled
                continue
            value(sub + "closure:" + var, v, depth, tensors, skip)
        params = code.co_varnames[:code.co_argcount]
        for var, v in zip(params[len(params) - len(f.__defaults__ or ()):], f.__defaults__ or ()):
            value(sub + "default:" + var, v, depth, tensors)
        for var, v in (f.__kwdefaults__ or {}).items():
            value(sub + "default:" + var, v, depth, tensors)
        g = getattr(f, "__globals__", {})
        for var in _code_globals(code):
            if var in g and not isinstance(g[var], types.ModuleType):
                value(sub + "global:" + var, g[var], depth, tensors, skip)

    def self_vars(prefix, obj, depth, tensors, method):
        seen.add(id(obj))
        code = getattr(method, "__code__", None)
        skip = _written(code) if code is not None else ()
        for k, v in (vars(obj) if hasattr(obj, "__dict__") else {}).items():
            if not k.startswith("__"):
                value(prefix + k, v, depth, tensors, skip)

    if isinstance(root, nn.Module):
        module("attr:", root, 0)
    else:
        function("", root, 0)
    if cache is not None:
        cache.clear()
        cache.update(kept)
    if not model:
        return out
    # a model's plain settings one entry per submodule ("settings:<path>" -> "eps=1e-05 p=0.1"; a ResNet's hundreds
    # of them each step), its attribute tensors one entry each, tensors first, at most MODEL_ITEMS
    tensors, settings = {}, {}
    for name, v in out.items():
        if isinstance(v, str) and v.startswith("tensor "):
            tensors[name] = v
        else:
            path, _, leaf = name[len("attr:"):].rpartition(".")
            settings.setdefault("settings:" + (path or "(model)"), []).append("%s=%r" % (leaf, v))
    tensors.update((k, " ".join(v)) for k, v in settings.items())
    return dict(list(tensors.items())[:MODEL_ITEMS])


# What the reference captured of one step: every forward (args, RNG state, kwargs, settings, buffers), the targets
# and settings of the loss module's calls and its values, the starting state, autocast and the parameters trained.
Capture = collections.namedtuple("Capture", "inputs targets start autocast trainable loss_settings loss_outputs")


class Reference:
    """float64 gradients of this rank's micro-batches, recomputed on a deep copy of the module and loss."""

    def __init__(self, module, loss_fn):
        self.note = None
        self.model = None
        # The run's floating dtype (its first floating parameter's): the reference draws its random numbers in it
        self.run_dtype = next((q.dtype for q in module.parameters() if q.is_floating_point()), None)
        try:
            self.model = copy.deepcopy(module).double()
        except Exception as e:  # noqa: BLE001 - any module that cannot be copied: say so, record the rest
            self.note = "no single-process reference: the module cannot be deep-copied (%s)" % e
        if self.model is not None and any(not q.is_leaf for q in self.model.parameters()):
            # a torch.jit.script submodule's parameters, deep-copied, are not leaves (torch 1.13): no .grad
            self.note = ("no single-process reference: the module's copy has parameters that are not leaves (a "
                         "torch.jit.script submodule?), so their gradients cannot be recomputed")
            self.model = None
        if self.model is not None:
            _drop_user_hooks(self.model)
            _attributes_to64(self.model)
        if isinstance(loss_fn, str):
            loss_fn = _LOSSES[loss_fn]() if loss_fn in _LOSSES else None
        self.loss = copy.deepcopy(loss_fn).double() if isinstance(loss_fn, nn.Module) else loss_fn
        if isinstance(self.loss, nn.Module):
            _drop_user_hooks(self.loss)
        if self.loss is None and self.note is None:
            self.note = "no single-process reference: pass loss_fn= (a module or a function of (output, target))"
        self.user_loss = loss_fn if isinstance(loss_fn, nn.Module) else None
        self.start = None  # the step's starting state_dict
        self.inputs = []  # [[args, rng_state, kwargs]] of every forward of the step
        self.kwargs = None  # the keyword arguments of the forward under way (set by the recorder's DDP wrapper)
        self.trainable = None  # names of the parameters that required grad in the step's forwards
        self.targets = []  # targets the loss module saw
        self.loss_settings = []  # (plain settings, state_dict of a loss with parameters) at each of those calls
        self.loss_outputs = []  # the loss module's value at each of those calls (floats)
        self.autocast = False  # a forward of the step ran under CPU autocast
        self.last_loss = None
        self.losses = []
        self._spare = []  # gradient dicts compute() returned that are written: reused (fresh memory is slow)

    def recycle(self, grads):
        """grads, a dict compute() returned, is no longer needed (its files are written): its tensors are reused.
        May run on the recorder's writer thread."""
        if len(self._spare) < 2:
            self._spare.append(grads)

    def _zeros(self, params):
        """{name: zeros like the parameter}: a recycled dict zeroed when its tensors match, else new tensors."""
        spare = self._spare.pop() if self._spare else None
        if spare is None or list(spare) != list(params) or any(
                t.dtype != p.dtype or t.shape != p.shape or t.stride() != p.stride() for t, p in
                zip(spare.values(), params.values())):
            return {n: torch.zeros_like(p) for n, p in params.items()}
        for t in spare.values():
            t.zero_()
        return spare

    def on_forward(self, module, args):
        if not torch.is_grad_enabled():
            return  # an evaluation forward: no gradient to reproduce
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        if not trainable:
            return  # the module frozen (a GAN's discriminator in the generator's step): no gradient of its own
        if self.start is None:
            self.start = {k: v.detach().clone() for k, v in module.state_dict().items()}
            self.trainable = set()
        self.trainable |= trainable
        # each submodule's train/eval mode and plain settings as it ran (a model left in eval mode when the
        # recorder was built, a router temperature the loop anneals): the copy runs with them, not with those it
        # had when it was copied
        # and the buffers it starts from (spectral norm's u and v move at every training forward, a BatchNorm's
        # statistics too; inside DDP, after its buffer broadcast)
        buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
        self.inputs.append([_clone(args), torch.get_rng_state(), _clone(self.kwargs or {}), _settings(module), buffers])
        self.autocast = self.autocast or torch.is_autocast_cpu_enabled()

    def on_loss(self, _module, args):
        # One target per captured forward: a loss call on the output of a forward not captured (a frozen module's,
        # or another model's through a shared criterion) has no gradient of this module to match.
        if len(args) >= 2 and len(self.targets) < len(self.inputs):
            self.targets.append(_clone(args[1]))
            # a temperature the loop schedules; and where the loss is itself a network (a GAN generator's loss
            # through the discriminator, a perceptual loss), its state as it is now: the discriminator steps between
            # calls, and the reference's copy, taken when the recorder started, would judge by a stale one
            state = None
            if _holds_state(_module):
                state = {k: v.detach().clone() for k, v in _module.state_dict().items()}
            self.loss_settings.append((_settings(_module), state))
            self._loss_pending = True

    def on_loss_output(self, _module, output):
        """The loss module's value for the call on_loss took (compared with what the loop passes to rec.step)."""
        if getattr(self, "_loss_pending", False):
            self._loss_pending = False
            ok = torch.is_tensor(output) and output.numel() == 1
            self.loss_outputs.append(float(output.detach()) if ok else None)

    def take(self):
        """The step's Capture, taken: the next step's capture starts afresh."""
        captured = Capture(self.inputs, self.targets, self.start, self.autocast, self.trainable, self.loss_settings,
                           self.loss_outputs)
        self.inputs, self.targets, self.start, self.autocast, self.trainable = [], [], None, False, None
        self.loss_settings, self.loss_outputs = [], []
        return captured

    def compute(self, captured, yb, user_loss=None):
        """({param name: float64 grad} averaged over the step's micro-batches, or None, why or facts). Summed
        instead where the loss the loop passed to rec.step (user_loss) is the sum of the forwards' losses, not
        their mean: one objective over several forwards (a GAN's discriminator on real and fake), not gradient
        accumulation."""
        inputs, targets, start, autocast, trainable, loss_settings, outputs = captured
        facts = {"microbatches": len(inputs), "autocast": autocast,
                 "rows": sum(int(a[0].shape[0]) for a, *_ in inputs if a and torch.is_tensor(a[0]) and a[0].dim())}
        if self.note:
            return None, self.note
        if not inputs:
            return None, "no forward of the module was seen in this step (a module.<method>() call?)"
        if len(targets) != len(inputs):
            rows = [int(a[0].shape[0]) if a and torch.is_tensor(a[0]) and a[0].dim() else -1 for a, *_ in inputs]
            if len(inputs) == 1 and yb is not None:
                targets = [yb]
            elif not targets and torch.is_tensor(yb) and yb.dim() and min(rows) >= 0 and sum(rows) == yb.shape[0]:
                # Micro-batches cut from the step's batch in order (a loss function, not a module, sees the
                # targets): rec.step()'s yb split by each forward's rows.
                targets = list(torch.split(yb, rows))
            elif len(targets) < len(inputs) and targets:
                return None, ("%d forwards but the loss module was called on %d of them (a loss over several "
                              "forwards' outputs, as contrastive learning's, or forwards that are not the step's): the "
                              "reference needs one loss call per forward" % (len(inputs), len(targets)))
            else:
                return None, ("%d forwards but %d targets: pass the loss module you call as loss_fn=, or yb to "
                              "rec.step()" % (len(inputs), len(targets)))
        changed = _changed_loss(user_loss, outputs, len(inputs))
        if changed and (len(inputs) != 1 or not outputs[0]):
            return None, changed
        if changed:
            # One forward: the loss module's gradient is still computed, with the ratio of the loss the loop passed
            # to the module's value. ddpcheck tests whether the rank's local gradient is that ratio times this
            # reference (a loss scaled on this rank: loss-scale-per-rank where the ranks' ratios differ); an added
            # term (a regularizer) is not a pure scaling and stays unchecked.
            facts["loss_ratio"] = user_loss / outputs[0]
            facts["changed"] = changed
        keep = torch.get_rng_state()
        # Only the parameters that require grad (frozen layers of a fine-tuned model have none, in the run too).
        if trainable is None:
            trainable = {n for n, _ in self.model.named_parameters()}
        params = {}
        for n, q in self.model.named_parameters():
            q.requires_grad_(n in trainable)
            if n in trainable:
                params[n] = q
        total = self._zeros(params)
        try:
            self._accumulate(inputs, targets, start, params, total, loss_settings)
        except Exception as e:  # noqa: BLE001 - the user's loss or model on float64: report, never break the run
            return None, "single-process reference failed: %s: %s" % (type(e).__name__, str(e).splitlines()[0])
        finally:
            torch.set_rng_state(keep)
        facts["loss"] = self.last_loss  # the float64 loss of the step's last micro-batch
        if len(inputs) == 1:  # x / 1 is x, bit for bit: the division is skipped (total is this step's own)
            return total, facts
        losses = self.losses
        if isinstance(user_loss, float) and math.isfinite(user_loss) and len(losses) == len(inputs):
            whole = sum(losses)
            tol = 1e-4 * max(abs(whole), abs(whole / len(losses)), 1e-30)
            if abs(user_loss - whole) <= tol and abs(user_loss - whole / len(losses)) > tol:
                facts["objective"] = "sum"
                return total, facts
        out = {n: g / len(inputs) for n, g in total.items()}
        self.recycle(total)
        return out, facts

    def _accumulate(self, inputs, targets, start, params, total, loss_settings=()):
        self.losses = []  # each forward's float64 loss
        # A loss with a network in it (a GAN generator's loss through the discriminator) that the loop does not call
        # itself (no state was captured at a call): its state now, at rec.step(), not the copy's from when the
        # recorder started (the discriminator steps every iteration)
        if isinstance(self.loss, nn.Module) and len(loss_settings) < len(inputs) and _holds_state(self.user_loss):
            with torch.no_grad():
                self.loss.load_state_dict(self.user_loss.state_dict())
        for k, ((args, rng, kwargs, settings, buffers), y) in enumerate(zip(inputs, targets)):
            def forward():
                with torch.no_grad():
                    self.model.load_state_dict(start)
                    for n, b in self.model.named_buffers():
                        if n in buffers and buffers[n].shape == b.shape:
                            b.copy_(buffers[n])
                _apply_settings(self.model, settings)
                if isinstance(self.loss, nn.Module) and k < len(loss_settings):
                    loss_plain, loss_state = loss_settings[k]
                    _apply_settings(self.loss, loss_plain)
                    if loss_state is not None:
                        with torch.no_grad():
                            self.loss.load_state_dict(loss_state)  # (float values into the float64 copy)
                torch.set_rng_state(rng)
                return self.loss(self.model(*_to64(args), **_to64(kwargs)), _to64(y))
            # backward() into the copy's own .grad, not torch.autograd.grad: reentrant activation checkpointing
            # (torch.utils.checkpoint's default in 1.13) supports only the former.
            for q in params.values():
                q.grad = None
            try:
                with _random_draws_in(self.run_dtype):
                    loss = forward()
                    loss.backward()
            except RuntimeError as e:
                # A forward that makes float32 tensors of its own (an RNN's zero state, torch.zeros(B, H)) or casts
                # to float32 (out.float() before the loss) meets the float64 copy's: again with float64 as torch's
                # default dtype and float32 casts of float64 tensors kept float64, only where dtypes clashed (random
                # draws stay the run's: _random_draws_in)
                if not any(w in str(e) for w in ("dtype", "scalar type", "type (", "Double", "Float")):
                    raise
                for q in params.values():
                    q.grad = None
                default = torch.get_default_dtype()
                torch.set_default_dtype(torch.float64)
                try:
                    with _float32_casts_kept_float64(), _random_draws_in(self.run_dtype):
                        loss = forward()
                        loss.backward()  # (a reentrant checkpoint runs the forward again in the backward)
                finally:
                    torch.set_default_dtype(default)
            self.last_loss = float(loss.detach())
            self.losses.append(self.last_loss)
            for n, q in params.items():
                if q.grad is not None:
                    total[n] += q.grad
                    q.grad = None
