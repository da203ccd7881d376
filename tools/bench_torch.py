"""dpshim-bench inside a Python process with torch loaded (`dpshim-diag bench --init python`).

Run under mpirun with libdpshim.so preloaded, as a PyTorch script is: the shim's Python adapter
is loaded at interpreter start and has opened the backend (MPI) by the time this runs, torch is
imported (its threads and allocator live in the process), and the benchmark of
libdpshim-bench.so then measures the shim's all-reduce against plain MPI_Allreduce calls.
"""
import ctypes
import os
import sys

import torch  # noqa: F401  (the world measured: a process with torch loaded)

here = os.path.dirname(os.path.abspath(__file__))
bench = ctypes.CDLL(os.path.join(here, "libdpshim-bench.so"), mode=ctypes.RTLD_GLOBAL)  # a helper beside it
args = [b"dpshim-bench", b"--init", b"python"] + [a.encode() for a in sys.argv[1:]]
argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
sys.stdout.flush()
rc = bench.dpshim_bench_main(len(args), argv)
sys.stdout.flush()
sys.exit(rc)
