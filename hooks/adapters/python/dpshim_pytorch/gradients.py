"""Gradients averaged at the end of every backward pass and before every optimizer step, and that step."""

import ctypes
import functools

from .common import DP_MAX, DP_SUM, _acting, _caller, _check, _in_place, _say_once, _shim, _state, _tensors
from .overlap import _announce_during, _announcing_now, _backward_over
from .optimizer_sharding import _parameters, _patch_optimizer_state, _shard_plan, _sharded_step
from .random_state import _realign_generators
from .parameters import (_broadcast_tensors, _collect_if_due, _collect_soon, _drift_copies, _forwarded, _is_lazy,
                         _refresh_drift_copies)


_optimizers = []  # weak references to every optimizer, in creation order (the same on all ranks)


def _live_optimizers():
    live = [r() for r in _optimizers]
    _optimizers[:] = [r for r, o in zip(_optimizers, live) if o is not None]
    return [o for o in live if o is not None]


def _reduce_gradients(params, summed=False):
    import torch
    if not params:
        return
    key = tuple(map(id, params))
    entry = _anywhere.get(key)
    anywhere = entry[1] if entry is not None and _same_objects(entry[0], params) else None
    if anywhere is None or _shim.overlap():
        # which parameters have a gradient anywhere: one small all-reduce, so every rank reduces
        # the same list even when some rank's backward never reached a parameter
        have = (ctypes.c_double * len(params))(*[0.0 if p.grad is None else 1.0 for p in params])
        _check(_shim.dp_metric(have, len(params), DP_MAX), "dp_metric")
        anywhere = [bool(h) for h in have]
        _remember_anywhere(key, params, anywhere)
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
        _remember_anywhere(key, params, now)
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


# the parameter list's ids -> (weak references to its parameters, which of them had a gradient on
# some rank last time). An id alone is not the parameter: a new model's parameters may take a
# freed one's place on some ranks and not on others, and the ranks would then reduce differently.
_anywhere = {}


def _same_objects(refs, objects):
    return len(refs) == len(objects) and all(r() is o for r, o in zip(refs, objects))


def _remember_anywhere(key, params, anywhere):
    import weakref
    for k in [k for k, (refs, _) in _anywhere.items() if any(r() is None for r in refs)]:
        del _anywhere[k]  # lists of parameters gone
    _anywhere[key] = ([weakref.ref(p) for p in params], anywhere)


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


_reduced = {}  # id -> weak reference of the parameters averaged by a backward since their optimizer's last step


def _was_reduced(p):
    ref = _reduced.get(id(p))
    return ref is not None and ref() is p


_backwards = 0  # backward passes so far: a pass over a loader that saw some was trained on


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


def _after_backward(loss, gradient_given=False):
    global _backwards
    if not _acting():
        return
    _backwards += 1
    params = _trained_parameters()
    summed, offset, losses = _step_reduction(loss)
    _reduce_gradients(params, summed)
    import weakref
    _reduced.update((id(p), weakref.ref(p)) for p in params)
    # the loss value too, so that what the script does with it (a line search, a plateau
    # scheduler, a print) sees the global batch's loss, as alone: a scalar, or one element
    # backpropagated without a gradient (a loss added up in torch.zeros(1)); per-sample losses,
    # one element on a rank whose share is one sample, come with a gradient of their own
    import torch
    if (isinstance(loss, torch.Tensor) and (loss.dim() == 0 or (loss.numel() == 1 and not gradient_given))
            and loss.is_floating_point() and not getattr(loss, "_dpshim_global", False)):
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


# --- the optimizer's step: gradients averaged before it, dp_step_end after ---

def _before_step(optimizer):
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    # an optimizer stepping another inside its own step reduces once; what a backward averaged
    # since this optimizer's last step is not averaged again
    if depth == 0:
        _reduce_gradients([p for p in _parameters([optimizer]) if not _was_reduced(p)])


def _after_step(optimizer):
    _state.depth -= 1
    if _state.depth == 0:
        for p in _parameters([optimizer]):
            _reduced.pop(id(p), None)
        if getattr(_state, "uneven_shares", False):
            _state.uneven_shares = False
            _realign_generators()
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


def _patch_optimizers(torch):
    import weakref
    base = torch.optim.Optimizer
    init = base.__init__

    @functools.wraps(init)
    def registering_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _optimizers.append(weakref.ref(self))
        _collect_soon(_parameters([self]))
        if _acting():  # parameters outside any module start as rank 0's too
            _broadcast_tensors([p for p in _parameters([self]) if not _is_lazy(p)])

    base.__init__ = registering_init
    _patch_optimizer_state(torch)
    backward = torch.autograd.backward

    @functools.wraps(backward)
    def reducing_backward(*args, **kwargs):
        if _acting():
            _collect_if_due()
        # (a summed step's gradients go at the end, plainly summed: see _step_reduction)
        if (_acting() and not _announcing_now() and _shim.overlap() and getattr(_state, "shared", False)
                and not any(x[0] == "sum" for x in getattr(_state, "losses", []))):
            _announce_during(_trained_parameters())
        try:
            result = backward(*args, **kwargs)
        finally:
            _backward_over()
        gradient = args[1] if len(args) > 1 else kwargs.get("grad_tensors", kwargs.get("grad_variables"))
        _after_backward(args[0] if args else kwargs.get("tensors"), gradient is not None)
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
