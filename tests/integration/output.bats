#!/usr/bin/env bats
# [output] stdout: rank0 prints each line once; prefix tags every line with its rank and never
# tears one, for the rank process and the children that share its stdout.
load helpers

@test "stdout = rank0: a 4-rank run prints each line once, stderr from every rank" {
    run mpi 4 env DPSHIM_OUTPUT_STDOUT=rank0 LD_PRELOAD="$SHIM" \
        sh -c 'for i in $(seq 1 200); do echo "line $i"; done; echo "err $OMPI_COMM_WORLD_RANK" >&2'
    assert_success
    assert_equal "$(grep -c '^line ' <<<"$output")" 200
    assert_equal "$(grep '^line ' <<<"$output" | sort -u | wc -l)" 200
    assert_equal "$(grep -c '^err ' <<<"$output")" 4
}

@test "stdout = rank0: the trainer's report appears once" {
    run mpi 4 env DPSHIM_OUTPUT_STDOUT=rank0 LD_PRELOAD="$SHIM" "$TRAINER" --steps 5 --no-eval
    assert_success
    assert_equal "$(grep -c '^epoch 1: 5 steps' <<<"$output")" 1
}

@test "stdout = prefix: lines written in pieces come out whole and tagged (mpirun merges 4 ranks)" {
    # a training log's pace: each line written in two pieces
    cat >"$BATS_TEST_TMPDIR/log.sh" <<'SH'
i=0
while [ $i -lt 100 ]; do
    printf 'rank %s line %d ' "$OMPI_COMM_WORLD_RANK" $i
    printf 'xxxxxxxxxxxxxxxxxxxxxxxx\n'
    i=$((i + 1))
    sleep 0.002
done
SH
    run mpi 4 env DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$SHIM" sh "$BATS_TEST_TMPDIR/log.sh"
    assert_success
    for r in 0 1 2 3; do
        assert_equal "$(grep -cE "^\[r$r\] rank $r line [0-9]+ x+$" <<<"$output")" 100
    done
    assert_equal "$(grep -c . <<<"$output")" 400
}

@test "stdout = prefix under a flood: whole tagged lines from every writer of a rank, none torn" {
    # each rank's stdout is one shared file opened for appending, so the kernel, not the
    # launcher, merges the ranks: what the shim hands on must already be whole lines
    local n=400 out=$BATS_TEST_TMPDIR/all.out
    run mpi 4 sh -c 'exec env DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$0" "$1" "$2" >>"$3"' \
        "$SHIM" "$BUILD/bin/out_torture" $n "$out"
    assert_success
    for r in 0 1 2 3; do
        for who in parent child; do
            assert_equal "$(grep -cE "^\[r$r\] rank $r $who line [0-9]+ x+$" "$out")" $n
        done
        assert_equal "$(grep -cx "\[r$r\] rank $r stdio line xx" "$out")" 1
    done
    assert_equal "$(grep -c . "$out")" $((4 * (2 * n + 1)))
}

@test "stdout = prefix survives a rank process that replaces itself with exec" {
    run mpi 2 env DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$SHIM" sh -c 'echo before; exec sh -c "echo after"'
    assert_success
    for r in 0 1; do
        assert_line "[r$r] before"
        assert_line "[r$r] after"
    done
}

# A wrapper's own report when its trainer ends: /usr/bin/time -v writes it to stderr one
# character at a time, and the exit barrier ends every rank's trainer at the same moment, so
# the ranks' reports used to come out interleaved character by character (a line torn on one
# rank in about 1 run of 3). A wrapper's stderr is line buffered: every line whole, every run.
@test "a wrapper's report after the trainer ends (/usr/bin/time -v): every line whole on every rank, 10 runs at np=3" {
    [ -x /usr/bin/time ] || skip "no /usr/bin/time"
    local labels='Command being timed|User time|System time|Percent of CPU|Elapsed|Average shared|Average unshared|Average stack|Average total|Maximum resident|Average resident|Major|Minor|Voluntary|Involuntary|Swaps|File system inputs|File system outputs|Socket messages sent|Socket messages received|Signals delivered|Page size|Exit status'
    local i
    for i in $(seq 10); do
        run mpi 3 env LD_PRELOAD="$SHIM" /usr/bin/time -v "$TRAINER" --steps 1 --no-eval
        assert_success
        # 23 lines on each of 3 ranks, each a whole "label: value" line
        assert_equal "$(grep -cE "^	($labels)[^	]*: [^	]*\$" <<<"$output")" 69 || { echo "run $i: $output"; false; }
    done
}

@test "dlerror() at a program's start reports no error: the shim's start-up leaves none behind" {
    # a program may check dlerror() before its first dl call; the shim looks its own symbols up
    # without dlsym (a miss used to leave "undefined symbol: Py_BytesMain" in every process)
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/dlerror_print" none
    assert_success
    assert_output "(none)"
    run env LD_PRELOAD="$SHIM" DPSHIM_RANK_PID=1:0:1:0:1:0 "$BUILD/bin/dlerror_print" none
    assert_success
    assert_output "(none)"
}

@test "a dlerror() message printed by the first fprintf, fputs, fwrite, write or putc comes out whole" {
    # glibc frees the message at the next dl call: the shim's interposers must not make one then
    for how in fprintf fputs fwrite write putc; do
        run env LD_PRELOAD="$SHIM" DPSHIM_FILES_RANK0_ONLY='*.ckpt' "$BUILD/bin/dlerror_print" $how
        assert_success
        assert_output "libdpshim_test_nowhere.so: cannot open shared object file: No such file or directory"
    done
}
