"""Losses: a loss function's training loss is the global batch's value as soon as it returns."""

import functools
import inspect

from .common import _acting, _caller, _state, _shim
from .data import _evaluating
from .gradients import _global_sum, _global_value


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
                    or loss.dim() != 0 or not loss.is_floating_point() or getattr(_state, "replicas", 1) != 1
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
