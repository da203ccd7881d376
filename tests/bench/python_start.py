"""What the PyTorch adapter adds to a Python interpreter's start: `python3 -c pass` under the
preloaded library, alternating between [adapters] python = off and each plugin directory given
(a copy of a build's lib/dpshim/ holding another version of the adapter compares two versions
side by side), N starts each; prints the median and the 10th percentile of each one's wall time,
and the median of its CPU time (user and system), which a busy machine disturbs less.
A single process is a world of one, so what is measured is the adapter's import, not its work
in a job (docs/performance.md).
    usage: python_start.py LIBDPSHIM [N] [NAME=PLUGIN_DIR ...]
           (default: the plugin directory beside LIBDPSHIM, named "adapter")"""

import os
import resource
import statistics
import subprocess
import sys
import time


def main():
    lib = os.path.abspath(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    variants = [("off", None)] + [tuple(a.split("=", 1)) for a in sys.argv[3:]]
    if len(variants) == 1:
        variants.append(("adapter", os.path.join(os.path.dirname(lib), "dpshim")))
    python = os.environ.get("PYTHON", "/usr/bin/python3")
    times = {name: [] for name, _ in variants}
    cpu = {name: [] for name, _ in variants}
    for _ in range(n):
        for name, plugins in variants:
            env = dict(os.environ, LD_PRELOAD=lib)
            if plugins is None:
                env["DPSHIM_ADAPTERS_PYTHON"] = "off"
            else:
                env["DPSHIM_PLUGIN_DIR"] = plugins
            r, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run([python, "-c", "pass"], env=env, check=True)
            times[name].append(time.perf_counter() - t)
            u = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(u.ru_utime - r.ru_utime + u.ru_stime - r.ru_stime)
    for name, ts in times.items():
        ts.sort()
        print("%-10s wall median %6.1f ms  p10 %6.1f ms   CPU median %6.1f ms  (%d starts)"
              % (name, 1e3 * statistics.median(ts), 1e3 * ts[len(ts) // 10], 1e3 * statistics.median(cpu[name]),
                 len(ts)))


if __name__ == "__main__":
    main()
