#!/usr/bin/env bats
# Slurm as the launcher: a one-node cluster of Debian's slurmctld, slurmd and munge, started on
# this machine for these tests (tests/slurm/cluster.sh) and stopped at the end. The example
# trainer under srun --mpi=pmix and inside sbatch must be what it is under mpirun, with each
# rank's local rank and size right; srun without PMIx must end at once with dpshim's own words.
load helpers

setup_file() {
    for tool in munged slurmctld slurmd srun sbatch; do
        command -v $tool >/dev/null || skip "no $tool (apt-get install munge slurmctld slurmd slurm-client)"
    done
    export SLURM_DIR=$BATS_FILE_TMPDIR/slurm
    if ! SLURM_CONF=$("$SRC/tests/slurm/cluster.sh" start "$SLURM_DIR" 2>"$BATS_FILE_TMPDIR/cluster.err"); then
        # CI's machine runs the daemons; elsewhere (no root, no room for them) say why
        [ "${CI:-}" = true ] && { cat "$BATS_FILE_TMPDIR/cluster.err" >&3; return 1; }
        skip "the Slurm daemons did not start here: $(cat "$BATS_FILE_TMPDIR/cluster.err")"
    fi
    export SLURM_CONF
}

teardown_file() {
    [ -n "${SLURM_DIR:-}" ] && "$SRC/tests/slurm/cluster.sh" stop "$SLURM_DIR"
}

# trainer LAUNCH... : the example trainer, 50 steps, rank 0's checkpoint to $BATS_TEST_TMPDIR/<tag>.ckpt
STEPS=(--steps 50 --no-eval)

@test "srun --mpi=pmix at -n 2 and -n 3: local ranks and sizes right, weights bitwise mpirun's" {
    cd "$BATS_TEST_TMPDIR"
    for n in 2 3; do
        run mpi $n env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" "${STEPS[@]}" --save mpirun$n.ckpt
        assert_success
        run timeout 120 srun -O --mpi=pmix -n $n env DPSHIM_DIAG_LOG=info DPSHIM_FILES_RANK0_ONLY='*.ckpt' \
            LD_PRELOAD="$SHIM" "$TRAINER" "${STEPS[@]}" --save srun$n.ckpt
        echo "$output"
        assert_success
        for r in $(seq 0 $((n - 1))); do
            assert_output --partial "rank $r of $n (local $r of $n, launcher slurm"
        done
        run "$CKPT" same mpirun$n.ckpt srun$n.ckpt
        assert_success
    done
}

@test "inside sbatch: srun --mpi=pmix runs the job as mpirun does" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" "${STEPS[@]}" --save mpirun.ckpt
    assert_success
    run timeout 180 sbatch -O -n 2 --wait -o batch.out --wrap "srun --mpi=pmix env DPSHIM_DIAG_LOG=info \
        DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD='$SHIM' '$TRAINER' ${STEPS[*]} --save batch.ckpt"
    cat batch.out
    assert_success
    grep -q "rank 1 of 2 (local 1 of 2, launcher slurm" batch.out || fail "no slurm identity in the batch output"
    run "$CKPT" same mpirun.ckpt batch.ckpt
    assert_success
}

@test "dpshim-run inside an allocation: srun --mpi=pmix with the library's full path, as mpirun" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" "${STEPS[@]}" --save mpirun.ckpt
    assert_success
    run timeout 180 sbatch -O -n 2 --wait -o run.out --wrap "DPSHIM_FILES_RANK0_ONLY='*.ckpt' \
        '$BUILD/bin/dpshim-run' '$TRAINER' ${STEPS[*]} --save run.ckpt"
    cat run.out
    assert_success
    grep -q "^dpshim-run: srun --mpi=pmix --cpu-bind=none env LD_PRELOAD=$(readlink -f "$SHIM") $TRAINER" run.out ||
        fail "dpshim-run did not choose srun"
    run "$CKPT" same mpirun.ckpt run.ckpt
    assert_success
}

@test "srun without PMIx (--mpi=pmi2, --mpi=none): every rank stops at once with the line that works" {
    for mpi in pmi2 none; do
        local start=$SECONDS
        run timeout 60 srun --mpi=$mpi -n 2 env LD_PRELOAD="$SHIM" "$TRAINER" "${STEPS[@]}"
        echo "$output"
        assert_failure
        [ $((SECONDS - start)) -le 5 ] || fail "--mpi=$mpi took $((SECONDS - start)) s"
        assert_equal "$(count 'without a PMIx server')" 2
        assert_output --partial "Start the step with srun --mpi=pmix"
        refute_output --partial "OMPI was not built"
        refute_output --partial "fmnist_train:"
    done
}

@test "a lost rank under Slurm: mpirun --enable-recovery inside the allocation goes on; srun --no-kill is told it cannot" {
    cd "$BATS_TEST_TMPDIR"
    # rank 2 of 3 SIGKILLed at step 3: the other two go on and the job exits 0
    run timeout 180 salloc -O -n 3 env DPSHIM_GUARD_TIMEOUT=30 "$BUILD/bin/dpshim-run" --launcher mpirun -np 3 \
        --oversubscribe --enable-recovery "$BUILD/bin/elastic_train" 6 2 3 </dev/null
    echo "$output"
    assert_success
    assert_output --partial "elastic: the job lost rank 2 in step 3 and went on with 2 of its 3 ranks"
    assert_equal "$(grep -c '^rank .* checksum .*, 2 ranks$' <<<"$output")" 2
    # srun --mpi=pmix --no-kill: Slurm's PMIx plugin cancels the whole step when a task dies, so
    # dpshim-run says what works before it starts, and the job fails rather than hang
    run timeout 180 "$BUILD/bin/dpshim-run" --launcher srun -O -n 3 --no-kill "$BUILD/bin/elastic_train" 6 2 3 </dev/null
    echo "$output"
    assert_failure
    assert_output --partial "dpshim-run: srun --no-kill: Slurm's PMIx plugin ends the whole step when a task dies"
}
