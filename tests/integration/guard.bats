#!/usr/bin/env bats
# The guard: a rank that leaves early, stalls, crashes or calls a collective the others do not
# ends the job within [guard] timeout + 15 s, non-zero, naming the rank, the step and the
# operation; healthy jobs are never stopped.
load helpers

# the guard's tables name each rank's host: here every rank's is this machine's
HOST=$(hostname)

TIMEOUT=5


@test "rank 1 exits at step 5 while the others go on" {
    fault exit 1 5
    assert_failure
    assert_output --regexp "guard: rank 1 left the program after step 4 \(its last collective #5\), while rank [023] waits in dp_grads collective #6"
    assert_output --regexp "rank 1 \($HOST\): left the program \(exit\) after step 4 and collective #5  <-- culprit"
    [ "$elapsed" -lt "$TIMEOUT" ] # detected at once, not by the timeout
}

# stalled_report COUNT: the watchdog's table when rank 1 stalled inside step 5 and the others
# wait in dp_grads for COUNT floats.
stalled_report() {
    assert_failure
    assert_output --partial "guard: dp_grads collective #6 (after step 4) has waited"
    assert_output --regexp "rank 1 \($HOST\): in the program's own code for [0-9.]+ s, since dp_grads collective #5 after step 4  <-- culprit"
    for r in 0 2 3; do
        assert_output --regexp "rank $r \\($HOST\\): in dp_grads \(all-reduce f32 x $1\), collective #6 after step 4, waiting"
    done
}

@test "rank 1 stalls inside step 5: the watchdog lists every rank's position" {
    fault stall 1 5
    stalled_report 1000
    # without the launcher's recovery mode: how to let the others go on
    assert_output --partial "guard: to let the other ranks go on without a lost or stalled rank, launch under the launcher's recovery mode: dpshim-run --enable-recovery"
    DPSHIM_ELASTIC_LOST_RANK=end fault stall 1 5
    stalled_report 1000
    refute_output --partial "to let the other ranks go on"
    fault stall 0 5
    assert_failure
    refute_output --partial "to let the other ranks go on"
}

@test "[comm] overlap: rank 1 stalls while the others wait in dp_grads for their background reductions" {
    GUARD_FAULTS_ANNOUNCE=1 fault stall 1 5
    stalled_report 70000
}

@test "[comm] overlap: rank 1 exits while the others' background reductions wait for it" {
    GUARD_FAULTS_ANNOUNCE=1 fault exit 1 5
    assert_failure
    assert_output --regexp "guard: rank 1 left the program after step 4 \(its last collective #5\), while rank [023] waits in dp_grads collective #6"
    [ "$elapsed" -lt "$TIMEOUT" ]
}

@test "[comm] overlap, desync = full: an extra call is caught against the announced gradients" {
    GUARD_FAULTS_ANNOUNCE=1 DPSHIM_GUARD_DESYNC=full fault extra 2 3
    assert_failure
    assert_output --partial "rank 2 ($HOST): dp_metric (all-reduce f64 x 1), collective #5 after step 2  <-- culprit"
    assert_output --partial "rank 0 ($HOST): dp_grad_ready (all-reduce f32 x 70000), collective #5 after step 3"
    [ "$elapsed" -lt "$TIMEOUT" ]
}

@test "rank 3 dies with SIGSEGV at step 4: named with its signal and step" {
    fault crash 3 4
    assert_failure
    assert_output --partial "guard: rank 3 crashed with signal 11 (Segmentation fault) after step 3, after dp_grads collective #4"
}

@test "rank 2 calls one extra all-reduce at step 3, desync = step: caught, naming rank, step and call" {
    fault extra 2 3
    assert_failure
    assert_output --regexp "rank 2 \($HOST\): in dp_metric \(all-reduce f64 x 1\), collective #5 after step 2, waiting [0-9.]+ s  <-- culprit"
    assert_output --regexp "rank 0 \($HOST\): in the shim's desync check \(step end\) after collective #4 and step 3"
}

@test "rank 2 calls one extra all-reduce at step 3, desync = full: caught at that very call" {
    DPSHIM_GUARD_DESYNC=full fault extra 2 3
    assert_failure
    assert_output --partial "guard: desync: the ranks are about to make different collective calls; each rank's call:"
    assert_output --partial "rank 2 ($HOST): dp_metric (all-reduce f64 x 1), collective #5 after step 2  <-- culprit"
    assert_output --partial "rank 0 ($HOST): dp_grads (all-reduce f32 x 1000), collective #5 after step 3"
    [ "$elapsed" -lt "$TIMEOUT" ] # at once, not by the watchdog
}

# desync = step (the default) carries the drift check in its step-end comparison; full and off
# make a comparison of its own
@test "rank 2's parameters are perturbed at step 10: the drift check names step and tensor in every desync mode" {
    for mode in step full off; do
        DPSHIM_GUARD_DESYNC=$mode DPSHIM_GUARD_DRIFT_EVERY=5 fault perturb 2 10
        assert_failure
        assert_output --partial "guard: drift after step 10: parameter tensor 0 'w' is not the same on every rank"
        assert_output --regexp "rank 2 \($HOST\): checksum [0-9a-f]{16}  <-- differs"
        refute_output --partial "desync"
    done
}

@test "every check on (desync = full or step, drift every step) in a healthy run: no false alarm" {
    for mode in full step; do
        DPSHIM_GUARD_DESYNC=$mode DPSHIM_GUARD_DRIFT_EVERY=1 fault
        assert_success
        assert_equal "$(count 'finished 10 steps, 4 ranks')" 4
    done
}

@test "rank 0 calls a collective inside a scope: no hang, the right result, a note" {
    fault scope 0 3
    assert_success
    assert_output --partial "rank 0: collective inside the scope gave 7"
    assert_output --partial "dp_metric inside rank-0 scope 'save': it acts as world size 1"
    assert_equal "$(count 'finished 10 steps, 4 ranks')" 4
}

@test "20 consecutive healthy 4-rank trainer runs with every guard on: all exit 0" {
    cd "$BATS_TEST_TMPDIR"
    for i in $(seq 1 20); do
        run mpi 4 env DPSHIM_GUARD_TIMEOUT=$TIMEOUT DPSHIM_GUARD_DESYNC=full DPSHIM_GUARD_DRIFT_EVERY=5 \
            LD_PRELOAD="$SHIM" "$TRAINER" --steps 20 --no-eval --train-limit 4000
        [ "$status" -eq 0 ] || fail "run $i: $output"
        refute_output --partial "guard:"
    done
}

@test "rank 0 working alone after the others finished (longer than the timeout) is no error" {
    run mpi 2 env DPSHIM_GUARD_TIMEOUT=2 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 linger 0 5
    echo "$output"
    assert_success
    assert_output --partial "rank 1 finished; 1 rank(s) still running after [guard] timeout = 2 s, leaving without them"
    assert_equal "$(count 'finished 5 steps, 2 ranks')" 2
}

# A program that calls MPI_Init itself gets an MPI below MPI_THREAD_MULTIPLE: no side channel,
# yet a stuck collective still ends the job, and rank 0 says once what is missing.
@test "MPI_Init by the program (no MPI_THREAD_MULTIPLE): a stall still ends the job, naming the collective" {
    MPI_TIMEOUT=60
    local start=$SECONDS
    run mpi 2 env DPSHIM_GUARD_TIMEOUT=3 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_mpi_init" 10 stall 1 3
    elapsed=$((SECONDS - start))
    echo "$output"
    echo "ended after $elapsed s" >&3
    assert_failure
    [ "$status" -ne 124 ] && [ "$status" -ne 137 ] || fail "killed by timeout after $elapsed s"
    [ "$elapsed" -le 20 ] || fail "took $elapsed s"
    assert_output --partial "MPI thread level below multiple"
    assert_output --partial "[dpshim r0/2] ERROR guard: dp_grads collective #4 (after step 2) has waited"
    assert_output --regexp "rank 0 \($HOST\): in dp_grads \(all-reduce f32 x 1000\), collective #4 after step 2, waiting [0-9.]+ s"
    assert_output --partial "without MPI_THREAD_MULTIPLE"
    assert_output --partial "ending the job (exit status 75)"
}

@test "MPI_Init by the program, healthy: runs to the end, one warning on rank 0 that the guard is limited" {
    run mpi 2 env DPSHIM_GUARD_TIMEOUT=3 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_mpi_init" 5
    echo "$output"
    assert_success
    assert_equal "$(count 'finished 5 steps, 2 ranks')" 2
    assert_equal "$(count 'WARN guard:')" 1
    assert_output --partial "[dpshim r0/2] WARN guard:"
    assert_output --partial "MPI_Init_thread with MPI_THREAD_MULTIPLE"
}

# --- one job, one truth ----------------------------------------------------------------------

# on_rank R VAR=VALUE... -- CMD: CMD with the shim on every rank, the variables on rank R only
on_rank() {
    local r=$1
    shift
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    mpi 4 sh -c 'r=$1 shim=$2; shift 2; vars=""
        while [ "$1" != -- ]; do vars="$vars $1"; shift; done; shift
        [ "$OMPI_COMM_WORLD_RANK" = "$r" ] && export $vars
        exec env LD_PRELOAD="$shim" "$@"' sh "$r" "$SHIM" "${vars[@]}" -- "$@"
}

@test "a policy that differs on one rank stops the job before any gradient moves, naming key, ranks and values" {
    run on_rank 1 DPSHIM_DATA_MODE=scale DPSHIM_COMM_REDUCE=sum -- "$BUILD/bin/guard_faults" 5
    assert_equal "$status" 78
    assert_output --partial "[dpshim r0/4] ERROR [data] mode differs between the ranks"
    assert_output --partial "ranks 0, 2, 3: split (default)"
    assert_output --partial "rank 1: scale (env DPSHIM_DATA_MODE)"
    assert_output --partial "rank 1: sum (env DPSHIM_COMM_REDUCE)"
    assert_output --partial "[dpshim r1/4] ERROR [data] mode differs between the ranks: here scale (env DPSHIM_DATA_MODE), on rank 0 split (default)"
    refute_output --partial "finished" # no step ran
}

@test "a policy key that may differ per rank ([diag] log) does not stop the job" {
    run on_rank 2 DPSHIM_DIAG_LOG=error -- "$BUILD/bin/guard_faults" 3
    assert_success
    assert_equal "$(count "finished 3 steps, 4 ranks")" 4
}

@test "gradients of 600 + 400 elements on one rank, 400 + 600 on the others (desync = step): caught, naming the rank" {
    run mpi 3 env LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 swap 1 3
    assert_equal "$status" 75
    assert_output --partial "desync in step 3: the ranks' collective calls part at call 1 of the step"
    assert_output --partial "rank 1 ($HOST): dp_grads (all-reduce f32 x 1000 in 2 tensors: 600, 400), collective #4 after step 3  <-- culprit"
    assert_output --partial "rank 0 ($HOST): dp_grads (all-reduce f32 x 1000 in 2 tensors: 400, 600), collective #4 after step 3"
}

@test "gradients of 600 + 400 elements on one rank (desync = full): caught at that call" {
    run mpi 3 env DPSHIM_GUARD_DESYNC=full LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 swap 2 2
    assert_equal "$status" 75
    assert_output --partial "rank 2 ($HOST): dp_grads (all-reduce f32 x 1000 in 2 tensors: 600, 400), collective #3 after step 1  <-- culprit"
}

@test "one rank's gradient has another size: the table names that rank and both sizes" {
    SECONDS=0
    run mpi 3 env DPSHIM_COMM_SHM_KB=0 DPSHIM_GUARD_TIMEOUT=5 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 count 1 3
    assert_equal "$status" 75
    [ "$SECONDS" -le 25 ] || fail "took $SECONDS s"
    assert_output --regexp "rank 1 \($HOST\): in dp_grads \(all-reduce f32 x 1200\), collective #4 after step 2, waiting [0-9.]+ s  <-- culprit"
    assert_output --regexp "rank 0 \($HOST\): in dp_grads \(all-reduce f32 x 1000\)"
}

@test "a small gradient of another size on one rank, without desync checks: the shared-memory sum names the culprit at once" {
    SECONDS=0
    run mpi 3 env DPSHIM_GUARD_DESYNC=off DPSHIM_GUARD_TIMEOUT=30 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 count 1 3
    assert_equal "$status" 75
    [ "$SECONDS" -le 25 ] || fail "took $SECONDS s: the mismatch waited for the watchdog"
    assert_output --partial "dp_grads (collective #4 after step 2): ranks are reducing different buffers (a desync): rank 0 1000 x f32, rank 1 1200 x f32, rank 2 1000 x f32"
    assert_output --regexp "rank 1 \\($HOST\\): in dp_grads \\(all-reduce f32 x 1200\\), collective #4 after step 2, .*  <-- culprit"
}

@test "a large gradient of another size on one rank, without desync checks: the ring all-reduce names the culprit at once" {
    SECONDS=0
    run mpi 3 env GUARD_FAULTS_LARGE=1 DPSHIM_GUARD_DESYNC=off DPSHIM_GUARD_TIMEOUT=5 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 count 1 3
    assert_equal "$status" 75
    [ "$SECONDS" -le 25 ] || fail "took $SECONDS s"
    assert_output --regexp "dp_grads \(collective #4 after step 2\): .*(a desync|different sizes)"
    assert_output --regexp "rank 1 \($HOST\): in dp_grads \(all-reduce f32 x 68000\), collective #4 after step 2, .*  <-- culprit"
}

@test "two threads calling hooks at once: a clear error naming the hook and both threads, never wrong sums" {
    run mpi 3 env LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 3 threads 1 2
    assert_failure
    assert_output --regexp "\[dpshim r1/3\] ERROR dp_metric was called by thread [0-9]+ while thread [0-9]+ is inside dp_metric"
    refute_output --regexp "sums from two threads were wrong"
}

@test "a rank that returns from main (exit 0) before its first hook call: the others are not stranded" {
    SECONDS=0
    run mpi 3 env LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 early 1 0
    assert_equal "$status" 75
    [ "$SECONDS" -le 20 ] || fail "took $SECONDS s"
    assert_output --partial "rank 1 ($HOST): left the program (exit) after step 0 and collective #0  <-- culprit"
}

@test "a rank that leaves with _exit(0) before its first hook: the start-up watch ends the job after the timeout" {
    # The other ranks start 2 s late: had they initialized MPI before rank 1 left, mpirun itself
    # would end the job ("exiting improperly", status 1) and the shim's watch would not be reached.
    SECONDS=0
    run mpi 3 sh -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] || sleep 2; exec "$@"' sh \
        env DPSHIM_GUARD_TIMEOUT=4 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 vanish 1 0
    assert_equal "$status" 75
    [ "$SECONDS" -le 21 ] || fail "took $SECONDS s"
    assert_output --partial "the backend's start-up (opened by dp_params) has waited"
    assert_output --partial "some rank has not reached its first collective"
}

@test "parameters given to dp_params from a freed temporary: the drift check neither crashes nor raises a false alarm" {
    run mpi 2 env DPSHIM_GUARD_DRIFT_EVERY=1 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 5 temp 0 0
    assert_success
    assert_equal "$(count "finished 5 steps, 2 ranks")" 2
    assert_output --partial "parameter tensor 'w (a copy)' given to dp_params is no longer in memory"
}

# Under the launcher's recovery mode nothing ends the others when a rank is killed: the guard sees
# the process gone (this host's ranks are watched by process id) and ends the job in seconds,
# not at [guard] timeout.
# recovering N ARGS...: guard_faults ARGS on N ranks under mpirun --enable-recovery, timed, with
# [elastic] lost_rank = end (elastic.bats has the job that goes on).
recovering() {
    local n=$1 start=$SECONDS
    shift
    run mpi "$n" --enable-recovery env DPSHIM_GUARD_TIMEOUT=60 DPSHIM_ELASTIC_LOST_RANK=end LD_PRELOAD="$SHIM" \
        "$BUILD/bin/guard_faults" "$@"
    elapsed=$((SECONDS - start))
    echo "$output"
}

@test "mpirun --enable-recovery: rank 2 SIGKILLed at step 4 is named as gone within seconds" {
    recovering 3 10 kill 2 4
    assert_output --regexp "guard: rank 2 \($HOST, process [0-9]+\) is gone: its process ended without leaving the program .*, while rank [01] waits in dp_grads collective #5 \(after step 3\)"
    assert_output --partial "rank 2 ($HOST): gone: its process has ended (killed, crashed, or left with _exit)  <-- culprit"
    assert_output --partial "guard: ending the job (exit status 75)"
    [ "$elapsed" -lt 15 ] || fail "took $elapsed s: noticed by the timeout, not by the process"
}

@test "a rank at the exit barrier does not wait the timeout for a rank whose process is gone" {
    # rank 1 is killed after its last sum, while rank 0 waits at the exit barrier for it
    recovering 2 3 kill 1 4
    assert_output --partial "rank 0 finished 3 steps, 2 ranks"
    assert_output --partial "guard: rank 1 ($HOST)'s process ended without leaving the program (killed, crashed, or _exit)"
    [ "$elapsed" -lt 15 ] || fail "took $elapsed s: rank 0 waited at the exit barrier for a process that was gone"
}
