"""What every module of the adapter shares: libdpshim.so's functions, this process's state, tensors to the shim."""

import ctypes
import importlib.machinery
import os
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
    """libdpshim.so's functions and the policy the adapter reads: one object, bound (bind) once
    this process holds the rank's place; every module imports it as it is."""

    def bind(self, lib):
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
                ("dpshim_epoch_count", ctypes.c_size_t, [ctypes.c_size_t]),
                ("dp_epoch_rest", ctypes.c_size_t, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
                ("dp_grads", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.c_size_t]),
                ("dpshim_grads_summed", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.c_size_t]),
                ("dp_grad_ready", ctypes.c_int, [ctypes.POINTER(_Tensor)]),
                ("dp_bn_stats", ctypes.c_int, [ctypes.POINTER(_Tensor), ctypes.POINTER(_Tensor),
                                               ctypes.POINTER(ctypes.c_uint64)]),
                ("dp_metric", ctypes.c_int, [ctypes.POINTER(ctypes.c_double), ctypes.c_size_t, ctypes.c_int]),
                ("dp_step_end", ctypes.c_int, [ctypes.c_uint64]),
                ("dp_set_stream", ctypes.c_int, [ctypes.c_int32, ctypes.c_void_p]),
                ("dpshim_bn_backward", ctypes.c_int, [ctypes.c_int] + [ctypes.c_uint64] * 3 + [ctypes.c_void_p] * 8 +
                 [ctypes.c_double, ctypes.c_uint64, ctypes.c_int])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
            setattr(self, name, _sited(f, lib.dpshim_site) if name in _COLLECTIVES else f)
        # BatchNorm's backward pass calls dp_bn_stats (over_ranks = 1); the probe does not
        self.bn_backward_sited = _sited(self.dpshim_bn_backward, lib.dpshim_site)
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
                "dp_metric", "dp_step_end", "dp_epoch_rest")
# the adapter's directory (sitecustomize.py and this package)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def _not_the_script(directory):
    """Frames in directory (torch's package, once imported) are no script lines."""
    global _LIBRARY_DIRS
    _LIBRARY_DIRS += (directory + os.sep,)


def _sited(hook, site):
    site.restype, site.argtypes = None, [ctypes.c_char_p]

    def call(*args):
        site(_script_line())
        return hook(*args)
    return call


_shim = _Shim()
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


def _caller():
    return _script_line().decode() or "the script"


_said = set()


def _say_once(key, level, text):
    if key not in _said:
        _said.add(key)
        if _shim.rank == 0:
            sys.stderr.write("[dpshim] %s %s\n" % (level, text))
            sys.stderr.flush()


def _on_import(name, after):
    """after(module) once the module `name` has been imported (now, if it already has been)."""
    if name in sys.modules:
        after(sys.modules[name])
    else:
        sys.meta_path.insert(0, _ModuleWatcher(name, after))


class _ModuleWatcher:
    """Finds nothing itself; when the module's own loader has run, calls after(module). A finder
    on sys.meta_path needs find_spec only: importlib.abc, whose base class adds nothing it uses,
    costs more at interpreter start than the rest of the adapter (docs/performance.md)."""

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
