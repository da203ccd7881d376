#!/usr/bin/env bats
# Split mode reproduces the single-process run: N ranks with the shim give rank 0 the weights of
# the plain program (no LD_PRELOAD), all ranks agree, and sync-BN is what makes it so.
load helpers

# batch 100 is not divisible by 3: shares 34/33/33
ARGS=(--batch 100 --no-eval --seed 7)

setup_file() {
    export REF=$BATS_FILE_TMPDIR/ref
    mkdir -p "$REF"
    "$TRAINER" "${ARGS[@]}" --steps 1 --save "$REF/one.ckpt" >/dev/null
    "$TRAINER" "${ARGS[@]}" --steps 200 --save "$REF/long.ckpt" >/dev/null
}

@test "np=2: one step equals the single-process run within 1e-6" { check_np 2 1 "$REF/one.ckpt" 1e-6; }
@test "np=3: one step equals the single-process run within 1e-6" { check_np 3 1 "$REF/one.ckpt" 1e-6; }
@test "np=4: one step equals the single-process run within 1e-6" { check_np 4 1 "$REF/one.ckpt" 1e-6; }
@test "np=2: 200 steps equal the single-process run within 1e-4" { check_np 2 200 "$REF/long.ckpt" 1e-4; }
@test "np=3: 200 steps equal the single-process run within 1e-4" { check_np 3 200 "$REF/long.ckpt" 1e-4; }
@test "np=4: 200 steps equal the single-process run within 1e-4" { check_np 4 200 "$REF/long.ckpt" 1e-4; }

@test "sync-BN off is measurably worse than on" {
    local on=$BATS_TEST_TMPDIR/on off=$BATS_TEST_TMPDIR/off
    mkdir -p "$on" "$off"
    run train_np 3 "$on" "${ARGS[@]}" --steps 200
    assert_success
    DPSHIM_BN_SYNC=off run train_np 3 "$off" "${ARGS[@]}" --steps 200
    assert_success
    rel_on=$(rel_diff "$REF/long.ckpt" "$on/rank0.ckpt")
    rel_off=$(rel_diff "$REF/long.ckpt" "$off/rank0.ckpt")
    echo "sync on rel=$rel_on, off rel=$rel_off" >&3
    assert_le 1e-3 "$rel_off"
    assert_le "$(awk -v x="$rel_on" 'BEGIN { print x * 100 }')" "$rel_off"
}

@test "LD_PRELOAD without a launcher gives bitwise the plain run's weights" {
    LD_PRELOAD=$SHIM run "$TRAINER" "${ARGS[@]}" --steps 200 --save "$BATS_TEST_TMPDIR/single.ckpt"
    assert_success
    run "$CKPT" same "$REF/long.ckpt" "$BATS_TEST_TMPDIR/single.ckpt"
    assert_success
}

@test "np=1 under mpirun gives bitwise the plain run's weights" {
    run train_np 1 "$BATS_TEST_TMPDIR" "${ARGS[@]}" --steps 200
    assert_success
    run "$CKPT" same "$REF/long.ckpt" "$BATS_TEST_TMPDIR/rank0.ckpt"
    assert_success
}

@test "scale mode trains: ranks stay identical and the loss falls" {
    DPSHIM_DATA_MODE=scale run train_np 2 "$BATS_TEST_TMPDIR" --batch 50 --no-eval --train-limit 10001 --epochs 2
    assert_success
    # 10001 samples padded to 5001 per rank: 101 steps of 50 per epoch
    assert_output --partial "epoch 1: 101 steps"
    loss1=$(echo "$output" | sed -n 's/^epoch 1: .*loss \([0-9.]*\).*/\1/p' | head -1)
    loss2=$(echo "$output" | sed -n 's/^epoch 2: .*loss \([0-9.]*\).*/\1/p' | head -1)
    assert_le "$loss2" "$loss1"
    run "$CKPT" same "$BATS_TEST_TMPDIR/rank0.ckpt" "$BATS_TEST_TMPDIR/rank1.ckpt"
    assert_success
}

# [comm] overlap reduces the same buckets in the background: the weights must not change by a bit.
overlap_same() {
    local n=$1
    for ov in on off; do
        mkdir -p "$BATS_TEST_TMPDIR/$ov"
        DPSHIM_COMM_OVERLAP=$ov DPSHIM_COMM_BUCKET_MB=1 run train_np "$n" "$BATS_TEST_TMPDIR/$ov" "${ARGS[@]}" --steps 50
        assert_success
    done
    run "$CKPT" same "$BATS_TEST_TMPDIR/on/rank0.ckpt" "$BATS_TEST_TMPDIR/off/rank0.ckpt"
    assert_success
}
@test "np=2: overlap on and off give bitwise the same weights" { overlap_same 2; }
@test "np=4: overlap on and off give bitwise the same weights" { overlap_same 4; }
