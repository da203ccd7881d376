"""Data: every rank draws the same order, and keeps its share of each batch or epoch; evaluation takes it whole."""

import collections
import ctypes
import itertools

from . import gradients
from .common import _acting, _check, _shim, _state, _step_aside
from .parameters import _collect_if_due, _forwarded


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

    def epoch_indices(s):
        """The sampler's indices for a pass, and what is left of its iterator. PyTorch's own
        RandomSampler, without replacement and given the script's generator, draws once more
        where its iterator ends, which a pass left early never reaches alone: it is read to its
        length now and ended with the pass. (With replacement it draws as it goes: read whole.)"""
        it = iter(s)
        if type(s) is sampler.RandomSampler and not s.replacement and s.generator is not None:
            return list(itertools.islice(it, len(s))), it
        return list(it), iter(())

    def shard(whole, idx):
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
        _collect_if_due()  # the models still alive say whether this pass is an evaluation
        whole = self.__dict__["_dpshim_whole"] = _whole_data(self)
        idx, rest = epoch_indices(self.sampler)
        idx = shard(whole, idx)
        pending = self.__dict__["_dpshim_pending"] = collections.deque()  # a new epoch
        self.__dict__["_dpshim_backwards"] = gradients._backwards
        yield from cut(self, idx, whole, pending)
        for _ in rest:  # the sampler's end, where the loader asks past the last batch, as alone
            pass
        # scale mode: what ranks lost in this epoch had not trained is shared out where the
        # loop's pass ends (late_rest), not here: the loader may fetch ahead of the loop

    def cut(self, idx, whole, pending, rest=False):
        for start in range(0, len(idx), self.batch_size):
            batch = idx[start:start + self.batch_size]
            if len(batch) < self.batch_size and self.drop_last and not rest:  # the rest is trained whole
                break
            if whole:  # evaluation: every rank the whole batch, weighted 1/N
                pending.append((len(batch), _shim.size, True))
                yield batch
                continue
            arr = _index_array(batch)
            # split mode: this rank's share; scale mode keeps the batch, told on delivery alone
            # (dp_batch counts what a step trains)
            keep = _shim.dp_batch(arr, len(batch)) if _shim.split else len(batch)
            if len(batch) < _shim.size and _shim.split:
                # fewer samples than ranks: every rank takes them all, weighted 1/N (no rank
                # may get an empty batch, which collate cannot build)
                pending.append((len(batch), _shim.size, False))
                yield batch
                continue
            pending.append((len(batch), 1, False))
            yield [arr[i] for i in range(keep)]

    def epoch_rest():
        n = _shim.dp_epoch_rest(None, 0)
        if not n:
            return []
        arr = (ctypes.c_uint64 * n)()
        _shim.dp_epoch_rest(arr, n)
        return list(arr)

    def length(self):
        if isinstance(self.sampler, torch.utils.data.distributed.DistributedSampler):
            _step_aside("a DistributedSampler")
        if not sized(self.sampler) or not _acting():
            return batch_len(self)
        _collect_if_due()
        n = len(self.sampler)
        whole = self.__dict__.get("_dpshim_whole")  # as the last pass over it, or as now
        if n and not (_evaluation_now(self) if whole is None else whole):
            n = _shim.dpshim_epoch_count(n)
        return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size

    sampler.BatchSampler.__iter__ = batches
    sampler.BatchSampler.__len__ = length

    # Scale mode, in a job that goes on without lost ranks: where the loop's pass is over (not
    # where the sampler ends: DataLoader workers fetch ahead), what ranks lost in the epoch had not
    # trained, shared out until nothing is left; those batches are fetched here, in the loop's
    # process, as the workers have stopped.
    def late_rest(it):
        batches = it._index_sampler
        pending = getattr(batches, "_dpshim_pending", None)
        if pending is None or batches.__dict__.get("_dpshim_whole") or _shim.split or not _acting():
            return None
        idx = epoch_rest()
        late = it.__dict__["_dpshim_late"] = collections.deque(cut(batches, idx, False, pending, rest=True))
        return late

    def fetch_late(it, late):
        fetcher = it.__dict__.get("_dpshim_fetcher")
        if fetcher is None:
            fetcher = it.__dict__["_dpshim_fetcher"] = torch.utils.data._utils.fetch._MapDatasetFetcher(
                it._dataset, it._auto_collation, it._collate_fn, it._drop_last)
        data = fetcher.fetch(late.popleft())
        if it._pin_memory:
            data = torch.utils.data._utils.pin_memory.pin_memory(data)
        return data

    # The loader may fetch batches ahead of the training loop; the share that weighs a step's
    # gradients must be that of the batch the loop just got, so it is recorded on delivery.
    base_iter = torch.utils.data.dataloader._BaseDataLoaderIter
    next_batch = base_iter.__next__
    reset = base_iter._reset

    def new_pass(self, loader, *args, **kwargs):  # also a persistent workers' iterator's next pass
        self.__dict__.pop("_dpshim_late", None)
        self.__dict__.pop("_dpshim_over", None)
        return reset(self, loader, *args, **kwargs)

    def delivered(self):
        late = self.__dict__.get("_dpshim_late")
        if late:
            return deliver(self, fetch_late(self, late))
        if late is None:  # the loader's own batches
            try:
                return deliver(self, next_batch(self))
            except StopIteration:
                pass
        # the loop's pass is over, but for what ranks lost meanwhile had not trained (asked once
        # more on every rank alike; a call after the end asks nothing)
        if not self.__dict__.get("_dpshim_over"):
            late = late_rest(self)
            if late:
                return deliver(self, fetch_late(self, late))
            self.__dict__["_dpshim_over"] = late is not None
        batches = self._index_sampler
        if gradients._backwards != getattr(batches, "_dpshim_backwards", gradients._backwards):
            batches.__dict__["_dpshim_trained_on"] = True
        _state.replicas, _state.shared = 1, False  # batches made by hand after it are the script's own
        raise StopIteration

    def deliver(self, data):
        pending = getattr(self._index_sampler, "_dpshim_pending", None)
        if pending and _acting():  # a forked child's copy is not this pass's
            n, replicas, evaluation = pending.popleft()
            if evaluation:  # shares nothing out: a job that only evaluates is told so at exit
                _shim.dpshim_batch_whole(n)
            else:
                _shim.dp_batch(_index_array(range(n * replicas)), n * replicas)
                # shares of different sizes: the step's end sees that the random state stays one
                _state.uneven_shares = (getattr(_state, "uneven_shares", False) or
                                        (_shim.split and replicas == 1 and n % _shim.dp_world_size() != 0))
            _state.replicas, _state.shared = replicas, replicas == 1
        return data

    base_iter.__next__ = delivered
    base_iter._reset = new_pass


def _evaluating(trained_on=False):
    """No backward can follow: gradients are off, or every model that ran is in eval mode and
    the loader was not trained on in an earlier pass (fine-tuning with frozen BatchNorm and
    Dropout keeps the model in eval mode)."""
    import torch
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return True
    models = [m for m in (r() for r in _forwarded) if m is not None]
    return bool(models) and not any(m.training for m in models) and not trained_on


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
