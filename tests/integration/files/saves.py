# One small checkpoint saved in each common way into DIR, each outcome printed per rank:
#   python3 saves.py DIR [held | bound | fail | writes | differ]
# held: last, a file every rank holds open across a collective (both copies would exist at once
# where a rank's stand-in lay beside rank 0's file). bound: rank 1 writes 3 MiB to an open gated
# file and prints how much of it its stand-in keeps in memory. fail: the saves that can fail
# without aborting the interpreter. writes: 3000-byte os.write calls, each result printed. differ: a log whose lines differ in length by rank,
# with a collective after each.
import ctypes, errno, os, sys
import numpy as np, torch

d, mode = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
hooks, one = ctypes.CDLL(None), ctypes.c_double(1)
collective = lambda: hooks.dp_metric(ctypes.byref(one), ctypes.c_size_t(1), 0) if hasattr(hooks, "dp_metric") else None
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
collective()  # the ranks' file calls pair from the first collective on
state = {"w": torch.randn(10000, generator=torch.Generator().manual_seed(0))}
data = state["w"].numpy().tobytes()

def attempt(name, fn):
    try:
        fn(os.path.join(d, name))
        print("rank %s %s ok" % (rank, name), flush=True)
    except (OSError, RuntimeError) as e:
        print("rank %s %s failed %s %s" % (rank, name, type(e).__name__, getattr(e, "errno", "-")), flush=True)

def held(p):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        collective()
    finally:
        os.close(fd)

def bound(p):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for i in range(48):
        os.write(fd, bytes([i]) * 65536)
    st = os.fstat(fd)
    print("rank %s size %d kept %d" % (rank, st.st_size, st.st_blocks * 512), flush=True)
    os.close(fd)

def writes(p):
    fd, said = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), []
    for i in range(10):
        try:
            said.append(str(os.write(fd, data[3000 * i:3000 * (i + 1)])))
        except OSError as e:
            said.append(errno.errorcode[e.errno])
    collective()  # a write after a collective pairs as well
    try:
        os.write(fd, data[:10])
        said.append("ok")
    except OSError as e:
        said.append(errno.errorcode[e.errno])
    os.close(fd)
    print("rank %s writes: %s" % (rank, " ".join(said)), flush=True)

def differ(p):
    with open(p, "w", buffering=1) as log:
        for step in range(50):
            log.write("step %d %s\n" % (step, "x" * (10 + 40 * int(rank) * (step % 3))))
            collective()

def c_fwrite(p):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fopen.restype = ctypes.c_void_p
    f = libc.fopen(p.encode(), b"wb")
    if not f: raise OSError(ctypes.get_errno(), "fopen")
    n = libc.fwrite(data, 1, len(data), ctypes.c_void_p(f))
    if libc.fclose(ctypes.c_void_p(f)) != 0 or n != len(data): raise OSError(ctypes.get_errno(), "fwrite")

def replace(p):
    torch.save(state, p + ".tmp")
    os.replace(p + ".tmp", p)

if mode == "bound": attempt("bound.bin", bound)
if mode == "writes": attempt("writes.bin", writes)
if mode == "differ": attempt("differ.tmp", differ)
if mode not in ("bound", "writes", "differ"):
    if mode != "fail": attempt("zip.pt", lambda p: torch.save(state, p))  # on a full disk torch 1.13 aborts
    attempt("legacy.pt", lambda p: torch.save(state, p, _use_new_zipfile_serialization=False))
    attempt("array.npy", lambda p: np.save(p, state["w"].numpy()))
    attempt("fwrite.bin", c_fwrite)
    if mode != "fail": attempt("replaced.pt", replace)
if mode == "held": attempt("held.bin", held)  # last: the disk has room for no second copy now
collective()
