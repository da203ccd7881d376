"""Parameters and buffers: rank 0's values on every rank before a module's first forward."""

import functools

from .common import _DTYPES, _acting, _in_place, _shim


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
_forwarded = []  # weak references to the modules broadcast at a first forward, in call order


# An object that refers to itself (a trainer holding a bound method of its own) outlives its last
# name until the garbage collector runs, and when that runs depends on each process's
# allocations: an old optimizer or model would still count on some ranks (the parameters a
# backward reduces, whether a pass is an evaluation) and not on others. Once an optimizer of a
# module's parameters is made (a new model's, as a sweep makes them), the next first forward of a
# module, backward or pass over a loader collects, on every rank at the same place. An optimizer
# of other tensors (an adversarial perturbation's, made at every step) costs no collection.
_collect_due = False


def _collect_soon(params):
    global _collect_due
    import torch
    if any(isinstance(p, torch.nn.Parameter) for p in params):
        _collect_due = True


def _collect_if_due():
    global _collect_due
    if _collect_due:
        _collect_due = False
        import gc
        gc.collect()


def _forward_pre_hook(module, args):
    if module in _synced or not _acting():  # DataLoader workers run transforms
        return None
    _collect_if_due()
    if not _broadcast_module(module):
        return None
    import weakref
    _forwarded.append(weakref.ref(module))
    for m in module.modules():
        _synced.add(m)
    return None


def _patch_modules(torch):
    global _synced
    import weakref
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
