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
