"""[optim] shard: each rank updates its share of the parameters, and state_dict() gathers the whole state."""

import collections
import ctypes
import functools
import sys

from .common import DP_SUM, _acting, _check, _in_place, _say_once, _script_line, _shim, _tensors
from .parameters import _as_bytes_where_unnamed

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


def _parameters(optimizers):
    """Every parameter of the optimizers, each once; the whole groups also during a sharded step."""
    params, seen = [], set()
    for optimizer in optimizers:
        for ps in _full_groups.get(id(optimizer)) or [g["params"] for g in optimizer.param_groups]:
            for p in ps:
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
    return params


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
