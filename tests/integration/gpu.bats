#!/usr/bin/env bats
# [gpu] bind: each local rank sees only its own GPU through CUDA_VISIBLE_DEVICES, set before the
# program runs. These tests need no GPU: a user's list names the devices, and without one a
# machine without GPUs is left alone.
load helpers

# Every rank prints its local rank and what CUDA_VISIBLE_DEVICES it got.
visible() {
    local n=$1
    shift
    run mpi "$n" env "$@" LD_PRELOAD="$SHIM" sh -c 'echo "local $OMPI_COMM_WORLD_LOCAL_RANK sees ${CUDA_VISIBLE_DEVICES-unset}"'
    echo "$output"
    assert_success
}

@test "the user's list is dealt out by local rank" {
    visible 2 CUDA_VISIBLE_DEVICES=2,3
    assert_line "local 0 sees 2"
    assert_line "local 1 sees 3"
    refute_output --partial "share"
}

@test "more local ranks than GPUs: round robin, and one warning about sharing" {
    visible 4 CUDA_VISIBLE_DEVICES=3,1
    assert_line "local 0 sees 3"
    assert_line "local 1 sees 1"
    assert_line "local 2 sees 3"
    assert_line "local 3 sees 1"
    assert_equal "$(grep -c '4 local ranks share 2 GPU(s)' <<<"$output")" 1
}

@test "a rank that execs itself keeps the GPU it was given" {
    run mpi 2 env CUDA_VISIBLE_DEVICES=2,3 LD_PRELOAD="$SHIM" sh -c \
        'exec sh -c "echo local \$OMPI_COMM_WORLD_LOCAL_RANK sees \${CUDA_VISIBLE_DEVICES-unset}"'
    echo "$output"
    assert_success
    assert_line "local 0 sees 2"
    assert_line "local 1 sees 3"
    refute_output --partial "share"
}

@test "UUIDs pass through as they are" {
    visible 2 CUDA_VISIBLE_DEVICES=GPU-5a0c1b7e,GPU-9f3d
    assert_line "local 0 sees GPU-5a0c1b7e"
    assert_line "local 1 sees GPU-9f3d"
}

@test "[gpu] bind = off leaves the list alone" {
    visible 2 CUDA_VISIBLE_DEVICES=2,3 DPSHIM_GPU_BIND=off
    assert_line "local 0 sees 2,3"
    assert_line "local 1 sees 2,3"
}

@test "a machine without GPUs and no list: nothing is set" {
    if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then skip "this machine has GPUs"; fi
    visible 2
    assert_line "local 0 sees unset"
    assert_line "local 1 sees unset"
}

@test "an empty list (every GPU hidden by the user) stays empty" {
    visible 2 CUDA_VISIBLE_DEVICES=
    assert_line "local 0 sees "
    assert_line "local 1 sees "
}
