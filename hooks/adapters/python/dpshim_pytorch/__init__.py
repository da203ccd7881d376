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

The modules, each importing only ones listed before it: common (the binding to libdpshim.so and
this process's state), parameters, overlap, optimizer_sharding, gradients (the backward pass and
the optimizer step), data, losses, batchnorm, random_state, and installation, which puts the
others in place. Interpreter start imports installation and common only; random_state follows in
a rank of a job, the rest when the script imports torch.
"""

from .installation import install_import_hook

__all__ = ["install_import_hook"]  # sitecustomize's entry
