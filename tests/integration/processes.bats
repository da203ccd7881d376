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
