"""Random state: rank 0's seeds everywhere, at interpreter start and at every seeding call of the script."""

import ctypes
import functools
import os
import struct
import sys

from .common import DP_MAX, _acting, _check, _in_place, _on_import, _say_once, _shim, _state

# At interpreter start, before the script runs, one value agreed from rank 0 seeds Python's
# random at once, NumPy's legacy global generator and torch's global generators when they are
# imported; a seeding call of the script takes rank 0's argument, so a seed taken from the time
# or the pid is the same on every rank, and rank 0 seeds as it would alone; a dataset's, while a
# loader fetches, keeps its own.

_MASK64 = (1 << 64) - 1
_job_seed = None  # the agreed value


def _fetching():
    """The generators a dataset seeded in the fetch under way on this thread, each with its state
    before the fetch and how to set it back; None outside a fetch."""
    return getattr(_state, "fetch_saves", None)


def _agreeing():
    return _job_seed is not None and _fetching() is None and _acting()


def _keep_for_fetch(key, saved_state):
    """Before a seeding call inside a fetch: the generator's state, once per fetch."""
    saves = _fetching()
    if saves is not None and key not in saves:
        saves[key] = saved_state()


def _own_seeds_in_fetches(torch):
    """A dataset's seeding calls keep their own argument where the loop's process fetches
    (num_workers=0) a map-style dataset's samples, and their effect ends with the fetch, as in a
    DataLoader worker: a dataset seeds by the sample's index (torchvision's FakeData makes each
    sample so, augmentations draw so per sample), each rank fetches samples of its own, and rank
    0's index would give every rank rank 0's samples, while a generator left seeded by each
    rank's last index would part the ranks' draws after the fetch."""
    fetcher = torch.utils.data._utils.fetch._MapDatasetFetcher
    fetch = fetcher.fetch

    @functools.wraps(fetch)
    def fetched(self, *args, **kwargs):
        outer = _fetching()
        if outer is None:
            _state.fetch_saves = {}
        try:
            return fetch(self, *args, **kwargs)
        finally:
            if outer is None:
                saves, _state.fetch_saves = _state.fetch_saves, None
                for set_back, before in saves.values():
                    set_back(before)

    fetcher.fetch = fetched


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


def _agreed_seed_call(seed_fn, saved_state, arg_of=lambda a: a, none_fails=False):
    """seed_fn wrapped so that every rank seeds with rank 0's argument; with none_fails, a None
    argument goes to seed_fn as it is (torch.manual_seed(None) fails alone, and so here).
    saved_state(): (how to set it back, the generator's state), kept by a fetch."""
    @functools.wraps(seed_fn)
    def seed(*args, **kwargs):
        a = args[0] if args else kwargs.pop("a", kwargs.pop("seed", None))
        _keep_for_fetch(seed_fn, saved_state)
        if not _agreeing() or (a is None and none_fails):
            return seed_fn(a, *args[1:], **kwargs)
        return seed_fn(arg_of(_decode_seed(_agree_bytes(_encode_seed(a)), a)), *args[1:], **kwargs)
    seed._dpshim = True
    return seed


def _realign_generators():
    """After a step whose batch the ranks held in shares of different sizes (split mode, N not
    dividing it): draws sized by the share (Dropout, noise) took more numbers from torch's CPU
    generator on some ranks, and a random choice made in a later step (a stochastic depth, an
    augmentation chosen per step) would part the ranks. Where the ranks' generators differ, every
    rank goes on from rank 0's (a checksum compared, then rank 0's state sent)."""
    import hashlib
    import torch
    state = torch.get_rng_state()
    h = float(int.from_bytes(hashlib.blake2b(state.numpy().tobytes(), digest_size=6).digest(), "little"))
    v = (ctypes.c_double * 2)(h, -h)
    _check(_shim.dp_metric(v, 2, DP_MAX), "dp_metric")
    if v[0] == -v[1]:
        return
    owners = (ctypes.c_int32 * 1)(0)
    _in_place(lambda arr, n: _shim.dp_from_owners(arr, n, owners), "dp_from_owners", [state])
    torch.set_rng_state(state)
    _say_once("realign", "WARN",
              "after step %d the ranks' random generators differed: random draws sized by each rank's share of "
              "a batch (Dropout, noise), where the number of ranks does not divide the batch, take more numbers on "
              "some ranks; every rank goes on from rank 0's generator at the end of such a step. A random choice "
              "made in the same step after such a draw still parts the ranks" % (_shim.steps + 1))


def _derive(k):
    return (_job_seed * 0x9E3779B97F4A7C15 + k * 0xBF58476D1CE4E5B9) & _MASK64


def _seed_random(module):
    if not getattr(module.seed, "_dpshim", False):
        module.seed(_derive(1))
        module.seed = _agreed_seed_call(module.seed, lambda: (module.setstate, module.getstate()))


def _seed_numpy(module):
    r = getattr(module, "random", None)
    if r is not None and not getattr(r.seed, "_dpshim", False):
        r.seed(_derive(2) & 0xFFFFFFFF)
        r.seed = _agreed_seed_call(r.seed, lambda: (r.set_state, r.get_state()),
                                   lambda v: v & 0xFFFFFFFF if type(v) is int else v)


def _seed_torch(torch):
    manual_seed = torch.random.manual_seed
    torch_seed = torch.random.seed
    manual_seed(_job_seed)  # CPU and CUDA

    def torch_states():
        def set_back(states):
            torch.set_rng_state(states[0])
            if states[1] is not None:
                torch.cuda.set_rng_state_all(states[1])
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return set_back, (torch.get_rng_state(), cuda)

    @functools.wraps(torch_seed)
    def seed_now():  # torch.seed(): a fresh seed, rank 0's
        _keep_for_fetch(manual_seed, torch_states)
        v = _decode_seed(_agree_bytes(_encode_seed(None)), None) if _agreeing() else None
        if v is None:
            return torch_seed()
        manual_seed(v)
        return v

    torch.manual_seed = torch.random.manual_seed = _agreed_seed_call(manual_seed, torch_states, none_fails=True)
    torch.seed = torch.random.seed = seed_now
    _own_seeds_in_fetches(torch)


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
