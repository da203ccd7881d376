# Shared by the PyTorch bats files (after helpers.bash).

PY=/usr/bin/python3 # Debian's interpreter, the one python3-torch belongs to

# rel A B: max over tensors of max|a-b| / max|a|; "bitwise" when all are equal.
rel() {
    "$PY" - "$1" "$2" <<'PYEOF'
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys()
worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-30)).item()
            for k in a if a[k].dtype.is_floating_point)
same = all(torch.equal(a[k], b[k]) for k in a)
print("bitwise" if same else "%.3e" % worst)
PYEOF
}

# assert_rels TOL A B [TOL A B]...: for each triple, B's saved tensors are A's bitwise (TOL
# "bitwise") or within TOL as rel measures them; each figure goes to the test's log (fd 3). One
# Python process for them all: each start of torch costs seconds.
assert_rels() {
    local out
    out=$("$PY" - "$@" <<'PYEOF' 2>&1
import sys, torch
args, failed = sys.argv[1:], False
for i in range(0, len(args), 3):
    tol, a, b = args[i], torch.load(args[i + 1]), torch.load(args[i + 2])
    assert a.keys() == b.keys(), "%s and %s hold other tensors" % (args[i + 1], args[i + 2])
    if all(torch.equal(a[k], b[k]) for k in a):
        r, ok = "bitwise", True
    else:
        worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-30)).item()
                    for k in a if a[k].dtype.is_floating_point)
        r, ok = "%.3e" % worst, tol != "bitwise" and worst <= float(tol)
    print("%s against %s: rel=%s%s" % (args[i + 2], args[i + 1], r, "" if ok else ", wanted " + tol))
    failed |= not ok
sys.exit(1 if failed else 0)
PYEOF
    ) || fail "$out"
    echo "$out" >&3
}
