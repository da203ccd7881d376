"""Installation: the import hook at interpreter start, and the patches when the script imports torch."""

import ctypes
import functools
import os
import sys

from .common import _DTYPES, _holds_rank, _library_handle, _not_the_script, _on_import, _shim, _step_aside

# Interpreter start loads this module and common only (every Python process of a job pays for
# them); random_state joins them in a rank of a job of two or more ranks, and the modules that hold
# the patches load when the script imports torch (_install). None of them imports this one.

_installed = False


def _install(torch):
    global _installed
    if _installed:
        return
    _installed = True
    from . import data, gradients, losses, parameters
    from .random_state import _seed_torch
    _not_the_script(os.path.dirname(torch.__file__))
    _seed_torch(torch)
    _DTYPES.update({torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
                    torch.int32: 4, torch.int64: 5, torch.uint8: 6})
    parameters._patch_modules(torch)
    gradients._patch_optimizers(torch)
    data._patch_samplers(torch)
    if _shim.bn_sync:
        from .batchnorm import _patch_batchnorm
        _patch_batchnorm(torch)
    losses._patch_losses(torch)
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
    from .random_state import _agree_random_state
    _shim.bind(lib)
    _agree_random_state()
    # a silenced stdout that comes back if rank 0 is lost: line buffered as rank 0's is, as the
    # shim has C's (output.c says why); a stdout the script's environment replaced stays as it is
    try:
        lib.dpshim_stdout_may_return.restype, lib.dpshim_stdout_may_return.argtypes = ctypes.c_int, []
        if lib.dpshim_stdout_may_return():
            sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, OSError, ValueError):
        pass


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
