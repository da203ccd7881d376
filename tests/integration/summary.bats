#!/usr/bin/env bats
# The line rank 0 prints at exit ([diag] summary): what the job did and where its time went, with
# the same figures as dpshim-diag report of the same run.
load helpers

# summary: the SUMMARY line of $output, without its prefix.
summary() { sed -n 's/.*\[dpshim r0\/[0-9]*\] SUMMARY //p' <<<"$output"; }

# field REGEX: the first group of REGEX (sed -E) in the summary.
field() { summary | sed -nE "s/.*$1.*/\\1/p"; }

@test "a job with a straggler: one summary line, with the report's figures and its straggler" {
    cd "$BATS_TEST_TMPDIR"
    # rank 2 computes 30 ms longer each step from step 2 on: the others wait for it
    run mpi 3 env DPSHIM_DIAG_DIR=diag LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 20 slow 2 2
    echo "$output"
    assert_success
    assert_equal "$(count "SUMMARY")" 1
    local line
    line=$(summary)
    [[ $line == "3 ranks on 1 host, "* ]] || fail "no ranks and hosts: $line"
    assert_equal "$(field ' ([0-9]+) steps,')" 20
    assert_equal "$(field ' ([0-9]+) collectives,')" 22
    [[ $line == *"slowest: rank 2 ($(hostname))"* ]] || fail "rank 2 is not named the slowest: $line"
    [[ $line == *"; more: dpshim-diag report $BATS_TEST_TMPDIR/diag" ]] || fail "no report command: $line"
    # the report of the same run: rank 0's row, and the straggler
    run "$BUILD/bin/dpshim-diag" report diag
    echo "$output"
    assert_success
    assert_line --partial "straggler: rank 2 arrived last"
    local row
    row=$(grep -E '^ +0 +[0-9]+ ' <<<"$output")
    read -r _ steps colls mb _ <<<"$row"
    assert_equal "$steps" 20
    assert_equal "$colls" 22
    [[ $line == *"collectives, $mb MB reduced per rank"* ]] || fail "MB: report $mb, summary: $line"
    # the share in collectives: the mean of the report's comm % column, within a point (rounding)
    local mean said
    mean=$(grep -E '^ +[0-9]+ +[0-9]+ ' <<<"$output" | awk '{ sub("%", "", $9); s += $9 } END { print s / NR }')
    said=$(sed -nE 's/.*in collectives ([0-9.]+)% of the wall time.*/\1/p' <<<"$line")
    echo "report's mean comm % $mean, summary's $said" >&3
    assert_le "$(awk -v a="$mean" -v b="$said" 'BEGIN { d = a - b; print d < 0 ? -d : d }')" 1
    # rank 2 barely waits and the other two wait 30 ms of every step of about 50: about a third
    assert_le 15 "$said"
}

@test "a rank that a shell under the preload runs as its child: its own wall time and [diag] figures" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_DIAG_DIR=diag LD_PRELOAD="$SHIM" sh -c '"$0" "$1"; true' "$BUILD/bin/guard_faults" 5
    echo "$output"
    assert_success
    local seconds
    seconds=$(field ', ([0-9.]+) s: ')
    [ -n "$seconds" ] && awk -v s="$seconds" 'BEGIN { exit !(s < 60) }' || fail "wall time $seconds s"
    assert_equal "$(field ' ([0-9]+) steps,')" 5
    run "$BUILD/bin/dpshim-diag" report diag
    echo "$output"
    assert_success
    grep -qE '^ +1 +5 ' <<<"$output" || fail "no row of rank 1 with 5 steps"
}

@test "the summary by default, pointing to [diag] dir; off with [diag] summary = off or [diag] log = error" {
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5
    assert_success
    assert_equal "$(count "SUMMARY")" 1
    assert_output --regexp "\[dpshim r0/2\] SUMMARY 2 ranks on 1 host, [0-9.]+ s: 5 steps, 7 collectives, 0\.0 MB reduced per rank; in collectives"
    assert_output --partial "; more: [diag] dir = DIR keeps per-rank figures and traces for dpshim-diag report DIR"
    run mpi 2 env DPSHIM_DIAG_SUMMARY=off LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5
    assert_success
    refute_output --partial "SUMMARY"
    run mpi 2 env DPSHIM_DIAG_LOG=error LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5
    assert_success
    refute_output --partial "SUMMARY"
    # a process alone, and a job of one rank, have nothing to summarize
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5
    refute_output --partial "SUMMARY"
    run mpi 1 env LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5
    refute_output --partial "SUMMARY"
}

@test "the summary of a job that distributed nothing, and of one without an exit barrier" {
    run mpi 2 env LD_PRELOAD="$SHIM" /bin/true
    assert_success
    assert_output --regexp "SUMMARY 2 ranks on 1 host, [0-9.]+ s: 0 steps, 0 collectives, 0\.0 MB reduced per rank; no work was shared out \(see the warning above\);"
    # without the exit barrier, rank 0 has its own figures only, and says so
    run mpi 3 env DPSHIM_GUARD_EXIT_BARRIER=off LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5
    assert_success
    assert_output --partial "; figures of 1 of 3 ranks ([guard] exit_barrier = off)"
}
