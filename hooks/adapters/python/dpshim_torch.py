"""dpshim's PyTorch adapter: makes an unmodified PyTorch script data-parallel.

Loaded by dpshim's sitecustomize into a Python rank process; at world size 1 it does nothing at
all, else it agrees the random state at once and hooks the rest when the script imports torch.
All collectives are the shim's hook ABI (hooks/include/dpshim/hooks.h), called through ctypes on
the already loaded libdpshim.so, so the guard, diagnostics and policy apply as for a C
framework. What it hooks:

- the end of every backward pass (torch.autograd.backward, which Tensor.backward calls): the
  gradients of every optimizer's parameters are averaged (dp_grads, weighted by each rank's share
  of the global batch in split mode), so gradient clipping, GradScaler's inf checks and anything
  else between backward and step see the global gradient, as with DDP; a parameter without a
  gradient on some ranks gets zeros there, one without a gradient on every rank is left alone;
  with [comm] overlap on, hooks on the gradient accumulators announce gradients during backward
  (dp_grad_ready);
- every torch.optim optimizer's step: the same averaging if no backward did it since the last
  step (gradients set by hand), and dp_step_end after; with [optim] shard, each rank steps its
  share of the parameters and sends it to the others (dp_from_owners), and state_dict() gathers
  the whole state;
- the first forward of a module (and the first after its load_state_dict): its parameters and
  buffers are broadcast from rank 0 (dp_params);
- BatchSampler: every rank draws the same shuffled order (RandomSampler's seed agreed with
  dp_seed); split mode keeps this rank's share of each batch (dp_batch), scale mode 1/N of each
  epoch (dp_epoch);
- BatchNorm in training mode: batch statistics over all ranks (dp_bn_stats), exactly, also for
  unequal local batches, in forward and backward;
- random state: at interpreter start every rank takes rank 0's seeds for Python's random,
  NumPy's legacy global generator and torch's global generators (the latter two when imported);
  calls of torch.manual_seed, torch.seed, random.seed and numpy.random.seed take rank 0's
  argument;
- evaluation: a loader iterated under torch.no_grad()/inference_mode, or with every model that
  ran in eval mode, gives every rank the whole data set ([data] eval = whole);
- losses: a loss function's training loss is the global batch's value as soon as it returns, so
  a script's own stop criteria and prints agree across ranks (its gradient is this rank's).
Each collective names the script line it comes from for the guard's desync reports.
"""

import collections
import ctypes
import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import struct
import sys
import threading

_DTYPES = {}  # torch dtype -> DP_* code, filled when torch is imported
DP_HOST = -1
DP_SUM, DP_MAX = 0, 3


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("count", ctypes.c_uint64), ("dtype", ctypes.c_int32),
                ("device", ctypes.c_int32), ("name", ctypes.c_char_p)]


def _library_handle():
    """The preloaded libdpshim.so; None where this process does not have it loaded (a child
    started without LD_PRELOAD that inherited the path to the adapter)."""
    try:
        return ctypes.CDLL("libdpshim.so", mode=os.RTLD_NOLOAD)  # by its soname, wherever it lies
    except OSError:
        return None


def _holds_rank(lib):
    """This process holds the rank's place in the job, or takes it now: the rank process, or the
    trainer a wrapper (/usr/bin/time, a shell line) started; not a child of the process that
    holds it (a subprocess of the script, a spawned worker)."""
    lib.dpshim_claim_rank.restype, lib.dpshim_claim_rank.argtypes = ctypes.c_int, []
    return lib.dpshim_claim_rank() == 1


class _Shim:
    def __init__(self, lib):
        self.lib = lib
        for name, res, args in (
                ("dp_rank", ctypes.c_int, []), ("dp_world_size", ctypes.c_int, []),
                ("dp_params", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.c_size_t]),
                ("dp_from_owners", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.c_size_t,
                                                  ctypes.POINTER(ctypes.c_int32)]),
                ("dp_seed", ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64)]),
                ("dp_batch", ctypes.c_size_t, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
                ("dp_epoch", ctypes.c_size_t, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
                ("dpshim_batch_whole", ctypes.c_size_t, [ctypes.c_uint64]),
                ("dp_grads", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.c_size_t]),
                ("dpshim_grads_summed", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.c_size_t]),
                ("dp_grad_ready", ctypes.c_int, [ctypes.POINTER(_Tensor)]),
                ("dp_bn_stats", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.POINTER(_Tensor),
                                               ctypes.POINTER(ctypes.c_uint64)]),
                ("dp_metric", ctypes.c_int, [ctypes.POINTER(ctypes.c_double), ctypes.c_size_t, ctypes.c_int]),
                ("dp_step_end", ctypes.c_int, [ctypes.c_uint64]),
                ("dp_set_stream", ctypes.c_int, [ctypes.c_int32, ctypes.c_void_p])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
            setattr(self, name, _sited(f, lib.dpshim_site) if name in _COLLECTIVES else f)
        lib.dpshim_policy_value.restype = ctypes.c_char_p
        lib.dpshim_policy_value.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        self.eval_whole = lib.dpshim_policy_value(b"data", b"eval") == b"whole"
        self.split = lib.dpshim_policy_value(b"data", b"mode") == b"split"
        self.bn_sync = lib.dpshim_policy_value(b"bn", b"sync") == b"on"
        self.shard = lib.dpshim_policy_value(b"optim", b"shard").decode()
        self.alone = lib.dpshim_policy_value(b"comm", b"backend") == b"self"  # no collective moves data
        lib.dpshim_overlap.restype, lib.dpshim_overlap.argtypes = ctypes.c_int, []
        self.overlap = lib.dpshim_overlap  # the job's decision, known once the backend is open
        self.size = self.dp_world_size()
        self.rank = self.dp_rank()
        self.steps = 0


_COLLECTIVES = ("dp_params", "dp_from_owners", "dp_seed", "dp_grads", "dpshim_grads_summed", "dp_grad_ready", "dp_bn_stats",
                "dp_metric", "dp_step_end")
_HERE = os.path.dirname(os.path.abspath(__file__))
# Python's standard library, the adapter, and torch's package once imported: no script lines there
_LIBRARY_DIRS = (os.path.dirname(os.__file__) + os.sep, _HERE + os.sep)


def _script_line():
    """file:line of the innermost frame that is the script's own, for the guard's reports."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_LIBRARY_DIRS) and not name.startswith("<frozen"):
            return ("%s:%d in %s" % (os.path.basename(name), f.f_lineno, f.f_code.co_name)).encode()
        f = f.f_back
    return b""


def _sited(hook, site):
    site.restype, site.argtypes = None, [ctypes.c_char_p]

    def call(*args):
        site(_script_line())
        return hook(*args)
    return call


_shim = None
_rank_pid = os.getpid()
_aside = None  # why the adapter stepped aside: the script distributes itself


def _acting():
    """The adapter acts here: in the rank's own process (not a DataLoader worker or another
    child), and while the script does not distribute itself."""
    return _aside is None and os.getpid() == _rank_pid


def _step_aside(why):
    """The script distributes itself (torch.distributed, DDP, FSDP, a DistributedSampler): from
    now on the adapter shards nothing, averages nothing, broadcasts nothing and leaves BatchNorm
    and seeds alone, in this process; the shim keeps the file and output policy and the guard.
    Every rank gets here from the same call of the script (init_process_group is itself
    collective)."""
    global _aside
    if _aside is None and os.getpid() == _rank_pid:
        _aside = why
        _shim.lib.dpshim_step_aside(why.encode("utf-8", "replace"))
# per thread: the nesting depth of optimizer steps and of loss functions, how many ranks share
# the batch the loop got last (1, or all of them for a batch every rank takes whole), and whether
# this rank holds a share of it (not so for a batch every rank takes whole or makes by hand)
_state = threading.local()


def _check(rc, what):
    if rc != 0:
        raise RuntimeError("dpshim: %s failed (see the [dpshim] message above)" % what)


def _tensors(ts):
    arr = (_Tensor * max(len(ts), 1))()
    stream_of = None
    for i, t in enumerate(ts):
        if t.device.type == "cuda":
            device = t.device.index if t.device.index is not None else 0
            if stream_of is None:
                # the hook orders its collective after the work queued on torch's current
                # stream and makes that stream wait for the result (hook ABI version 2)
                import torch
                stream_of = device
                _check(_shim.dp_set_stream(device, torch.cuda.current_stream(t.device).cuda_stream),
                       "dp_set_stream")
        elif t.device.type == "cpu":
            device = DP_HOST
        else:
            raise RuntimeError("dpshim: tensor on %s: dpshim reduces CPU and CUDA tensors" % t.device)
        code = _DTYPES.get(t.dtype)
        if code is None:
            raise RuntimeError("dpshim: cannot reduce a tensor of dtype %s" % t.dtype)
        arr[i] = _Tensor(t.data_ptr(), t.numel(), code, device, None)
    return arr


def _contiguous_views(ts):
    """Contiguous tensors to hand to the shim, and the ones to copy back afterwards."""
    out, back = [], []
    for t in ts:
        if t.is_contiguous():
            out.append(t)
        else:
            c = t.contiguous()
            out.append(c)
            back.append((t, c))
    return out, back


def _in_place(hook, name, ts, as_sent=lambda v: v):
    """hook(tensors, n) of the hook ABI on ts, in place: non-contiguous tensors go through
    contiguous copies that are copied back."""
    import torch
    with torch.no_grad():
        views, back = _contiguous_views(ts)
        sent = [as_sent(v) for v in views]
        _check(hook(_tensors(sent), len(sent)), name)
        for t, c in back:
            t.copy_(c)
    return back


# --- parameters and buffers: rank 0's values on every rank before the first forward ---

def _is_lazy(t):
    import torch
    return isinstance(t, torch.nn.parameter.UninitializedTensorMixin)


def _broadcast_module(module):
    """Rank 0's parameters and buffers everywhere; False while a lazy module is uninitialized."""
    seen, ts = set(), []
    for t in list(module.parameters()) + list(module.buffers()):
        if _is_lazy(t):
            return False  # shapes come with the first forward: broadcast at the next one
        if id(t) not in seen:
            seen.add(id(t))
            ts.append(t)
    _broadcast_tensors(ts)
    return True


def _as_bytes_where_unnamed(v):
    """A broadcast moves bytes: a tensor of a dtype the hook ABI has no name for (bool masks,
    int8, complex) travels as its bytes."""
    import torch
    return v if v.dtype in _DTYPES else v.reshape(-1).view(torch.uint8)


def _broadcast_tensors(ts):
    if not ts:
        return
    datas = [t.data for t in ts]
    back = _in_place(_shim.dp_params, "dp_params", datas, _as_bytes_where_unnamed)
    # the drift check ([guard] drift_every) reads what dp_params saw again at step ends: a
    # non-contiguous tensor went as a copy, which is kept alive and brought up to date before
    # each step end, so the check never reads freed memory
    import weakref
    owner = {id(d): t for d, t in zip(datas, ts)}
    _drift_copies.extend((weakref.ref(owner[id(d)]), c) for d, c in back)


_drift_copies = []  # (a non-contiguous parameter, the copy dp_params saw)


def _refresh_drift_copies():
    import torch
    with torch.no_grad():
        for ref, c in _drift_copies:
            t = ref()
            if t is not None:
                c.copy_(t)


_synced = None  # modules whose parameters are rank 0's (a WeakSet once torch is here)


def _forward_pre_hook(module, args):
    if module in _synced or not _acting():  # DataLoader workers run transforms
        return None
    if not _broadcast_module(module):
        return None
    import weakref
    _forwarded.append(weakref.ref(module))
    for m in module.modules():
        _synced.add(m)
    return None


# --- gradients: averaged before every optimizer step ---

_optimizers = []  # weak references to every optimizer, in creation order (the same on all ranks)


def _parameters(optimizers):
    params, seen = [], set()
    for optimizer in optimizers:
        for ps in _full_groups.get(id(optimizer)) or [g["params"] for g in optimizer.param_groups]:
            for p in ps:
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
    return params


def _live_optimizers():
    live = [r() for r in _optimizers]
    _optimizers[:] = [r for r, o in zip(_optimizers, live) if o is not None]
    return [o for o in live if o is not None]


def _reduce_gradients(params, summed=False):
    import torch
    if not params:
        return
    key = tuple(map(id, params))
    anywhere = _anywhere.get(key)
    if anywhere is None or _shim.overlap():
        # which parameters have a gradient anywhere: one small all-reduce, so every rank reduces
        # the same list even when some rank's backward never reached a parameter
        have = (ctypes.c_double * len(params))(*[0.0 if p.grad is None else 1.0 for p in params])
        _check(_shim.dp_metric(have, len(params), DP_MAX), "dp_metric")
        _anywhere[key] = anywhere = [bool(h) for h in have]
        _average(_with_zeros(params, anywhere), summed)
        return
    # the same parameters as last time, most likely: their gradients go at once, and which ones
    # each rank has rides along as a small tensor (its weighted sum is positive where any rank
    # has one); where that differs from last time, every rank sees it alike and fixes it up
    flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in params], dtype=torch.float64)
    zeroed = [i for i, (p, a) in enumerate(zip(params, anywhere)) if a and p.grad is None]
    _average(_with_zeros(params, anywhere) + [flags], summed)
    now = [f > 0 for f in flags.tolist()]
    if now != anywhere:
        _anywhere[key] = now
        for i in zeroed:
            if not now[i]:
                params[i].grad = None  # no rank had it: left alone, as without the shim
        late = [p for p, a, n in zip(params, anywhere, now) if n and not a]
        _average(_with_zeros(late, [True] * len(late)), summed)


def _average(grads, summed=False):
    """dp_grads on grads, in place; summed: their plain sum (a step whose loss sums over a
    sharded batch, see _after_backward). Where no rank holds a share (every rank computed the same
    whole batch: one the script makes itself, or one taken whole), the mean of N equal gradients
    must be that gradient, as alone; summed in float32 it is not (3g rounds, and a third of it is
    g only to an ulp, which thousands of SGD steps amplify), so narrower floats go as float64
    copies: N equal values sum exactly there, and the mean rounds back to g."""
    import torch
    if summed:
        _in_place(_shim.dpshim_grads_summed, "dpshim_grads_summed", grads)
        return
    if getattr(_state, "shared", False):
        _in_place(_shim.dp_grads, "dp_grads", grads)
        return
    wide = [g.double() if g.is_floating_point() and g.dtype != torch.float64 else g for g in grads]
    _in_place(_shim.dp_grads, "dp_grads", wide)
    with torch.no_grad():
        for g, w in zip(grads, wide):
            if w is not g:
                g.copy_(w)


_anywhere = {}  # the parameter list's ids -> which of them had a gradient on some rank last time


def _with_zeros(params, anywhere):
    """The gradients to reduce: those a gradient exists for on some rank, zeros where not here."""
    import torch
    grads = []
    for p, a in zip(params, anywhere):
        if not a:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse:
            raise RuntimeError("dpshim: sparse gradients are not supported; use dense embeddings")
        grads.append(p.grad)
    return grads


_reduced = set()  # ids of parameters averaged by a backward since their optimizer's last step
_forwarded = []  # weak references to the modules broadcast at a first forward, in call order


def _trained_parameters():
    """What a backward averages: every optimizer's parameters; without any optimizer (an update
    written by hand), the trainable parameters of the modules that ran forward."""
    optimizers = _live_optimizers()
    if optimizers:
        return _parameters(optimizers)
    params, seen = [], set()
    for ref in _forwarded:
        m = ref()
        for p in m.parameters() if m is not None else ():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _after_backward(loss):
    global _backwards
    if not _acting():
        return
    _backwards += 1
    params = _trained_parameters()
    summed, offset, losses = _step_reduction(loss)
    _reduce_gradients(params, summed)
    _reduced.update(id(p) for p in params)
    # the loss value too, so that what the script does with it (a line search, a plateau
    # scheduler, a print) sees the global batch's loss, as alone
    import torch
    if (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()
            and not getattr(loss, "_dpshim_global", False)):
        if summed:
            # terms added by hand (a KL term written with torch.sum) are taken to be sums too;
            # the loss functions' own values in it are global already: counted once
            _say_once("summed-terms", "WARN", "the loss that %s backpropagates adds terms to %s that are not loss "
                      "functions of torch.nn.functional; they are taken to be sums over the batch as those are "
                      "(a KL term written with torch.sum is): gradients are summed over the ranks. A term that is "
                      "a mean over the batch would weigh N times too much" % (_caller(), _named(losses)))
            loss.data.copy_(_global_sum(loss, -offset))
        else:
            loss.data.copy_(_global_value(loss))


# Per thread, the training losses since the last backward: (reduction, "name at file:line", the
# returned tensor's autograd node, how much its returned value exceeds this rank's own) of each
# loss function call on a sharded batch; the backward that follows takes those its loss is made of.


def _loss_graph(loss):
    """(every autograd node the loss depends on, the nodes it is a plain sum of: reached from its
    own node through additions, and the first operand of subtractions)."""
    root = getattr(loss, "grad_fn", None)
    reach, plain, todo = set(), set(), [(root, True)]
    while todo:
        node, additive = todo.pop()
        if node is None or (node in reach and (not additive or node in plain)):
            continue
        reach.add(node)
        if additive:
            plain.add(node)
        kind = type(node).__name__
        for k, (nxt, _) in enumerate(node.next_functions):
            todo.append((nxt, additive and (kind == "AddBackward0" or (kind == "SubBackward0" and k == 0))))
    return reach, plain


def _step_reduction(loss):
    """(summed, offset, losses) for the backward of `loss`: summed where the loss is a plain sum of
    summed losses (reduction='sum') and terms added by hand, with no mean loss in it: each rank's
    gradient is then a sum over its share and the global gradient their plain sum, exactly
    alone's; offset: what the summed values returned exceed this rank's own. A loss with no summed
    loss in it is averaged as always (and pays for no graph walk); a summed loss scaled before
    backward (divided by the batch's length) or mixed with means is averaged too, told once."""
    losses, _state.losses = getattr(_state, "losses", []), []
    if not any(kind == "sum" for kind, _, _, _ in losses):
        return False, 0.0, []
    reach, plain = _loss_graph(loss)
    mine = [x for x in losses if x[2] in reach]  # a loss computed for a print only is not this one's
    sums = [x for x in mine if x[0] == "sum"]
    means = [x for x in mine if x[0] != "sum"]
    scaled = [x for x in sums if x[2] not in plain]
    if sums and means:
        _say_once("mixed-reductions", "WARN", "one step's loss mixes losses summed over the batch (%s) with means "
                  "(%s): no one weighting of the ranks' gradients gives both exactly; they are averaged as the "
                  "means need, which divides the summed terms' weight by the number of ranks. Make the "
                  "reductions alike to train as alone" % (_named(sums), _named(means)))
        return False, 0.0, mine
    if scaled:
        _say_once("scaled-sum", "WARN", "the loss that %s backpropagates scales %s (reduction='sum') before backward: "
                  "its gradients are averaged as a mean's, which is alone's where it is divided by the batch's "
                  "length (a per-sample loss), not where it is divided by a constant (accumulation); its value "
                  "after backward is not alone's" % (_caller(), _named(scaled)))
        return False, 0.0, mine
    return bool(sums), sum(x[3] for x in sums), mine


def _named(losses):
    return ", ".join(sorted({x[1] for x in losses})) or "the loss"


def _caller():
    return _script_line().decode() or "the script"


_said = set()


def _say_once(key, level, text):
    if key not in _said:
        _said.add(key)
        if _shim.rank == 0:
            sys.stderr.write("[dpshim] %s %s\n" % (level, text))
            sys.stderr.flush()


def _global_sum(loss, shift=0.0):
    """The sum over ranks of a scalar loss's value (plus shift), in float64, then its dtype."""
    import torch
    v = (ctypes.c_double * 1)(float(loss.detach()) + shift)
    _check(_shim.dp_metric(v, 1, DP_SUM), "dp_metric")
    return torch.tensor(v[0], dtype=torch.float64).to(device=loss.device, dtype=loss.dtype).reshape(loss.shape)


def _global_value(loss):
    """A scalar loss's value averaged over ranks as the gradients are (dp_grads), in its dtype."""
    v = loss.detach().double().reshape(1).clone()
    _check(_shim.dp_grads(_tensors([v]), 1), "dp_grads")
    return v.to(loss.dtype).reshape(loss.shape)


# --- overlap ([comm] overlap on): gradients announced while backward goes on ---
#
# As DDP does: a hook on each parameter's gradient accumulator tells when its gradient is final.
# Gradients are announced (dp_grad_ready) in one order on every rank, the parameters' reversed
# (roughly the order backward produces them): each as soon as it and all before it are final,
# so the engine's buckets fill alike everywhere and go to its progress thread while backward
# computes the next ones. What was not announced (a parameter this backward did not reach, and
# everything after it in the order) goes through dp_grads at the end. Every rank's backward must
# then reach the same parameters, as with DDP; a rank that differs is reported as a desync.

class _Announcing:
    def __init__(self, params):
        self.order = [p for p in reversed(params) if p.requires_grad]
        self.final = set()
        self.next = 0

    def final_now(self, p):
        self.final.add(id(p))
        while self.next < len(self.order) and id(self.order[self.next]) in self.final:
            g = self.order[self.next].grad
            if g is None or g.is_sparse or not g.is_contiguous() or g.dtype not in _DTYPES:
                self.next = len(self.order)  # alike on every rank: the rest goes through dp_grads
                return
            self.next += 1
            _check(_shim.dp_grad_ready(_tensors([g])), "dp_grad_ready")


_announcing = None  # during a backward with overlap on
_accumulators = {}  # id(parameter) -> (a weak reference to it, its gradient accumulator, kept alive)


def _watch_accumulators(params):
    import weakref
    for p in params:
        entry = _accumulators.get(id(p))
        if (entry is not None and entry[0]() is p) or not p.requires_grad:
            continue
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        ref = weakref.ref(p)

        def final(*_, ref=ref):
            q = ref()
            if _announcing is not None and q is not None:
                _announcing.final_now(q)

        acc.register_hook(final)
        _accumulators[id(p)] = (ref, acc)


def _before_step(optimizer):
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    # an optimizer stepping another inside its own step reduces once; what a backward averaged
    # since this optimizer's last step is not averaged again
    if depth == 0:
        _reduce_gradients([p for p in _parameters([optimizer]) if id(p) not in _reduced])


def _after_step(optimizer):
    _state.depth -= 1
    if _state.depth == 0:
        _reduced.difference_update(id(p) for p in _parameters([optimizer]))
        _shim.steps += 1
        if _drift_copies:
            _refresh_drift_copies()
        _shim.dp_step_end(_shim.steps)


def _wrap_step(cls):
    step = cls.__dict__.get("step")
    if step is None or getattr(step, "_dpshim", False):
        return

    @functools.wraps(step)
    def wrapped(self, *args, **kwargs):
        if not _acting() and not getattr(_state, "depth", 0):
            return step(self, *args, **kwargs)
        try:
            _before_step(self)
            plan = _shard_plan(self) if getattr(_state, "depth", 0) == 1 else None
            if plan is None:
                return step(self, *args, **kwargs)
            return _sharded_step(self, plan, step, args, kwargs)
        finally:
            _after_step(self)

    wrapped._dpshim = True
    cls.step = wrapped


# --- optimizer sharding ([optim] shard): each rank updates its share of the parameters ---
#
# At step, after the gradients were averaged as always, each rank runs the optimizer's own step
# over its share of the parameters (its groups hold only those meanwhile), so it keeps optimizer
# state for those only; then every parameter goes from its owner to every rank (dp_from_owners).
# The share: for torch.optim's own element-wise optimizers, ZeRO's layout (the parameters end to
# end, rank r owning the r-th 1/N of the elements, a tensor cut where a share ends: its pieces
# are stepped as parameters of their own that view those elements); for any other optimizer,
# whole tensors, balanced by size. The gradients are the all-reduced ones and each element's
# update reads only its own gradient and state, so the parameters are bitwise those of the
# unsharded step. state_dict() gathers the whole state from the owners; load_state_dict keeps
# this rank's share.

# steps that read every parameter at once: never sharded
_WHOLE_STEP = {"LBFGS": "its line search evaluates every parameter together",
               "SparseAdam": "it updates sparse gradients, which dpshim does not reduce"}
# torch.optim's own classes whose update is element-wise: tensors may be cut for them
_ELEMENTWISE = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD",
                "Rprop", "SGD")
# what auto shards: all but those whose update costs less than sending the parameters out again
# (SGD and ASGD ran 0.87-1.01x unsharded on the embedding benchmark at np=2; docs/performance.md)
_AUTO = tuple(name for name in _ELEMENTWISE if name not in ("SGD", "ASGD"))


class _Piece:
    """Elements [start, end) of a parameter (flattened), updated by rank `owner`; `stepped` is
    what that rank's optimizer steps: the parameter itself where the piece is all of it, else a
    parameter of its own viewing those elements, which keys the optimizer's state for them."""
    __slots__ = ("param", "start", "end", "owner", "stepped")

    def __init__(self, param, start, end, owner):
        self.param, self.start, self.end, self.owner = param, start, end, owner
        self.stepped = param if (start, end) == (0, param.numel()) else None

    def whole(self):
        return self.stepped is self.param

    def elements(self, t):
        return t if self.whole() else t.reshape(-1)[self.start:self.end]

    def stand_in(self):
        """The piece's own parameter, viewing the parameter's elements as they are now."""
        import torch
        flat = self.param.data.view(-1)[self.start:self.end]
        if self.stepped is None:
            self.stepped = torch.nn.Parameter(flat, requires_grad=self.param.requires_grad)
        else:
            self.stepped.data = flat  # the parameter's data may have been replaced
        return self.stepped


class _Plan:
    """Who updates what for one optimizer. Parameters added later (add_param_group) are shared
    out among themselves; those already placed stay where their state lives."""

    def __init__(self, cut):
        self.cut = cut
        self.pieces = {}  # id(parameter) -> its pieces, in element order
        self.key = ()
        self.load = [0] * _shim.size

    def update(self, params):
        key = tuple((id(p), p.numel(), p.is_contiguous()) for p in params)
        if key == self.key:
            return
        for p in params:  # the same on every rank, so every rank stops here alike
            pieces = self.pieces.get(id(p))
            if pieces and (sum(pc.end - pc.start for pc in pieces) != p.numel() or
                           (len(pieces) > 1 and not p.is_contiguous())):
                raise RuntimeError("dpshim: a parameter of shape %s changed its size or memory layout after the "
                                   "optimizer's first sharded step; [optim] shard shares out parameters as they "
                                   "are at that step: change them before it, or set [optim] shard = off"
                                   % (tuple(p.shape),))
        self.key = key
        new = [p for p in params if id(p) not in self.pieces]  # params: _parameters', each once
        (self._cut if self.cut else self._whole)(new)

    def _cut(self, params):
        import bisect
        total = sum(p.numel() for p in params)
        bounds = [total * r // _shim.size for r in range(_shim.size + 1)]
        at = 0
        for p in params:
            n, pieces = p.numel(), []
            s = at
            while True:
                r = min(bisect.bisect_right(bounds, s) - 1, _shim.size - 1)
                e = at + n if not p.is_contiguous() else min(at + n, bounds[r + 1])
                pieces.append(_Piece(p, s - at, e - at, r))
                s = e
                if s >= at + n:
                    break
            self.pieces[id(p)] = pieces
            at += n

    def _whole(self, params):
        for i, p in sorted(enumerate(params), key=lambda ip: (-ip[1].numel(), ip[0])):
            r = min(range(_shim.size), key=lambda k: (self.load[k], k))
            self.pieces[id(p)] = [_Piece(p, 0, p.numel(), r)]
            self.load[r] += p.numel()

    def of(self, params):
        return [pc for p in params for pc in self.pieces[id(p)]]

    def mine(self, params):
        """What this rank's optimizer steps of `params`, gradients in place."""
        out = []
        for pc in self.of(params):
            if pc.owner != _shim.rank:
                continue
            if pc.whole():
                out.append(pc.param)
                continue
            q, g = pc.stand_in(), pc.param.grad
            q.grad = None if g is None else g.reshape(-1)[pc.start:pc.end]
            out.append(q)
        return out


_plans = {}  # id(optimizer) -> _Plan, or None where it steps whole
_full_groups = {}  # id(optimizer) -> every group's whole parameter list, during a sharded step


def _shard_plan(optimizer):
    """The optimizer's plan, or None where its step runs whole on every rank."""
    key = id(optimizer)
    if key not in _plans:
        _plans[key] = _Plan(_elementwise(optimizer)) if _shards(optimizer) else None
        import weakref
        weakref.finalize(optimizer, _plans.pop, key, None)
    plan = _plans[key]
    if plan is not None:
        plan.update(_parameters([optimizer]))
    return plan


def _elementwise(optimizer, names=_ELEMENTWISE):
    import torch
    cls = type(optimizer)
    return cls.__name__ in names and getattr(torch.optim, cls.__name__, None) is cls


def _shards(optimizer):
    """[optim] shard for this optimizer: on shards any optimizer but those whose step reads every
    parameter at once; auto only torch.optim's own element-wise ones that pay for it (a
    subclass's step may couple parameters, which no one can see from outside)."""
    if _shim.shard == "off" or _shim.alone:
        return False
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls.__name__ in _WHOLE_STEP:
            if _shim.shard == "on":
                _say_once("shard-" + cls.__name__, "WARN", "[optim] shard = on: %s keeps every parameter on every rank, "
                          "as %s" % (type(optimizer).__name__, _WHOLE_STEP[cls.__name__]))
            return False
    return _shim.shard == "on" or _elementwise(optimizer, _AUTO)


def _sharded_step(optimizer, plan, step, args, kwargs):
    closure = args[0] if args else kwargs.get("closure")
    if closure is not None:
        # run first, as the optimizer would on entry, while its groups are whole: the script's
        # zero_grad and backward in it see every parameter; the step gets the loss it returned
        import torch
        with torch.enable_grad():
            loss = closure()
        args, kwargs = args[1:], dict(kwargs, closure=lambda: loss)
    groups = optimizer.param_groups
    full = [g["params"] for g in groups]
    every = plan.of(_parameters([optimizer]))
    # state made whole (Adagrad's __init__, a load) to this rank's share; the step, over that
    # share only, makes state for nothing else
    _settle_state(optimizer, plan)
    _full_groups[id(optimizer)] = full
    try:
        for g in groups:
            g["params"] = plan.mine(g["params"])
        result = step(optimizer, *args, **kwargs)
    finally:
        for g, ps in zip(groups, full):
            g["params"] = ps
        del _full_groups[id(optimizer)]
        for pc in every:
            if not pc.whole() and pc.stepped is not None:
                pc.stepped.grad = None  # no view keeps a gradient the script has let go
    # what the step updated (a parameter without a gradient on every rank is left alone by every
    # optimizer): from its owner to every rank
    pieces = [pc for pc in every if pc.param.grad is not None and pc.end > pc.start]
    owners = (ctypes.c_int32 * max(len(pieces), 1))(*[pc.owner for pc in pieces])
    _in_place(lambda arr, n: _shim.dp_from_owners(arr, n, owners), "dp_from_owners",
              [pc.elements(pc.param.data) for pc in pieces], _as_bytes_where_unnamed)
    return result


def _per_element(v, n):
    """A state value that holds one entry per element of a piece of n elements (exp_avg), not
    one for the parameter (Adam's step count, a scalar tensor)."""
    import torch
    return isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == n


def _settle_state(optimizer, plan):
    """optimizer.state holds this rank's share only: the state of a parameter cut into pieces
    (loaded whole, or made whole by the optimizer's __init__) goes to this rank's pieces,
    element-wise state sliced and the rest copied; what other ranks own is dropped."""
    state = optimizer.state
    for p in _parameters([optimizer]):
        pieces = plan.pieces[id(p)]
        if len(pieces) == 1 and pieces[0].whole():
            if pieces[0].owner != _shim.rank:
                state.pop(p, None)
            continue
        st = state.pop(p, None)
        if not st:
            continue
        import torch
        n = p.numel()
        for pc in pieces:
            if pc.owner == _shim.rank:
                state[pc.stand_in()] = {
                    k: (v.reshape(-1)[pc.start:pc.end].clone() if isinstance(v, torch.Tensor) and v.numel() == n > 1
                        else v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}


def _gathered_state(optimizer, plan, state_dict):
    """The unsharded optimizer's state_dict(): each rank's share packed, serialized and sent from
    it to every rank (dp_from_owners), pieces joined again, entries in parameter order."""
    import io
    import torch
    _settle_state(optimizer, plan)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    index_of = {}
    for i, p in enumerate(params):  # state_dict's numbering
        index_of.setdefault(id(p), i)
    pieces = [pc for pc in plan.of(_parameters([optimizer])) if not pc.whole()]
    aside = {pc: optimizer.state.pop(pc.stepped) for pc in pieces
             if pc.stepped is not None and pc.stepped in optimizer.state}
    try:
        sd = state_dict(optimizer)  # the stand-ins are no parameter of its groups
    finally:
        for pc, st in aside.items():
            optimizer.state[pc.stepped] = st
    mine = [(i, None, None, st) for i, st in sd["state"].items()]
    mine += [(index_of[id(pc.param)], pc.start, pc.end, st) for pc, st in aside.items()]
    buf = io.BytesIO()
    torch.save(mine, buf)
    data = buf.getbuffer()
    # a guard report names the call: a script that asks for the state on one rank only hangs
    # nowhere, and learns why its ranks parted
    site = _script_line() + b", state_dict of a sharded optimizer"
    lengths = (ctypes.c_double * _shim.size)()
    lengths[_shim.rank] = data.nbytes
    _shim.lib.dpshim_site(site)
    _check(_shim.lib.dp_metric(lengths, _shim.size, DP_SUM), "dp_metric")
    parts = [torch.frombuffer(data, dtype=torch.uint8) if r == _shim.rank
             else torch.empty(int(lengths[r]), dtype=torch.uint8) for r in range(_shim.size)]
    owners = (ctypes.c_int32 * _shim.size)(*range(_shim.size))
    _shim.lib.dpshim_site(site)
    _check(_shim.lib.dp_from_owners(_tensors(parts), len(parts), owners), "dp_from_owners")

    # the other ranks' shares land in host memory, never on this rank's GPU: a checkpoint needs
    # no GPU memory beyond the share the rank holds (load_state_dict puts each tensor on its
    # parameter's device, as it always does)
    whole, cut = {}, collections.defaultdict(list)
    for r, part in enumerate(parts):
        entries = mine if r == _shim.rank else torch.load(io.BytesIO(part.numpy()), map_location="cpu",
                                                          weights_only=False)
        for i, start, end, st in entries:
            # keys as the optimizer's own (interned) strings: a pickle of the result then
            # shares them as the unsharded one does, so torch.save writes the same bytes
            st = {sys.intern(k) if isinstance(k, str) else k: v for k, v in st.items()}
            if start is None:
                whole[i] = st
            else:
                cut[i].append((start, end, st))
    for i, ps in cut.items():
        ps.sort(key=lambda x: x[0])
        shape = params[i].shape
        whole[i] = {k: torch.cat([st[k].cpu() for _, _, st in ps]).view(shape)
                    if all(_per_element(st.get(k), e - s) for s, e, st in ps) else v
                    for k, v in ps[0][2].items()}
    out = dict(sd)
    out["state"] = {i: whole[i] for i in sorted(whole)}
    return out


def _patch_optimizer_state(torch):
    base = torch.optim.Optimizer
    state_dict, load_state_dict = base.state_dict, base.load_state_dict

    @functools.wraps(state_dict)
    def whole_state_dict(self):
        plan = _shard_plan(self) if _acting() else None
        return state_dict(self) if plan is None else _gathered_state(self, plan, state_dict)

    @functools.wraps(load_state_dict)
    def load_share(self, *args, **kwargs):
        result = load_state_dict(self, *args, **kwargs)
        plan = _shard_plan(self) if _acting() else None
        if plan is not None:
            _settle_state(self, plan)
        return result

    base.state_dict, base.load_state_dict = whole_state_dict, load_share


def _patch_optimizers(torch):
    import weakref
    base = torch.optim.Optimizer
    init = base.__init__

    @functools.wraps(init)
    def registering_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _optimizers.append(weakref.ref(self))
        if _acting():  # parameters outside any module start as rank 0's too
            _broadcast_tensors([p for p in _parameters([self]) if not _is_lazy(p)])

    base.__init__ = registering_init
    _patch_optimizer_state(torch)
    backward = torch.autograd.backward

    @functools.wraps(backward)
    def reducing_backward(*args, **kwargs):
        global _announcing
        # (a summed step's gradients go at the end, plainly summed: see _step_reduction)
        if (_acting() and _announcing is None and _shim.overlap() and getattr(_state, "shared", False)
                and not any(x[0] == "sum" for x in getattr(_state, "losses", []))):
            params = _trained_parameters()
            _watch_accumulators(params)
            _announcing = _Announcing(params)
        try:
            result = backward(*args, **kwargs)
        finally:
            _announcing = None
        _after_backward(args[0] if args else kwargs.get("tensors"))
        return result

    torch.autograd.backward = reducing_backward
    todo = [base]
    while todo:
        cls = todo.pop()
        _wrap_step(cls)
        todo.extend(cls.__subclasses__())
    previous = base.__dict__.get("__init_subclass__")

    def init_subclass(cls, **kwargs):
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        _wrap_step(cls)

    base.__init_subclass__ = classmethod(init_subclass)


# --- data: the same order everywhere, each rank its share ---

def _index_array(idx):
    return (ctypes.c_uint64 * max(len(idx), 1))(*idx)


def _patch_samplers(torch):
    sampler = torch.utils.data.sampler
    random_iter = sampler.RandomSampler.__iter__

    def agreed_random_iter(self):
        if self.generator is not None or not _acting():
            yield from random_iter(self)
            return
        # RandomSampler's own draw from the global generator, then rank 0's value everywhere
        seed = ctypes.c_uint64(int(torch.empty((), dtype=torch.int64).random_().item()))
        _check(_shim.dp_seed(ctypes.byref(seed)), "dp_seed")
        g = torch.Generator()
        g.manual_seed(seed.value)
        self.generator = g
        try:
            yield from random_iter(self)
        finally:
            self.generator = None

    sampler.RandomSampler.__iter__ = agreed_random_iter

    def shard(self, whole):
        idx = list(iter(self.sampler))
        if whole:
            return idx
        arr = _index_array(idx)
        keep = _shim.dp_epoch(arr, len(idx))  # scale mode: 1/N of the epoch; split mode: all
        return [arr[i] for i in range(keep)] if keep != len(idx) else idx

    batch_iter = sampler.BatchSampler.__iter__
    batch_len = sampler.BatchSampler.__len__

    def sized(s):
        try:
            len(s)
            return True
        except TypeError:  # e.g. the endless sampler of an IterableDataset
            return False

    def batches(self):
        if isinstance(self.sampler, torch.utils.data.distributed.DistributedSampler):
            _step_aside("a DistributedSampler")
        if not sized(self.sampler) or not _acting():  # a child's loader, or the script's own sharding: as alone
            yield from batch_iter(self)
            return
        whole = self.__dict__["_dpshim_whole"] = _whole_data(self)
        idx = shard(self, whole)
        pending = self.__dict__["_dpshim_pending"] = collections.deque()  # a new epoch
        self.__dict__["_dpshim_backwards"] = _backwards
        for start in range(0, len(idx), self.batch_size):
            batch = idx[start:start + self.batch_size]
            if len(batch) < self.batch_size and self.drop_last:
                break
            if whole:  # evaluation: every rank the whole batch, weighted 1/N
                pending.append((len(batch), _shim.size, True))
                yield batch
                continue
            arr = _index_array(batch)
            keep = _shim.dp_batch(arr, len(batch))  # split mode: this rank's share
            if len(batch) < _shim.size and _shim.split:
                # fewer samples than ranks: every rank takes them all, weighted 1/N (no rank
                # may get an empty batch, which collate cannot build)
                pending.append((len(batch), _shim.size, False))
                yield batch
                continue
            pending.append((len(batch), 1, False))
            yield [arr[i] for i in range(keep)]

    def length(self):
        if isinstance(self.sampler, torch.utils.data.distributed.DistributedSampler):
            _step_aside("a DistributedSampler")
        if not sized(self.sampler) or not _acting():
            return batch_len(self)
        n = len(self.sampler)
        whole = self.__dict__.get("_dpshim_whole")  # as the last pass over it, or as now
        if n and not (_evaluation_now(self) if whole is None else whole):
            n = _shim.dp_epoch(_index_array(range(n)), n)
        return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size

    sampler.BatchSampler.__iter__ = batches
    sampler.BatchSampler.__len__ = length

    # The loader may fetch batches ahead of the training loop; the share that weighs a step's
    # gradients must be that of the batch the loop just got, so it is recorded on delivery.
    base_iter = torch.utils.data.dataloader._BaseDataLoaderIter
    next_batch = base_iter.__next__

    def delivered(self):
        try:
            data = next_batch(self)
        except StopIteration:  # the loop's pass is over
            batches = self._index_sampler
            if _backwards != getattr(batches, "_dpshim_backwards", _backwards):
                batches.__dict__["_dpshim_trained_on"] = True
            _state.replicas, _state.shared = 1, False  # batches made by hand after it are the script's own
            raise
        pending = getattr(self._index_sampler, "_dpshim_pending", None)
        if pending and _acting():  # a forked child's copy is not this pass's
            n, replicas, evaluation = pending.popleft()
            if evaluation:  # shares nothing out: a job that only evaluates is told so at exit
                _shim.dpshim_batch_whole(n)
            else:
                _shim.dp_batch(_index_array(range(n * replicas)), n * replicas)
            _state.replicas, _state.shared = replicas, replicas == 1
        return data

    base_iter.__next__ = delivered


def _evaluating(trained_on=False):
    """No backward can follow: gradients are off, or every model that ran is in eval mode and
    the loader was not trained on in an earlier pass (fine-tuning with frozen BatchNorm and
    Dropout keeps the model in eval mode)."""
    import torch
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return True
    models = [m for m in (r() for r in _forwarded) if m is not None]
    return bool(models) and not any(m.training for m in models) and not trained_on


_backwards = 0  # backward passes so far: a pass over a loader that saw some was trained on


def _evaluation_now(batch_sampler):
    """This rank's reading: a pass over the loader starting now is an evaluation that takes the
    whole data set ([data] eval = whole)."""
    return _shim.eval_whole and _evaluating(batch_sampler.__dict__.get("_dpshim_trained_on", False))


def _whole_data(batch_sampler):
    """Whether a pass over a loader that starts now takes the whole data set on every rank, as
    rank 0 reads it (the number of batches each rank takes shapes the collectives that follow)."""
    if not _shim.eval_whole:
        return False
    flag = ctypes.c_uint64(_evaluation_now(batch_sampler))
    _check(_shim.dp_seed(ctypes.byref(flag)), "dp_seed")
    return bool(flag.value)


# --- losses: the global batch's value as soon as the loss function returns ---

_LOSSES = ("l1_loss", "mse_loss", "cross_entropy", "nll_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "smooth_l1_loss", "huber_loss", "kl_div",
           "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss", "margin_ranking_loss",
           "hinge_embedding_loss", "multi_margin_loss", "multilabel_margin_loss",
           "multilabel_soft_margin_loss", "soft_margin_loss", "triplet_margin_loss",
           "triplet_margin_with_distance_loss", "ctc_loss")


def _patch_losses(torch):
    class GlobalValue(torch.autograd.Function):
        """The global value forward, this rank's loss's gradient backward."""

        @staticmethod
        def forward(ctx, loss, value):
            return value.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    functional = torch.nn.functional

    def global_loss(loss_fn):
        @functools.wraps(loss_fn)
        def wrapped(*args, **kwargs):
            depth = getattr(_state, "in_loss", 0)
            _state.in_loss = depth + 1
            try:
                loss = loss_fn(*args, **kwargs)
            finally:
                _state.in_loss = depth
            # a training loss of a sharded batch (taken whole, its value is already everyone's)
            if (depth or not _acting() or not isinstance(loss, torch.Tensor) or not loss.requires_grad
                    or loss.numel() != 1 or not loss.is_floating_point() or getattr(_state, "replicas", 1) != 1
                    or _evaluating()):
                return loss
            # a sum over this rank's share of a batch split over the ranks: the global value is
            # the plain sum (a batch every rank computes whole is averaged: its sums are alike)
            summed = _reduction(loss_fn, args, kwargs) == "sum" and _shim.split and getattr(_state, "shared", False)
            out = GlobalValue.apply(loss, _global_sum(loss) if summed else _global_value(loss))
            out._dpshim_global = True  # the backward that follows does not average it again
            if getattr(_state, "shared", False):
                if not hasattr(_state, "losses"):
                    _state.losses = []
                _state.losses.append(("sum" if summed else "mean", "%s at %s" % (loss_fn.__name__, _caller()),
                                      out.grad_fn, float(out.detach()) - float(loss.detach()) if summed else 0.0))
            return out
        return wrapped

    signatures = {}

    def _reduction(loss_fn, args, kwargs):
        """The reduction a loss call asked for, its legacy size_average/reduce arguments included."""
        try:
            sig = signatures.get(loss_fn) or signatures.setdefault(loss_fn, inspect.signature(loss_fn))
            given = sig.bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):
            return kwargs.get("reduction", "mean")
        if given.get("size_average") is not None or given.get("reduce") is not None:
            return torch.nn._reduction.legacy_get_string(given.get("size_average"), given.get("reduce"),
                                                         emit_warning=False)
        return given.get("reduction", "mean")

    for name in _LOSSES:
        fn = getattr(functional, name, None)
        if fn is not None:
            setattr(functional, name, global_loss(fn))


# --- BatchNorm: statistics of the global batch ---

def _bn_sums(a, b, n):
    """a and b (contiguous float64) summed over ranks in place, and n with them: the total."""
    count = ctypes.c_uint64(n)
    t = _tensors([a, b])
    _check(_shim.dp_bn_stats(ctypes.byref(t[0]), ctypes.byref(t[1]), ctypes.byref(count)), "dp_bn_stats")
    return count.value


def _patch_batchnorm(torch):
    shape_of = lambda x: [1, x.shape[1]] + [1] * (x.dim() - 2)  # noqa: E731 (a channel's broadcast)

    class SyncedBatchNorm(torch.autograd.Function):
        """BatchNorm over the global batch on PyTorch's own kernels: per-channel sums of x and x*x,
        summed over ranks in float64 (dp_bn_stats, with the sample count),
        normalization by the native kernel with the global statistics; backward by the native
        kernel for the direct term and the affine gradients, plus the statistics' terms from
        per-channel sums over ranks, in one pass. Local gradients are of this rank's loss over
        its n samples: scaled by n they are per-sample and add up across ranks with unequal n,
        and dividing by n again returns to this rank's convention (as examples/nn/dpnn.c does)."""

        @staticmethod
        def forward(ctx, x, weight, bias, eps):
            dims = [0] + list(range(2, x.dim()))
            n = x.numel() // x.shape[1] if x.shape[1] else 0
            # summed in x's dtype (PyTorch's cascade sums; float64 accumulation costs 6x here)
            s = x.sum(dims).double().contiguous()
            ss = (x * x).sum(dims).double().contiguous()
            total = _bn_sums(s, ss, n)
            mean = s / total if total else s
            var = (ss / total - mean * mean).clamp(min=0) if total else ss
            m, v = mean.to(x.dtype), var.to(x.dtype)
            y = torch.batch_norm(x, weight, bias, m, v, False, 0.0, eps, False)
            ctx.save_for_backward(x, weight, m, v)
            ctx.eps, ctx.n, ctx.total = eps, n, total
            ctx.mark_non_differentiable(mean, var)
            return y, mean, var, torch.tensor(float(total), dtype=torch.float64)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, dy, _mean, _var, _total):
            x, weight, m, v = ctx.saved_tensors
            dy = dy.contiguous()
            gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
                dy, x, weight, m, v, None, None, False, ctx.eps, [True, True, True])
            # gb = sum(dy), gw = sum(dy * xhat) = invstd * sum(dy * (x - mean)), per channel
            invstd = torch.rsqrt(v.double() + ctx.eps)
            n, total, shape = ctx.n, ctx.total, shape_of(x)
            a = (gb.double() * n).contiguous()
            b = (gw.double() / invstd * n).contiguous()
            _bn_sums(a, b, n)
            if n and total:
                gamma = weight.double() if weight is not None else torch.ones_like(invstd)
                k = gamma * invstd / (n * total)  # a and b back to this rank's convention, over the total
                # gx -= k * (a + (x - mean) * invstd^2 * b), as gx += x * slope + offset
                slope = -k * invstd * invstd * b
                offset = -k * a - slope * m.double()
                gx.addcmul_(x, slope.to(x.dtype).view(shape)).add_(offset.to(x.dtype).view(shape))
            affine = weight is not None
            return gx, gw if affine else None, gb if affine else None, None

    norm = torch.nn.modules.batchnorm._BatchNorm
    forward = norm.forward

    def synced_forward(self, x):
        # batch statistics are used in training, and always by a BatchNorm without running ones
        if (not self.training and not (self.running_mean is None and self.running_var is None)) or not _acting():
            return forward(self, x)
        self._check_input_dim(x)
        y, mean, var, total = SyncedBatchNorm.apply(x, self.weight if self.affine else None,
                                                    self.bias if self.affine else None, self.eps)
        if self.training and self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                t = float(total) / getattr(_state, "replicas", 1)  # a batch every rank took whole
                unbiased = var * (t / (t - 1)) if t > 1 else var
                self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        return y

    norm.forward = synced_forward


# --- random state: rank 0's everywhere ---
#
# At interpreter start, before the script runs, one value agreed from rank 0 seeds Python's
# random at once, NumPy's legacy global generator and torch's global generators when they are
# imported; a seeding call of the script takes rank 0's argument, so a seed taken from the time
# or the pid is the same on every rank, and rank 0 seeds as it would alone.

_MASK64 = (1 << 64) - 1
_job_seed = None  # the agreed value


def _agreeing():
    return _job_seed is not None and _acting()


def _agree_bytes(data):
    """Rank 0's bytes on every rank, 8 at a time through dp_seed (a broadcast from rank 0)."""
    n = ctypes.c_uint64(len(data))
    _check(_shim.dp_seed(ctypes.byref(n)), "dp_seed")
    out = bytearray()
    for off in range(0, n.value, 8):
        v = ctypes.c_uint64(int.from_bytes(data[off:off + 8].ljust(8, b"\0"), "little"))
        _check(_shim.dp_seed(ctypes.byref(v)), "dp_seed")
        out += v.value.to_bytes(8, "little")
    return bytes(out[:n.value])


def _encode_seed(a):
    """A seeding call's argument as bytes; None stands for rank 0's own fresh entropy."""
    if a is None:
        return b"n" + os.urandom(8)
    if isinstance(a, int):
        return b"i" + a.to_bytes(a.bit_length() // 8 + 1, "little", signed=True)
    if isinstance(a, float):
        return b"f" + struct.pack("<d", a)
    if isinstance(a, str):
        return b"s" + a.encode("utf-8", "surrogatepass")
    if isinstance(a, (bytes, bytearray)):
        return b"b" + bytes(a)
    return b"x"  # another kind (a NumPy array): each rank keeps its own


def _decode_seed(b, own):
    tag, body = b[:1], b[1:]
    if tag == b"n":
        return int.from_bytes(body, "little")
    if tag == b"i":
        return int.from_bytes(body, "little", signed=True)
    if tag == b"f":
        return struct.unpack("<d", body)[0]
    if tag == b"s":
        return body.decode("utf-8", "surrogatepass")
    if tag == b"b":
        return body
    return own


def _agreed_seed_call(seed_fn, arg_of=lambda a: a, none_fails=False):
    """seed_fn wrapped so that every rank seeds with rank 0's argument; with none_fails, a None
    argument goes to seed_fn as it is (torch.manual_seed(None) fails alone, and so here)."""
    @functools.wraps(seed_fn)
    def seed(*args, **kwargs):
        a = args[0] if args else kwargs.pop("a", kwargs.pop("seed", None))
        if not _agreeing() or (a is None and none_fails):
            return seed_fn(a, *args[1:], **kwargs)
        return seed_fn(arg_of(_decode_seed(_agree_bytes(_encode_seed(a)), a)), *args[1:], **kwargs)
    seed._dpshim = True
    return seed


def _derive(k):
    return (_job_seed * 0x9E3779B97F4A7C15 + k * 0xBF58476D1CE4E5B9) & _MASK64


def _seed_random(module):
    if not getattr(module.seed, "_dpshim", False):
        module.seed(_derive(1))
        module.seed = _agreed_seed_call(module.seed)


def _seed_numpy(module):
    r = getattr(module, "random", None)
    if r is not None and not getattr(r.seed, "_dpshim", False):
        r.seed(_derive(2) & 0xFFFFFFFF)
        r.seed = _agreed_seed_call(r.seed, lambda v: v & 0xFFFFFFFF if type(v) is int else v)


def _seed_torch(torch):
    manual_seed = torch.random.manual_seed
    torch_seed = torch.random.seed
    manual_seed(_job_seed)  # CPU and CUDA

    @functools.wraps(torch_seed)
    def seed_now():  # torch.seed(): a fresh seed, rank 0's
        v = _decode_seed(_agree_bytes(_encode_seed(None)), None) if _agreeing() else None
        if v is None:
            return torch_seed()
        manual_seed(v)
        return v

    torch.manual_seed = torch.random.manual_seed = _agreed_seed_call(manual_seed, none_fails=True)
    torch.seed = torch.random.seed = seed_now


def _check_hash_seed():
    """Every rank hashes strings alike (set and dict order of strings): PYTHONHASHSEED was set
    for the job by the shim, or by the user, the same everywhere. A job-wide check: every rank
    reaches the same verdict."""
    chosen_by = os.environ.pop("DPSHIM_HASHSEED", None)
    user_seed = None if chosen_by else os.environ.get("PYTHONHASHSEED")
    if chosen_by:
        os.environ.pop("PYTHONHASHSEED", None)  # the script's own children hash as they would alone
    h = float(hash("dpshim: one hash for the job") & ((1 << 52) - 1))
    v = (ctypes.c_double * 2)(h, -h)
    _check(_shim.dp_metric(v, 2, DP_MAX), "dp_metric")
    if v[0] == -v[1]:
        return
    if user_seed is not None:
        sys.stderr.write("[dpshim] ERROR PYTHONHASHSEED differs between ranks (here %r): set one value for the "
                         "whole job, or leave it unset and dpshim gives every rank the same one\n" % user_seed)
        sys.stderr.flush()
        os._exit(78)
    if _shim.rank == 0:
        sys.stderr.write("[dpshim] WARN Python's string hashes differ between ranks (the launcher gives no job "
                         "identity to derive one PYTHONHASHSEED from): the order of sets and dicts of strings differs; "
                         "set PYTHONHASHSEED=<number> on the launch line\n")


def _agree_random_state():
    """At interpreter start: rank 0's job seed everywhere, and the generators seeded from it."""
    global _job_seed
    _check_hash_seed()
    _job_seed = int.from_bytes(_agree_bytes(os.urandom(8)), "little")
    import random
    _seed_random(random)
    _on_import("numpy", _seed_numpy)


def _on_import(name, after):
    """after(module) once the module `name` has been imported (now, if it already has been)."""
    if name in sys.modules:
        after(sys.modules[name])
    else:
        sys.meta_path.insert(0, _ModuleWatcher(name, after))


class _ModuleWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when the module's own loader has run, calls after(module)."""

    def __init__(self, name, after):
        self.name, self.after, self.done = name, after, False

    def find_spec(self, name, path, target=None):
        if name != self.name or self.done:
            return None
        self.done = True
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module, after = spec.loader.exec_module, self.after

        def exec_then_after(module):
            exec_module(module)
            after(module)

        spec.loader.exec_module = exec_then_after
        return spec


# --- installation, when the script imports torch ---

def _install(torch):
    global _synced, _LIBRARY_DIRS
    if _synced is not None:
        return
    _LIBRARY_DIRS += (os.path.dirname(torch.__file__) + os.sep,)
    _seed_torch(torch)
    import weakref
    _DTYPES.update({torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
                    torch.int32: 4, torch.int64: 5, torch.uint8: 6})
    _synced = weakref.WeakSet()
    torch.nn.modules.module.register_module_forward_pre_hook(_forward_pre_hook)
    load = torch.nn.Module.load_state_dict

    @functools.wraps(load)
    def load_state_dict(self, *args, **kwargs):
        result = load(self, *args, **kwargs)
        for m in self.modules():  # broadcast again at the next forward
            _synced.discard(m)
        return result

    torch.nn.Module.load_state_dict = load_state_dict
    _patch_optimizers(torch)
    _patch_samplers(torch)
    if _shim.bn_sync:
        _patch_batchnorm(torch)
    _patch_losses(torch)
    _patch_self_distribution(torch)


def _patch_self_distribution(torch):
    """A script that distributes itself: torch.distributed initialized (any backend), or a model
    wrapped in DistributedDataParallel or FullyShardedDataParallel. (A DistributedSampler is seen
    where batches are drawn.) The adapter steps aside from that call on, before the first step it
    would have changed."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    if dist.is_initialized():
        _step_aside("torch.distributed initialized before the adapter loaded")
    init = dist.init_process_group

    @functools.wraps(init)
    def initializing(*args, **kwargs):
        result = init(*args, **kwargs)
        _step_aside("torch.distributed.init_process_group (backend %s)" % dist.get_backend())
        return result

    dist.init_process_group = initializing
    # the wrappers when the script imports them (FSDP's module is not imported by torch itself)
    for module_name, cls_name in (("torch.nn.parallel", "DistributedDataParallel"),
                                  ("torch.distributed.fsdp", "FullyShardedDataParallel")):
        _on_import(module_name, functools.partial(_wrap_distributing, cls_name))


def _wrap_distributing(cls_name, module):
    cls = getattr(module, cls_name, None)
    if cls is None or getattr(cls.__init__, "_dpshim", False):
        return
    init = cls.__init__

    @functools.wraps(init)
    def stepping(self, *args, **kwargs):
        _step_aside(cls_name)
        return init(self, *args, **kwargs)

    stepping._dpshim = True
    cls.__init__ = stepping


def _start(lib):
    global _shim
    _shim = _Shim(lib)
    _agree_random_state()


def install_import_hook():
    lib = _library_handle() if "torch" not in sys.modules else None
    if lib is None or lib.dp_world_size() <= 1:
        return
    if os.environ.get("DPSHIM_RANK_PID", "").split(":", 1)[0] == str(os.getpid()):
        # the process the launcher started: it holds the rank's place from the start
        if _holds_rank(lib):
            _start(lib)
            _on_import("torch", _install)
        return

    # a child of it (the trainer a wrapper starts, or a program a shell line runs before it):
    # the rank's place goes to the first one that imports torch, so a preparing step without
    # torch (`sh -c "python3 prep.py && python3 train.py"`) leaves it to the trainer
    def claim_then_install(torch):
        if _holds_rank(lib):
            _start(lib)
            _install(torch)
    _on_import("torch", claim_then_install)
