#!/usr/bin/env bats
# The documents agree with the code: docs/policy.md's reference is the key table's (`dpshim-diag
# keys` must appear in it verbatim), the example policy is generated, every variable named works.
load helpers

@test "docs/policy.md's reference matches the key table" {
    "$BUILD/bin/dpshim-diag" keys | grep -v '^$' >"$BATS_TEST_TMPDIR/keys.md"
    # every line of both tables is in docs/policy.md as it is
    run grep -vxFf "$SRC/docs/policy.md" "$BATS_TEST_TMPDIR/keys.md"
    assert_output ""
    [ "$(grep -c . "$BATS_TEST_TMPDIR/keys.md")" -gt 30 ] || fail "dpshim-diag keys printed too little"
}

@test "policy/dpshim.conf is the key table's example policy (dpshim-diag keys --conf), and valid" {
    run diff "$SRC/policy/dpshim.conf" <("$BUILD/bin/dpshim-diag" keys --conf)
    echo "$output"
    assert_success
    run "$BUILD/bin/dpshim-diag" check "$SRC/policy/dpshim.conf"
    assert_success
}

@test "README starts with the two commands, and .ci/run runs the test one" {
    run sed -n '3,6p' "$SRC/README.md"
    assert_line --index 1 --partial "./dev.sh demo"
    assert_line --index 2 --partial "./dev.sh test"
    run grep -x "./dev.sh test" "$SRC/.ci/run"
    assert_success
}

# The README's first screen: the launch lines after its opening paragraph, run as written from the
# source tree (build/ being the build directory the tests use), 4 ranks on this machine's cores.
@test "the README's first-screen launch lines run as written" {
    local block
    # the two sh blocks after it: the launch lines, then the line with the two settings
    block=$(awk '/^dpshim turns/ { on = 1 } on && /^```sh$/ { n++; inside = 1; next }
                 inside && /^```$/ { inside = 0; if (n == 2) exit; next } inside' "$SRC/README.md")
    echo "$block"
    [ "$(grep -c 'fmnist_train' <<<"$block")" = 2 ] || fail "the README's first screen lost its C launch lines"
    grep -q 'dpshim-run -np 4 python3 train.py$' <<<"$block" || fail "the README's first screen lost its PyTorch line"
    # the PyTorch line in a directory holding a train.py of its own, whose python3 has torch
    local dir=$BATS_TEST_TMPDIR/py
    mkdir -p "$dir/bin"
    ln -s "$(command -v /usr/bin/python3)" "$dir/bin/python3"
    cat >"$dir/train.py" <<'PYEOF'
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(data, batch_size=32, shuffle=True):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("last loss %.6f" % loss.item())
torch.save(model.state_dict(), "model.pt")
PYEOF
    local line
    while IFS= read -r -u 4 line; do
        [ -n "$line" ] || continue
        line=${line%%#*}
        line=${line//'$PWD/build/'/$BUILD/}
        line=${line//' build/'/ $BUILD/}
        [[ $line != build/* ]] || line=$BUILD/${line#build/}
        echo "# $line" >&3
        if [[ $line == *fmnist_train* ]]; then
            run timeout --kill-after=10 "$MPI_TIMEOUT" env OMPI_MCA_rmaps_base_oversubscribe=1 bash -c "cd '$SRC' && $line"
            assert_success
            assert_output --partial "epoch 1: 600 steps"
        else
            run timeout --kill-after=10 "$MPI_TIMEOUT" env OMPI_MCA_rmaps_base_oversubscribe=1 PATH="$dir/bin:$PATH" \
                bash -c "cd '$dir' && $line"
            assert_success
            [ -s "$dir/model.pt" ] || fail "no model.pt"
        fi
        echo "$output"
        assert_output --partial "SUMMARY 4 ranks on 1 host"
    done 4<<<"$block"
    # the two settings: one copy of the output, one checkpoint
    assert_equal "$(count "last loss")" 1
}

# Every DPSHIM_ name that the documents and the programs' messages tell users about, with a value
# that fits it: the README, docs/, and the string literals of the shim, the policy, the tools and
# the adapter. Names of the public C header (its macros) and CMake's options and cache entries
# are no variables.
@test "every DPSHIM_ variable that a document or a message names is accepted" {
    local not_vars names name value
    not_vars=$( (grep -ohE 'DPSHIM_[A-Z0-9_]+' "$SRC"/hooks/include/dpshim/*.h
                 grep -ohE '(option|set)\(DPSHIM_[A-Z0-9_]+' "$SRC"/CMakeLists.txt | cut -d'(' -f2) | sort -u)
    names=$( (cat "$SRC/README.md" "$SRC/CONTRIBUTING.md" "$SRC/CHANGELOG.md" "$SRC"/docs/*.md 2>/dev/null
              grep -rhoE '"[^"]*DPSHIM_[A-Z0-9_]*[A-Z0-9][^"]*"' "$SRC"/shim "$SRC"/policy "$SRC"/tools "$SRC"/hooks/adapters \
                  --include=*.c --include=*.py) | grep -oE 'DPSHIM_[A-Z0-9_]*[A-Z0-9]' | sort -u | grep -vxFf <(echo "$not_vars"))
    [ "$(wc -l <<<"$names")" -gt 20 ] || fail "too few names found: $names"
    "$BUILD/bin/dpshim-diag" keys >"$BATS_TEST_TMPDIR/keys.md"
    : >"$BATS_TEST_TMPDIR/empty.conf"
    for name in $names; do
        # a key's default, or a value of the variable's kind
        value=$(awk -F'|' -v n="\`$name\`" 'index($0, n) { gsub(/[` ]/, "", $3); print ($3 == "(empty)") ? "" : $3 }' \
            "$BATS_TEST_TMPDIR/keys.md")
        case $name in
        DPSHIM_POLICY) value=$BATS_TEST_TMPDIR/empty.conf ;;
        *_LIB) value=/nonexistent/lib.so ;;
        DPSHIM_RANK_PID) value=1:0:1:0:1:0 ;;
        DPSHIM_PYTHONPATH) value=unset ;;
        DPSHIM_HASHSEED) value=PMIX_NAMESPACE ;;
        esac
        run env "$name=$value" LD_PRELOAD="$SHIM" /bin/true
        [ "$status" -eq 0 ] || fail "$name=$value: exit $status: $output"
        refute_output --partial "unknown environment variable"
    done
}
