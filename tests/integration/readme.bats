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

# Every DPSHIM_ name that the documents and the programs' messages tell users about, with a value
# that fits it: the README, docs/, and the string literals of the shim, the policy, the tools and
# the adapter. Names of the public C header (its macros) and CMake options are no variables.
@test "every DPSHIM_ variable that a document or a message names is accepted" {
    local not_vars names name value
    not_vars=$( (grep -ohE 'DPSHIM_[A-Z0-9_]+' "$SRC"/hooks/include/dpshim/*.h
                 grep -ohE 'option\(DPSHIM_[A-Z0-9_]+' "$SRC"/CMakeLists.txt | cut -d'(' -f2) | sort -u)
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
