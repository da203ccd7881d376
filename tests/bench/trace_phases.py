"""Where the collectives of a step go (dev.sh bench_bn_phases): reads the per-rank traces of a
`[diag] dir` and prints, per hook, the milliseconds per step spent in it (mean of the ranks) and
how much of that was waiting for the last rank to arrive (the collective's latest start less
this rank's own; one host, one clock). BatchNorm's calls in a step are split into the forward's
(the first half: each layer sums its statistics once going forward, once going back) and the
backward's. Steps before --warmup are left out, as the scripts' own timing does.

    python3 trace_phases.py DIR --warmup 3"""

import argparse
import collections
import glob
import re


def read_trace(path):
    """[(seq, step, hook, begin_ns, end_ns)] of the collectives in one rank's trace."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 7 and parts[0] == "c":
                begin, end, seq, step = (int(v) for v in parts[1:5])
                out.append((seq, step, parts[6], begin, end))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    traces = [read_trace(f) for f in sorted(glob.glob(args.dir + "/trace.rank*.txt"),
                                            key=lambda f: int(re.search(r"rank(\d+)", f).group(1)))]
    if not traces:
        raise SystemExit("trace_phases: no trace.rankN.txt in %s (run with DPSHIM_DIAG_DIR set)" % args.dir)
    latest = collections.defaultdict(int)  # seq -> the last rank's start
    for trace in traces:
        for seq, _, _, begin, _ in trace:
            latest[seq] = max(latest[seq], begin)
    spent = collections.defaultdict(float)  # hook -> ns, all ranks
    waited = collections.defaultdict(float)
    steps = set()
    for trace in traces:
        per_step = collections.defaultdict(list)
        for c in trace:
            if c[1] >= args.warmup:
                per_step[c[1]].append(c)
        for step, calls in per_step.items():
            steps.add(step)
            bn = [c for c in calls if c[2] == "dp_bn_stats"]
            forward_bn = set(c[0] for c in bn[:len(bn) // 2])
            for seq, _, hook, begin, end in calls:
                name = hook if hook != "dp_bn_stats" else ("dp_bn_stats forward" if seq in forward_bn
                                                            else "dp_bn_stats backward")
                spent[name] += end - begin
                waited[name] += latest[seq] - begin
    # the last step seen may be cut short by the end of the run: count the complete ones
    n = max(len(steps), 1) * len(traces)
    print("collectives per step, ms (mean of %d ranks over %d steps): in the call, of it waiting for the last rank"
          % (len(traces), len(steps)))
    for name in sorted(spent, key=lambda k: -spent[k]):
        print("  %-22s %7.2f  waiting %7.2f" % (name, spent[name] / n / 1e6, waited[name] / n / 1e6))
    print("  %-22s %7.2f  waiting %7.2f" % ("all", sum(spent.values()) / n / 1e6, sum(waited.values()) / n / 1e6))


if __name__ == "__main__":
    main()
