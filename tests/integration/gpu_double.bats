#!/usr/bin/env bats
# Tensors in GPU memory, against the CUDA/NCCL test double (tests/gpu_double/): device memory
# the host cannot touch, streams that run late, NCCL collectives that meet across ranks, and
# faults on demand. The same program compares every result with the host path's.
load helpers

DOUBLE=$BUILD/tests/gpu_double
PROG=$BUILD/bin/gpu_hooks

setup() {
    [ -x "$PROG" ] || skip "gpu_hooks not built"
}

# gpu N ENV... -- ARGS...: gpu_hooks on N ranks, the double as CUDA and NCCL, N GPUs visible
# (one per local rank through [gpu] bind) unless the environment says otherwise. A context on a
# second GPU in one rank is an error (GPU_DOUBLE_ONE_DEVICE), as it costs a real GPU's memory.
gpu() {
    local n=$1
    shift
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    run mpi "$n" env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_DEVICES=4 CUDA_VISIBLE_DEVICES=0,1,2,3 \
        GPU_DOUBLE_ONE_DEVICE=1 DPSHIM_GUARD_TIMEOUT=60 "${envs[@]}" LD_PRELOAD="$SHIM" "$PROG" "$@"
    echo "$output"
}

# same_checksums: every rank printed the same checksum for each hook and dtype, and no mismatch.
same_checksums() {
    refute_output --partial MISMATCH
    local lines
    lines=$(grep -o 'gpu_hooks rank [0-9]*: .* checksum [0-9a-f]* ok' <<<"$output" | sed 's/rank [0-9]*: //' | sort -u)
    [ -n "$lines" ] || fail "no results"
    local keys
    keys=$(awk '{print $2, $3}' <<<"$lines" | sort | uniq -d)
    [ -z "$keys" ] || fail "ranks differ for: $keys"
}

@test "every dtype through NCCL at np=2,3,4: equal to the host path, bitwise across ranks" {
    for n in 2 3 4; do
        gpu $n DPSHIM_DIAG_LOG=info -- --dtype all
        assert_success
        assert_output --partial "GPU tensors go through NCCL"
        assert_equal "$(count ' ok')" $((n * 7))
        same_checksums
    done
}

@test "dp_from_owners: each tensor from its owner, through NCCL and staged, np=2 and 3" {
    for n in 2 3; do
        for backend in auto mpi; do
            gpu $n DPSHIM_COMM_BACKEND=$backend -- --hook owners --dtype all --steps 2
            assert_success
            assert_equal "$(count ' ok')" $((n * 14))
            same_checksums
        done
    done
}

@test "NCCL and the staged path give the same bits on exactly representable sums" {
    gpu 3 DPSHIM_COMM_REDUCE=sum -- --dtype all
    assert_success
    local nccl=$output
    gpu 3 DPSHIM_COMM_REDUCE=sum DPSHIM_COMM_BACKEND=mpi -- --dtype all
    assert_success
    assert_output --partial "staged"
    for dt in f32 f64 f16 bf16 i32 i64 u8; do
        a=$(grep -o "rank 0: grads $dt checksum [0-9a-f]*" <<<"$nccl" | awk '{print $NF}')
        b=$(grep -o "rank 0: grads $dt checksum [0-9a-f]*" <<<"$output" | awk '{print $NF}')
        [ -n "$a" ] && [ "$a" = "$b" ] || fail "$dt: nccl $a, staged $b"
    done
}

@test "dp_params, dp_from_owners, dp_grad_ready and dp_bn_stats with GPU tensors" {
    for hook in params owners ready bn; do
        gpu 3 -- --hook $hook --dtype all --steps 2
        assert_success
        same_checksums
    done
}

@test "uneven split-mode shares are weighted exactly, and an empty share never spreads NaN" {
    gpu 3 DPSHIM_DATA_MODE=split -- --batch 7 --dtype all
    assert_success
    same_checksums
    # shares of 1, 1 and 0: every rank still issues the pre-multiplied sum (the double fails
    # ranks that mix it with a plain sum, as NCCL's algorithm choice may hang on them)
    gpu 3 DPSHIM_DATA_MODE=split -- --batch 2 --dtype all
    assert_success
    refute_output --partial "disagree"
    same_checksums
    # the empty share holds NaN (integers: -1, 255): floats must not spread it, integers are
    # summed as they are, modulo 2^bits on both paths
    gpu 2 DPSHIM_DATA_MODE=split -- --batch 1 --nan-if-empty --dtype all
    assert_success
    same_checksums
    refute_output --partial nan
}

@test "a collective waits for the program's queued GPU work (legacy stream, or the stream it names)" {
    # two steps each: the first step's set-up takes longer than the delayed copy, the second
    # shows a missing wait (tried: without the engine's wait each of these fails)
    gpu 2 GPU_DOUBLE_DELAY_MS=30 -- --late --dtype f32 --steps 2
    assert_success
    same_checksums
    gpu 2 GPU_DOUBLE_DELAY_MS=30 -- --late --stream --dtype f32 --steps 2
    assert_success
    same_checksums
    gpu 2 GPU_DOUBLE_DELAY_MS=30 DPSHIM_COMM_BACKEND=mpi -- --late --stream --dtype f32 --steps 2
    assert_success
    same_checksums
}

@test "GPU work is finished before the CUDA runtime's own exit handler tears it down" {
    # the double's runtime registers its teardown at the program's first CUDA call, after the
    # shim's constructor, as CUDA's does; work queued for a named stream is still on the GPU at exit
    for stream in "" --stream; do
        gpu 2 GPU_DOUBLE_DELAY_MS=20 GPU_DOUBLE_TRACE="$BATS_TEST_TMPDIR/trace" -- $stream --dtype f32 --steps 2
        assert_success
        refute_output --partial "at exit"
        refute_output --partial "shutting down"
        grep -q "runtime teardown" "$BATS_TEST_TMPDIR/trace" || fail "the double's runtime never tore down"
        rm -f "$BATS_TEST_TMPDIR/trace"
    done
}

@test "a rank that ends first finalizes NCCL: a peer still reading its last data is not cut off" {
    # rank 1 reads the last collective's data 500 ms after rank 0 is done with it, and nothing on
    # the host makes rank 0 wait (no desync check at the step's end): rank 0 reaches its exit
    # while rank 1 is still inside; aborting there breaks rank 1 (the double's peers see it)
    gpu 2 DPSHIM_GUARD_DESYNC=off GPU_DOUBLE_SLOW_RANK=1 GPU_DOUBLE_SLOW_MS=500 \
        GPU_DOUBLE_TRACE="$BATS_TEST_TMPDIR/trace" -- --stream --dtype f32
    assert_success
    refute_output --partial "failed or aborted"
    same_checksums
    [ "$(grep -c ncclCommFinalize "$BATS_TEST_TMPDIR/trace")" -eq 2 ] || fail "not finalized on both ranks"
    ! grep -q ncclCommAbort "$BATS_TEST_TMPDIR/trace" || fail "a healthy job aborted its communicator"
}

@test "the watchdog never calls NCCL on a communicator another thread is calling" {
    # gradients queued during backward (dp_grad_ready) are watched while the main thread polls
    # its own collective; every NCCL call is held 2 ms, so an overlap is certain to be seen (the
    # double crashes on one, as NCCL's communicator may)
    gpu 2 GPU_DOUBLE_DELAY_MS=100 GPU_DOUBLE_CALL_US=2000 -- --hook ready --dtype f32 --steps 4
    assert_success
    refute_output --partial "two threads"
    same_checksums
}

@test "the watchdog's CUDA calls go to the rank's own GPU and leave the program's graph capture intact" {
    # each rank picks cuda:LOCAL_RANK itself; the watchdog thread's queries must not bind a
    # context on GPU 0 (refused by the double's one-device mode)
    gpu 2 DPSHIM_GPU_BIND=off GPU_DOUBLE_DELAY_MS=100 -- --device local --stream --dtype f32 --steps 3
    assert_success
    refute_output --partial "second context"
    same_checksums
    # a global-mode capture (torch.cuda.graph's default) on the program's thread while the
    # watchdog looks at queued collectives
    gpu 2 GPU_DOUBLE_DELAY_MS=300 -- --stream --capture-after --dtype f32 --steps 2
    assert_success
    refute_output --partial "capture failed"
}

@test "NCCL's communicator is made on the tensors' GPU, not the device the program left current" {
    gpu 2 DPSHIM_GPU_BIND=off GPU_DOUBLE_ONE_DEVICE=0 DPSHIM_DIAG_LOG=info -- --device local --current 0 --dtype all
    assert_success
    assert_output --partial "GPU tensors go through NCCL"
    refute_output --partial "Duplicate GPU"
    same_checksums
}

@test "device memory passed as DP_HOST is found and reduced on the GPU" {
    gpu 2 -- --unflagged --dtype all
    assert_success
    same_checksums
}

@test "ranks sharing a GPU take the staging path; backend = nccl then names the ranks and the GPU" {
    gpu 2 CUDA_VISIBLE_DEVICES=0,0 DPSHIM_GPU_BIND=off -- --dtype all
    assert_success
    assert_output --partial "ranks 0 and 1 share the GPU 00000000:10:00.0"
    assert_output --partial "staged"
    same_checksums
    gpu 2 CUDA_VISIBLE_DEVICES=0,0 DPSHIM_GPU_BIND=off DPSHIM_COMM_BACKEND=nccl -- --dtype f32
    assert_failure 70
    assert_output --partial "[comm] backend = nccl, but ranks 0 and 1 share the GPU 00000000:10:00.0"
}

# elastic N ENV... -- ARGS...: gpu_hooks under dpshim-run's recovery mode, one GPU per rank.
elastic() {
    local n=$1
    shift
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    run timeout --kill-after=10 "$MPI_TIMEOUT" env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_DEVICES="$n" \
        CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))" GPU_DOUBLE_ONE_DEVICE=1 DPSHIM_GUARD_TIMEOUT=30 \
        DPSHIM_DIAG_LOG=info "${envs[@]}" "$BUILD/bin/dpshim-run" -np "$n" --oversubscribe --enable-recovery \
        "$PROG" "$@" </dev/null
    echo "$output"
}

# checksum_counts: how many times each checksum was printed, ascending.
checksum_counts() {
    grep -o 'checksum [0-9a-f]* ok' <<<"$output" | sort | uniq -c | awk '{ print $1 }' | sort -n | paste -sd' '
}

@test "elastic mode, NCCL: a rank SIGKILLed while the others wait in the all-reduce; they shrink the communicator and go on" {
    # rank 2 dies before its second step's hooks: the others' NCCL all-reduce can never complete
    # (the double, as NCCL on shared memory, reports nothing); the guard finds the loss, the
    # survivors give up the collective, shrink the communicator with NCCL_SHRINK_ABORT (which
    # ends the stuck one) and run the step again among themselves, weighted over their shares
    for backend in auto nccl; do
        elastic 3 DPSHIM_COMM_BACKEND=$backend -- --dtype f32 --steps 4 --kill-rank 2
        assert_success
        assert_output --partial "GPU tensors go through NCCL"
        refute_output --partial "staged"
        assert_output --regexp "elastic: lost rank 2 \([^,]+, process [0-9]+: its process ended\) during step 1"
        assert_output --partial "elastic: GPU tensors go on through NCCL among the 2 survivors (the communicator shrunk)"
        # every step's GPU sums equal the host path's among the same ranks: one result for the
        # first step's 3 ranks, one for the 3 later steps of the 2 survivors
        refute_output --partial MISMATCH
        [ "$(checksum_counts)" = "3 6" ] || fail "results per checksum: $(checksum_counts), not 3 and 6"
    done
}

@test "elastic mode, NCCL: a rank killed mid-collective, one survivor done and one not: the result is replayed to it" {
    # rank 2 dies right after giving its data to its second all-reduce; rank 1 reads late, so rank
    # 0 completes the sum and goes on while rank 1 is still in it when the loss is found: rank 1
    # gets rank 0's result (the sum of all 3 ranks, through host memory), and the communicator is
    # made anew (rank 1 ended its old one alone). The replay goes in 16 KiB pieces, as one of more
    # than 2 GiB must
    elastic 3 GPU_DOUBLE_DIE_RANK=2 GPU_DOUBLE_DIE_AT=2 GPU_DOUBLE_SLOW_RANK=1 GPU_DOUBLE_SLOW_MS=2500 \
        DPSHIM_COMM_PIECE_KB=16 DPSHIM_DIAG_LOG=debug -- --dtype f32 --steps 3 --host-first
    assert_success
    assert_output --regexp "r1/3\] DEBUG elastic: dp_grads: .* laggard 1, abandoned 1, replayed 1"
    assert_output --partial "elastic: GPU tensors go on through NCCL among the 2 survivors (the communicator made anew)"
    refute_output --partial MISMATCH
    # step 1 on 3 ranks and the replayed step 2 (on 2 ranks) hold the 3 ranks' sum; step 3 the 2's
    [ "$(checksum_counts)" = "2 5" ] || fail "results per checksum: $(checksum_counts), not 2 (step 3) and 5 (steps 1-2)"
}

@test "elastic mode, NCCL: two ranks of 4 lost one after the other: the communicator shrinks twice" {
    # rank 3 dies before its second step; rank 2 in its third all-reduce on the shrunk
    # communicator, once it gave its data (the others complete that one)
    elastic 4 GPU_DOUBLE_DIE_RANK=2 GPU_DOUBLE_DIE_AT=3 -- --dtype f32 --steps 5 --kill-rank 3 --host-first
    assert_success
    assert_output --partial "among the 3 survivors (the communicator shrunk)"
    assert_output --partial "among the 2 survivors (the communicator shrunk)"
    assert_output --partial "the job lost rank 2 in step 4, rank 3 in step 1 and went on with 2 of its 4 ranks"
    refute_output --partial MISMATCH
}

@test "elastic mode, NCCL: a second rank lost while the survivors of a first shrink: they agree, and make it anew" {
    # rank 3 dies before its second step; rank 2 as it calls ncclCommShrink: the other two give
    # their shrink up at that loss and make the communicator of the two from a new id
    elastic 4 GPU_DOUBLE_DIE_IN_SHRINK=2 -- --dtype f32 --steps 4 --kill-rank 3
    assert_success
    refute_output --partial "among the 3 survivors"
    # every step equals the host path among the same ranks: step 1 on 4 ranks, three on 2
    [ "$(checksum_counts)" = "4 6" ] || fail "results per checksum: $(checksum_counts), not 4 and 6"
    assert_output --partial "among the 2 survivors (the communicator made anew)"
    assert_output --regexp "the job lost rank 2 in step [0-9]+, rank 3 in step 1 and went on with 2 of its 4 ranks"
    refute_output --partial "staged"
    refute_output --partial MISMATCH
}

@test "elastic mode, NCCL: a collective stalled in its rerun after a shrink ends the job at the guard's timeout" {
    # rank 3 dies before its second step; the survivors shrink the communicator (collectives of
    # their own, on the host) and run the step again, where rank 2's GPU never delivers: the
    # guard must watch that rerun as any collective (it once went unwatched and hung for ever)
    local t0=$SECONDS
    MPI_TIMEOUT=90 elastic 4 DPSHIM_GUARD_TIMEOUT=5 GPU_DOUBLE_STALL_RANK=2 GPU_DOUBLE_STALL_AT=1 \
        GPU_DOUBLE_STALL_COMM=2 GPU_DOUBLE_ABORT_MS=1000 -- --dtype f32 --steps 4 --kill-rank 3
    assert_failure 75
    [ $((SECONDS - t0)) -le 45 ] || fail "took $((SECONDS - t0)) s"
    assert_output --partial "among the 3 survivors (the communicator shrunk)"
    assert_output --regexp "dp_grads collective #[0-9]+ .after step [0-9]+. has waited"
    # the stall is on the survivors' GPUs: the rank the job went on without is not blamed
    assert_output --regexp "rank 3 \([^)]*\): lost earlier: the job went on without it"
    refute_output --partial culprit
    run pgrep -f "$PROG"
    assert_failure
}

@test "elastic mode, NCCL: a rank lost before its first collective connects: the others give up the launch and go on" {
    # rank 2 dies as it launches its first collective: NCCL connects a communicator's ranks at
    # its first collective, so the others' launches stay in progress (ncclInProgress) and only
    # giving them up at the loss lets the two go on
    elastic 3 GPU_DOUBLE_DIE_RANK=2 GPU_DOUBLE_DIE_AT=0 -- --dtype f32 --steps 3
    assert_success
    assert_output --partial "among the 2 survivors (the communicator made anew)"
    assert_output --partial "the job lost rank 2 in step 1 and went on with 2 of its 3 ranks"
    refute_output --partial MISMATCH
}

@test "elastic mode, NCCL: a rank lost while the GPU set-up makes the communicator: the others make theirs" {
    # the others give their NCCL init up at the loss (not after [guard] timeout), and make the
    # communicator among themselves before their first GPU collective. The abort of the init
    # given up takes 60 s here (ncclCommAbort can wait for a stuck peer): no rank waits for it,
    # so the job ends well within 45 s (it took 62 s when the abort was waited for)
    MPI_TIMEOUT=45 elastic 3 GPU_DOUBLE_DIE_IN_INIT=2 GPU_DOUBLE_ABORT_MS=60000 -- --dtype f32 --steps 3
    assert_success
    assert_output --partial "among the 2 survivors (the communicator made anew)"
    assert_output --partial "the job lost rank 2 in step 1 and went on with 2 of its 3 ranks"
    refute_output --partial "did not complete within"
    refute_output --partial "staged"
    refute_output --partial MISMATCH
}

@test "elastic mode: one dp_grads call with host and GPU tensors across a loss: both parts weighted alike" {
    # the host part meets the loss and runs again among the survivors, weighted over their
    # shares; the GPU part, after it in the same call, must be weighted the same way (it was
    # weighted for all 3 ranks, through NCCL and staged)
    for backend in auto mpi; do
        elastic 3 DPSHIM_COMM_BACKEND=$backend -- --dtype all --steps 3 --kill-rank 1 --mixed
        assert_success
        refute_output --partial MISMATCH
    done
}

@test "elastic mode: dp_from_owners across a loss fails, saying why, instead of broadcasting from the wrong ranks" {
    # owners name ranks as numbered before the loss: the call under way at it, and later calls
    # naming a rank past dp_world_size(), return -1 with a message (the program says "a hook
    # returned -1"); before, the survivors took other ranks' values and went on
    for backend in auto mpi; do
        elastic 3 DPSHIM_COMM_BACKEND=$backend -- --hook owners --dtype f32 --steps 3 --kill-rank 1
        assert_failure
        assert_output --partial "dp_from_owners: a rank was lost during the call and the survivors are numbered anew (dp_world_size() is 2 now)"
        assert_output --partial "names owner 2, outside the job's ranks 0..1 (the survivors of a lost rank, as dp_world_size() says now)"
        assert_output --partial "a hook returned -1"
    done
}

@test "elastic mode, NCCL: dp_from_owners across a loss, one survivor a collective behind: both stop there" {
    # rank 2 dies right after giving its data to the second all-reduce; rank 1 reads late, so rank
    # 0 completes that one and goes on to the next while rank 1 is still in it when the loss is
    # found: rank 1 gets the result replayed, rank 0 gives the next one up. Both end their calls
    # there and the job ends; before, rank 0 ran the next one again among the survivors and waited
    # for rank 1 forever
    elastic 3 GPU_DOUBLE_DIE_RANK=2 GPU_DOUBLE_DIE_AT=2 GPU_DOUBLE_SLOW_RANK=1 GPU_DOUBLE_SLOW_MS=2500 \
        DPSHIM_DIAG_LOG=debug -- --hook owners --dtype f32 --steps 1
    assert_failure
    [ "$status" -ne 124 ] || fail "the survivors waited for each other until the test's timeout"
    assert_output --regexp "r1/3\] DEBUG elastic: dp_from_owners: .* laggard 1, abandoned 1, replayed 1"
    assert_output --regexp "r0/3\] DEBUG elastic: dp_from_owners: .* laggard 0, abandoned 1, replayed 0"
    assert_output --partial "[dpshim r0/3] ERROR dp_from_owners: a rank was lost during the call and the survivors are numbered anew (dp_world_size() is 2 now): the tensors of owner 1 and after were not sent"
    for r in 0 1; do
        assert_output --partial "rank $r: a hook returned -1"
    done
}

@test "elastic mode, NCCL: every dtype through dp_grads, dp_grad_ready, dp_params and dp_bn_stats across a loss" {
    for hook in grads ready params bn; do
        elastic 3 -- --hook "$hook" --dtype all --steps 3 --kill-rank 1
        assert_success
        assert_output --partial "(the communicator shrunk)"
        refute_output --partial MISMATCH
        # the survivors hold the same bits step by step, and the lost rank held them in step 1
        local r0 r2
        r0=$(grep -o 'rank 0: .* checksum [0-9a-f]*' <<<"$output" | sed 's/rank 0: //')
        r2=$(grep -o 'rank 2: .* checksum [0-9a-f]*' <<<"$output" | sed 's/rank 2: //')
        [ -n "$r0" ] && [ "$r0" = "$r2" ] || fail "$hook: ranks 0 and 2 differ: $r0 / $r2"
        grep -o 'rank 1: .* checksum [0-9a-f]*' <<<"$output" | sed 's/rank 1: //' | while read -r line; do
            grep -qxF "$line" <<<"$r0" || fail "$hook: rank 1's step 1 differs: $line"
        done
    done
}

@test "a CUDA runtime without NCCL: the job says it goes staged and why; backend = nccl refuses" {
    # gpu_hooks holds the double as its CUDA runtime; with no libnccl.so.2 on the library path
    # the plugin cannot find it as the program's NCCL as well
    gpu 2 LD_LIBRARY_PATH= DPSHIM_NCCL_LIB=/nonexistent/libnccl.so.2 -- --dtype f32
    assert_success
    assert_output --partial "GPU tensors go through host memory and MPI (staged): rank 0 has no NCCL"
    same_checksums
    gpu 2 LD_LIBRARY_PATH= DPSHIM_NCCL_LIB=/nonexistent/libnccl.so.2 DPSHIM_COMM_BACKEND=nccl -- --dtype f32
    assert_failure 70
    assert_output --partial "rank 0 has no NCCL"
}

@test "NCCL that fails to start on one rank: staged with auto, an error naming the rank with nccl" {
    gpu 3 GPU_DOUBLE_INIT_FAIL_RANK=2 -- --dtype f32
    assert_success
    assert_output --partial "NCCL could not start on rank 2"
    same_checksums
    gpu 3 GPU_DOUBLE_INIT_FAIL_RANK=2 DPSHIM_COMM_BACKEND=nccl -- --dtype f32
    assert_failure 70
    assert_output --partial "rank 2 cannot use its GPU"
}

@test "a stalled GPU collective ends the job within timeout + 15 s, naming the collective" {
    local t0=$SECONDS
    gpu 3 GPU_DOUBLE_STALL_RANK=1 GPU_DOUBLE_ABORT_MS=1000 DPSHIM_GUARD_TIMEOUT=5 -- --dtype f32
    assert_failure 75
    [ $((SECONDS - t0)) -le 20 ] || fail "took $((SECONDS - t0)) s"
    assert_output --partial "dp_grads"
    assert_output --partial "collective #"
    # the guard aborts the communicator to end the job; the waiting thread does not report that
    refute_output --partial "communicator was aborted"
    run pgrep -f "$PROG"
    assert_failure
}

@test "a rank that stops calling hooks: its peer's GPU collective ends the job, waiting or queued" {
    for stream in "" --stream; do
        local t0=$SECONDS
        gpu 2 DPSHIM_GUARD_TIMEOUT=5 -- $stream --dtype f32 --steps 3 --sleep-rank 1
        assert_failure 75
        [ $((SECONDS - t0)) -le 20 ] || fail "took $((SECONDS - t0)) s"
        assert_output --regexp "dp_grads collective #[0-9]+ .after step 0. has waited|GPU collective #[0-9]+ .dp_grads. queued"
        run pgrep -f "$PROG"
        assert_failure
    done
}

@test "an asynchronous NCCL error ends the job, naming the rank and the collective" {
    # LATE: the error is raised just after a poll said all was well, and the collective's marker
    # has passed by the next look; the rank must still see the error, not a finished collective
    for late in 0 1; do
        gpu 3 GPU_DOUBLE_ASYNC_ERROR_RANK=1 GPU_DOUBLE_ASYNC_ERROR_LATE=$late -- --dtype f32
        assert_failure 70
        assert_output --regexp "r1/3\] ERROR dp_grads \(collective #[0-9]+.*injected asynchronous failure"
        run pgrep -f "$PROG"
        assert_failure
    done
    # queued on the program's stream: the peers' watchdogs find their failed collectives and give
    # the failing rank time to report first
    gpu 3 GPU_DOUBLE_ASYNC_ERROR_RANK=1 -- --stream --dtype f32
    [ "$status" -eq 70 ] || [ "$status" -eq 75 ] || fail "exit status $status"
    assert_output --regexp "r1/3\] ERROR .*injected asynchronous failure"
}

@test "a hook inside CUDA graph capture is refused" {
    gpu 2 -- --stream --capture --dtype f32
    assert_failure 70
    assert_output --partial "captured into a CUDA graph"
}

@test "the CUDA runtime and NCCL named by DPSHIM_CUDART_LIB and DPSHIM_NCCL_LIB are the ones used" {
    # no LD_LIBRARY_PATH: only the variables lead to the double (gpu_hooks links it by full path)
    run mpi 2 env GPU_DOUBLE_DEVICES=4 CUDA_VISIBLE_DEVICES=0,1 DPSHIM_DIAG_LOG=info \
        DPSHIM_CUDART_LIB="$DOUBLE/libcudart.so.13" DPSHIM_NCCL_LIB="$DOUBLE/libnccl.so.2" \
        LD_PRELOAD="$SHIM" "$PROG" --dtype f32
    echo "$output"
    assert_success
    assert_output --partial "GPU tensors go through NCCL"
    assert_output --partial "$DOUBLE/libnccl.so.2"
    same_checksums
}

@test "a program with NCCL of its own: the plugin uses that copy, not a second one DPSHIM_NCCL_LIB names" {
    # a C++ program on libtorch has PyTorch's NCCL in its global scope. A second NCCL beside it
    # calls the first copy's functions with its own communicator and fails every collective.
    mkdir "$BATS_TEST_TMPDIR/other"
    cp "$DOUBLE/libnccl.so.2" "$BATS_TEST_TMPDIR/other/libnccl.so.2" # a copy, not a link: another file
    gpu 2 DPSHIM_DIAG_LOG=info DPSHIM_NCCL_LIB="$BATS_TEST_TMPDIR/other/libnccl.so.2" \
        LD_PRELOAD="$SHIM libnccl.so.2" -- --dtype f32
    assert_success
    assert_output --partial "GPU tensors go through NCCL"
    assert_output --regexp "WARN .*DPSHIM_NCCL_LIB names $BATS_TEST_TMPDIR/other/libnccl.so.2, but the program already has NCCL loaded \\($DOUBLE/[^)]*\\): that one is used"
    same_checksums
}

@test "dpshim-diag env names the CUDA runtime, NCCL and the GPU path" {
    run env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_DEVICES=2 "$BUILD/bin/dpshim-diag" env
    assert_success
    assert_output --partial "NCCL 2.28.9"
    assert_output --partial "2 GPU(s)"
    assert_output --regexp "gpu path +nccl"
    run env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_NO_DRIVER=1 "$BUILD/bin/dpshim-diag" env
    assert_output --regexp "gpu path +none: no usable GPU"
}

@test "dpshim-diag bench gpu: device buffers against the host path, by hand and NCCL, results checked" {
    for backend in auto mpi; do
        run mpi 2 env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_DEVICES=4 CUDA_VISIBLE_DEVICES=0,1 \
            DPSHIM_COMM_BACKEND=$backend LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench gpu:2
        echo "$output"
        assert_success
        assert_output --partial "[comm] backend = $backend"
        assert_output --regexp "pinned memory .* GB/s each way  [0-9.]+x pageable"
        assert_output --regexp "dp_grads, device buffer .*x the host path"
        assert_output --partial "bitwise equal to the host path: dp_grads yes, by hand yes, NCCL yes"
        # NCCL called directly as the plugin calls it and waits, the reference for dp_grads; and
        # the other kind of communicator and the other wait, as figures
        assert_output --regexp "ncclAllReduce directly: non-blocking comm, polled wait +[0-9.]+ ms"
        assert_output --regexp "the same, waited by cudaStreamSynchronize .*x the polled wait"
        assert_output --regexp "blocking communicator, polled wait .*x the non-blocking one"
        assert_output --regexp "blocking communicator, cudaStreamSynchronize .*x the non-blocking one polled"
        assert_output --regexp "4 KiB ncclAllReduce: blocking communicator [0-9.]+ us per call, non-blocking and polled [0-9.]+ us"
        assert_output --regexp "vs NCCL called directly \(non-blocking, polled: as the plugin\) [0-9.]+x"
        refute_output --partial "share"
    done
    # without a GPU: said, and nothing else measured
    run mpi 2 env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_NO_DRIVER=1 LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench gpu
    assert_success
    assert_output --partial "no GPU"
}

@test "dpshim-diag bench gpu-sweep: dp_grads vs NCCL called directly per size, results checked" {
    run mpi 2 env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_DEVICES=4 CUDA_VISIBLE_DEVICES=0,1 DPSHIM_DIAG_LOG=info \
        LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench gpu-sweep:1,3
    echo "$output"
    assert_success
    assert_output --partial "GPU tensors go through NCCL"
    assert_output --regexp "MiB +dpshim ms +busbw +direct ms +busbw +ratio +same"
    for mib in 1 3; do
        assert_output --regexp "(^|"$'\n'") +$mib +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +yes"
    done
    assert_output --partial "ratio = direct time / dpshim time"
    refute_output --partial "FAILED"
    # staged (two ranks on one GPU, one host): no NCCL of the benchmark's own either, dp_grads alone
    run mpi 2 env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_DEVICES=1 CUDA_VISIBLE_DEVICES=0 \
        LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench gpu-sweep:2
    echo "$output"
    assert_success
    assert_output --partial "NCCL did not start on every rank: dp_grads alone"
    assert_output --regexp "(^|"$'\n'") +2 +[0-9.]+ +[0-9.]+ +- +- +- +yes"
    # a bad list is refused
    run mpi 2 env LD_LIBRARY_PATH="$DOUBLE" LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench gpu-sweep:1,x
    assert_failure
    assert_output --partial "say sizes in MiB"
}

@test "dpshim-diag bench gpu-overlap: dp_grad_ready on device tensors during a simulated backward" {
    run mpi 2 env LD_LIBRARY_PATH="$DOUBLE" GPU_DOUBLE_DEVICES=4 CUDA_VISIBLE_DEVICES=0,1 DPSHIM_DIAG_LOG=info \
        LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench gpu-overlap
    echo "$output"
    assert_success
    assert_output --partial "GPU tensors go through NCCL"
    assert_output --regexp "reduction alone +[0-9.]+ ms"
    assert_output --regexp "backward with dp_grad_ready per tensor +[0-9.]+ ms"
    assert_output --regexp "hidden behind backward: [0-9]+% of the reduction .* results bitwise equal: yes"
}

@test "libdpshim.so itself links no CUDA, NCCL or MPI" {
    run ldd "$SHIM"
    refute_output --regexp "cuda|nccl|mpi"
}
