"""[comm] overlap: gradients announced to the engine while backward goes on, as DDP does."""

from .common import _DTYPES, _check, _shim, _tensors

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


def _announce_during(params):
    """From now until _backward_over, gradients of params are announced as they become final."""
    global _announcing
    _watch_accumulators(params)
    _announcing = _Announcing(params)


def _backward_over():
    global _announcing
    _announcing = None


def _announcing_now():
    return _announcing is not None
