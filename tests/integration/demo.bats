#!/usr/bin/env bats
# The README's first command: the demo reaches at least 84% test accuracy, and the same accuracy
# (within half a point) on 1 rank and on 4.
load helpers

accuracy() {
    sed -n 's/^final test accuracy \([0-9.]*\)%.*/\1/p' <<<"$1" | head -1
}

@test "demo: >= 84% on 4 ranks, within 0.5 points of 1 rank" {
    export BUILD_DIR=$BUILD
    run "$SRC/dev.sh" demo 1
    assert_success
    one=$(accuracy "$output")
    run "$SRC/dev.sh" demo 4
    assert_success
    four=$(accuracy "$output")
    echo "test accuracy: 1 rank $one%, 4 ranks $four%" >&3
    assert_le 84 "$one"
    assert_le 84 "$four"
    assert_le "$(awk -v a="$one" -v b="$four" 'BEGIN { d = a - b; print d < 0 ? -d : d }')" 0.5
}
