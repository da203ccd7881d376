#!/usr/bin/env bats
# The README's policy reference is the key table's: `dpshim-diag keys` must appear in it verbatim.
load helpers

@test "README policy table matches the key table" {
    "$BUILD/bin/dpshim-diag" keys >"$BATS_TEST_TMPDIR/keys.md"
    run grep -cxFf "$BATS_TEST_TMPDIR/keys.md" "$SRC/README.md"
    assert_output "$(wc -l <"$BATS_TEST_TMPDIR/keys.md")"
}

@test "README starts with the two commands, and .ci/run runs the test one" {
    run sed -n '3,6p' "$SRC/README.md"
    assert_line --index 1 --partial "./dev.sh demo"
    assert_line --index 2 --partial "./dev.sh test"
    run grep -x "./dev.sh test" "$SRC/.ci/run"
    assert_success
}
