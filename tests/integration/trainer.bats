#!/usr/bin/env bats
# The example trainer's own contract: clear errors for missing or broken data, and a program
# that calls MPI_Init/MPI_Finalize itself still runs correctly under the shim.
load helpers

@test "missing dataset: names the path and the Debian package" {
    run "$TRAINER" --data "$BATS_TEST_TMPDIR/nothing" --steps 1
    assert_failure
    assert_output --partial "cannot open $BATS_TEST_TMPDIR/nothing/train-images-idx3-ubyte.gz"
    assert_output --partial "install Debian's dataset-fashion-mnist package"
}

@test "truncated or foreign dataset files: a clear error, no crash" {
    local d=$BATS_TEST_TMPDIR/bad
    mkdir -p "$d"
    head -c 100000 /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz >"$d/train-images-idx3-ubyte.gz"
    cp /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz "$d/"
    run "$TRAINER" --data "$d" --steps 1 --no-eval
    assert_failure
    assert_output --partial "truncated"
    echo "not an idx file" | gzip >"$d/train-images-idx3-ubyte.gz"
    run "$TRAINER" --data "$d" --steps 1 --no-eval
    assert_failure
    assert_output --partial "is not an IDX file"
}

@test "bad arguments: usage and exit 2" {
    run "$TRAINER" --batch 0
    assert_equal "$status" 2
    assert_output --partial "bad or missing value for --batch"
}

# The MPI-using trainer on N ranks; rank r saves DIR/rank<r>.ckpt.
train_mpi_np() {
    local n=$1 dir=$2
    shift 2
    mpi "$n" sh -c 'shim=$1 bin=$2 dir=$3; shift 3
        exec env LD_PRELOAD="$shim" "$bin" "$@" --save "$dir/rank$OMPI_COMM_WORLD_RANK.ckpt"' \
        sh "$SHIM" "$BUILD/bin/fmnist_train_mpi" "$dir" "$@"
}

@test "a trainer that calls MPI_Init first and MPI_Finalize itself runs correctly" {
    "$TRAINER" --steps 5 --no-eval --save "$BATS_TEST_TMPDIR/ref.ckpt" >/dev/null
    run train_mpi_np 2 "$BATS_TEST_TMPDIR" --steps 5 --no-eval
    assert_success
    assert_equal "$(count 'own MPI traffic ok')" 2
    assert_le "$(rel_diff "$BATS_TEST_TMPDIR/ref.ckpt" "$BATS_TEST_TMPDIR/rank0.ckpt")" 1e-6
}

@test "a trainer that calls MPI_Init after the shim initialized MPI runs correctly" {
    "$TRAINER" --steps 5 --no-eval --save "$BATS_TEST_TMPDIR/ref.ckpt" >/dev/null
    run train_mpi_np 3 "$BATS_TEST_TMPDIR" --mpi-late --steps 5 --no-eval
    assert_success
    assert_equal "$(count 'own MPI traffic ok')" 3
    assert_le "$(rel_diff "$BATS_TEST_TMPDIR/ref.ckpt" "$BATS_TEST_TMPDIR/rank0.ckpt")" 1e-6
}

@test "identity from torchrun's environment; a launcher MPI cannot join is a clear error" {
    run env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" \
        "$TRAINER" --steps 1 --no-eval
    assert_output --partial "[dpshim r1/2] INFO rank 1 of 2 (local 1 of 2, launcher torchrun"
    # no MPI job behind it: the first collective says so and ends the process
    assert_equal "$status" 70
    assert_output --partial "MPI says rank 0 of 1, the launcher said rank 1 of 2"
}

@test "identity from Slurm's environment; an inconsistent one stops before main" {
    run env SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" \
        "$TRAINER" --steps 1 --no-eval
    assert_success
    assert_output --partial "rank 0 of 1 (local 0 of 1, launcher slurm"
    run env SLURM_PROCID=5 SLURM_NTASKS=2 LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_equal "$status" 78
    assert_output --partial "the slurm launcher environment is inconsistent (SLURM_PROCID=5, SLURM_NTASKS=2)"
    refute_output --partial "fmnist_train:"
}
