#!/usr/bin/env bats
# The hook ABI on real ranks (tests/integration/progs/hook_check.c checks each promise) and
# scale-mode epoch sharding at the hook level (progs/epoch_cover.c).
load helpers

hook_check() {
    local n=$1
    shift
    run mpi "$n" env "$@" LD_PRELOAD="$SHIM" "$BUILD/bin/hook_check"
    echo "$output"
    assert_success
    assert_equal "$(count ' 0 failed')" "$n"
}

@test "hooks at world size 1 (singleton): identity results" {
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/hook_check"
    assert_success
    assert_output --partial "rank 0 of 1"
}
@test "hooks at np=2, default bucket" { hook_check 2; }
@test "hooks at np=3, 1 MiB buckets (large tensors bypass the bucket)" { hook_check 3 DPSHIM_COMM_BUCKET_MB=1; }
@test "hooks at np=4" { hook_check 4; }
@test "hooks at np=3 with [comm] overlap on (a progress thread reduces announced gradients)" { hook_check 3 DPSHIM_COMM_OVERLAP=on DPSHIM_COMM_BUCKET_MB=1; }
@test "hooks at np=3 with [comm] overlap off (announced gradients reduced in dp_grads)" { hook_check 3 DPSHIM_COMM_OVERLAP=off DPSHIM_COMM_BUCKET_MB=1; }
@test "[comm] overlap = auto is off where a rank has no core to spare" {
    run mpi 2 env DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$BUILD/bin/hook_check"
    assert_success
    if [ "$(nproc)" -lt 4 ]; then
        assert_output --regexp "INFO \[comm\] overlap = auto: no core to spare here \([0-9]+ core\(s\) in this rank's affinity mask, [0-9]+ per local rank\)"
        assert_output --partial "[dpshim r0/2] INFO [comm] overlap = auto, for the job: off (some rank has no core to spare)"
    else
        assert_output --partial "INFO [comm] overlap = auto: " # decided for the job by the ranks' answers
    fi
}
@test "a rank waiting for a late peer in the small sums sleeps instead of keeping its core busy" {
    # rank 1 arrives 100 ms late at each of 10 sums; the shared-memory path's waiter sleeps
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/late_peer"
    echo "$output"
    assert_success
    assert_equal "$(count 'sums ok')" 2
    local waited core
    read -r waited core < <(sed -n 's/^waited \([0-9.]*\) s, on a core \([0-9.]*\) s$/\1 \2/p' <<<"$output")
    [ -n "$core" ]
    # spinning or yielding, it spent about half of the wait or more on a core (measured 0.5 s of 1 s)
    awk -v w="$waited" -v c="$core" 'BEGIN { exit !(w >= 0.9 && c < 0.1 * w) }'
}
@test "hooks at np=2 with large all-reductions in 64 KiB pieces" { hook_check 2 DPSHIM_COMM_PIECE_KB=64; }
@test "the piece size is the policy's, the same for both channels, and reported" {
    run mpi 2 env DPSHIM_DIAG_LOG=info DPSHIM_COMM_OVERLAP=on DPSHIM_COMM_PIECE_KB=512 LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench overlap
    assert_success
    assert_output --partial "[dpshim r0/2] INFO mpi backend: sums of 256 KiB or more as a ring, in pieces of 512 KiB ([comm] piece_kb); sums of 64 KiB or less through shared memory ([comm] shm_kb)"
    assert_output --partial "results bitwise equal: yes"
}
@test "hooks at np=3 in scale mode" { hook_check 3 DPSHIM_DATA_MODE=scale; }
@test "hooks at np=3 with every sum through MPI ([comm] shm_kb = 0)" { hook_check 3 DPSHIM_COMM_SHM_KB=0; }
@test "hooks at np=3 with sums up to 1 MiB through shared memory" { hook_check 3 DPSHIM_COMM_SHM_KB=1024; }
@test "a /dev/shm without room for the small sums' segment: every rank uses MPI instead, and the log says why" {
    unshare -m true 2>/dev/null || skip "no mount namespaces here (needs root)"
    # a private 64 KiB /dev/shm; Open MPI's own segments go to /tmp
    run timeout --kill-after=10 "$MPI_TIMEOUT" unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "$@"' sh \
        mpirun --oversubscribe -np 2 --mca btl self,vader --mca btl_vader_backing_directory /tmp \
        env DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$BUILD/bin/hook_check"
    echo "$output"
    assert_success
    assert_equal "$(count ' 0 failed')" 2
    assert_output --partial "small sums through MPI: a rank could not map a shared-memory segment in /dev/shm"
}
@test "hooks at np=2 with sync-BN off" { hook_check 2 DPSHIM_BN_SYNC=off; }
@test "hooks with backend = self act as world size 1 on every rank" {
    run mpi 2 env DPSHIM_COMM_BACKEND=self LD_PRELOAD="$SHIM" "$BUILD/bin/hook_check"
    # dp_world_size still reports the job; collectives are local, so the sums are a rank's own
    assert_failure
    assert_output --partial "every rank trains alone"
}

SIZES=(1 2 3 5 7 10 13 97 1000 1001)

# epoch_cover_all MODE: the scale-mode sharding check at N = 1..4 for every size above.
epoch_cover_all() {
    for n in 1 2 3 4; do
        run mpi "$n" env DPSHIM_DATA_MODE=scale DPSHIM_DATA_UNEVEN="$1" LD_PRELOAD="$SHIM" \
            "$BUILD/bin/epoch_cover" "$1" "${SIZES[@]}"
        echo "$output"
        assert_success
        assert_equal "$(grep -c ' ok$' <<<"$output")" "${#SIZES[@]}"
    done
}

@test "scale mode, pad: every sample seen, equal shards, N = 1..4" { epoch_cover_all pad; }
@test "scale mode, drop: no sample twice, equal shards, N = 1..4" { epoch_cover_all drop; }

@test "split mode leaves the epoch whole for dp_batch to split" {
    # every rank keeps the whole epoch, so in pad terms each sample is counted N times
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/epoch_cover" pad 10
    assert_failure
    assert_output --partial "per_rank=10 total=20 WRONG"
}

@test "identity from PMIx when the launcher's environment names none (as under prterun)" {
    run mpi 2 env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK \
        -u OMPI_COMM_WORLD_LOCAL_SIZE DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$BUILD/bin/hook_check"
    echo "$output"
    assert_success
    assert_output --partial "rank 1 of 2 (local 1 of 2, launcher pmix"
    assert_equal "$(count ' 0 failed')" 2
}
