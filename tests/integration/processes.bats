#!/usr/bin/env bats
# Children of a rank process: forked workers, vfork+exec and system() children never enter the
# job's collectives, never hang it, and never finalize its MPI; the parent's job goes on.
load helpers

@test "forked, vforked and system() children act alone and the job completes (np=3)" {
    run mpi 3 env LD_PRELOAD="$SHIM" "$BUILD/bin/fork_workers"
    echo "$output"
    assert_success
    assert_equal "$(grep -oE 'fork_workers rank [0-2]: ok' <<<"$output" | wc -l)" 3
    assert_output --partial "children never enter collectives"
}

@test "a singleton with children behaves the same" {
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/fork_workers"
    assert_success
    assert_output --partial "fork_workers rank 0: ok"
}

@test "an interposed function with no real definition ends with a message naming it, not a SIGSEGV" {
    run "$BUILD/bin/real_missing"
    assert_equal "$status" 3
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/real_missing"
    echo "$output"
    assert_equal "$status" 70
    assert_output --partial "ERROR MPI_Init: the program calls it, but no library loaded after libdpshim.so defines it"
    refute_output --partial "crashed with signal"
}
