"""same_as_alone.py ALONE JOB: the C++ trainer's stdout alone and rank 0's under dpshim, line by
line: the words equal, the numbers within 1e-9 relative (float64: the ranks' shares sum in
another order), the weights' bytes and the optimizer's state size left out."""
import sys

def lines(path):
    return [l.split() for l in open(path) if not l.startswith(("weights_hash", "state_elements"))]

alone, job = lines(sys.argv[1]), lines(sys.argv[2])
assert len(alone) == len(job), "%d lines alone, %d under dpshim" % (len(alone), len(job))
worst = 0.0
for a, b in zip(alone, job):
    assert len(a) == len(b), "%s against %s" % (" ".join(a), " ".join(b))
    for x, y in zip(a, b):
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            assert x == y, "%s against %s" % (" ".join(a), " ".join(b))
            continue
        worst = max(worst, abs(fx - fy) / max(abs(fx), abs(fy), 1e-300))
print("max rel diff", worst)
assert worst <= 1e-9, "more than 1e-9 apart"
