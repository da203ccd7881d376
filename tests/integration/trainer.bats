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

@test "torchrun's workers stop at once, naming the launcher and the mpirun line to use" {
    # torchrun's environment as it gives it to a worker (Debian's torchrun 1.13 itself fails on
    # Python 3.11 before it starts any worker, with or without the shim)
    local t0=$SECONDS
    run env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=job7 LD_PRELOAD="$SHIM" \
        "$TRAINER" --steps 1 --no-eval
    assert_equal "$status" 78
    [ $((SECONDS - t0)) -le 2 ] || fail "took $((SECONDS - t0)) s"
    assert_output --partial "started by torchrun (RANK=1, WORLD_SIZE=2, TORCHELASTIC_RUN_ID set)"
    assert_output --partial "mpirun -np 2 env LD_PRELOAD=$SHIM $TRAINER --steps 1 --no-eval"
    refute_output --partial "fmnist_train:"
    # the same variables from another launcher that sets them (deepspeed, accelerate)
    run env RANK=0 WORLD_SIZE=3 LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_equal "$status" 78
    assert_output --partial "a launcher that sets RANK and WORLD_SIZE (torchrun"
    # one worker is a program alone
    run env RANK=0 WORLD_SIZE=1 LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_success
}

@test "a job where no hook shared out any work says so once, at rank 0's exit" {
    run mpi 3 env LD_PRELOAD="$SHIM" /bin/true
    assert_success
    assert_equal "$(count 'nothing was distributed in this job of 3 ranks')" 1
    assert_output --partial "No framework called the hook ABI"
    # a Python process: the adapter is named, and that evaluation runs whole
    run mpi 2 env LD_PRELOAD="$SHIM" /usr/bin/python3 -c 'print("scored the whole set")'
    assert_success
    assert_equal "$(count 'nothing was distributed')" 1
    assert_output --partial "PyTorch adapter"
    # a trainer whose batches and gradients are shared out, and a job of one: nothing to say
    run train_np 2 "$BATS_TEST_TMPDIR" --steps 3 --no-eval
    assert_success
    refute_output --partial "nothing was distributed"
    run mpi 1 env LD_PRELOAD="$SHIM" /bin/true
    refute_output --partial "nothing was distributed"
}

@test "nothing distributed: the warning names the framework found, the report says it, error mode exits 78" {
    # libtorch loaded, no adapter and no hook: the C++ library is named, with what to do
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_ADAPTERS_PYTHON=off DPSHIM_DIAG_DIR="$BATS_TEST_TMPDIR/d" \
        /usr/bin/python3 -c 'import ctypes; ctypes.CDLL("libtorch_cpu.so.1.13")'
    assert_success
    assert_equal "$(count 'nothing was distributed')" 1
    assert_output --regexp "Found: libtorch_cpu\.so[.0-9]* \(libtorch, PyTorch's C\+\+ library\); no adapter;"
    assert_output --partial "No libtorch optimizer's step, backward pass or sampler was called"
    run "$BUILD/bin/dpshim-diag" report "$BATS_TEST_TMPDIR/d"
    assert_output --partial "problems: nothing was distributed"
    assert_output --regexp "  nothing was distributed in this job of 2 ranks\. Found: libtorch_cpu"
    # PyTorch in Python with the adapter turned off
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_ADAPTERS_PYTHON=off /usr/bin/python3 -c 'import torch'
    assert_output --partial "PyTorch runs in this process without the adapter: set [adapters] python = auto"
    # [hook] declarations that bind nowhere
    printf "[hook h]\nsignature = void no_such_function_here(void)\nmissing = ignore\nbefore = step_end\n" >"$BATS_TEST_TMPDIR/h.conf"
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_POLICY="$BATS_TEST_TMPDIR/h.conf" /bin/true
    assert_output --partial "1 [hook] declaration(s) of the policy, bound at 0 call site(s)"
    # a job that must distribute: an error, once, and every rank exits 78
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_GUARD_NOTHING_SHARED=error /bin/true
    assert_equal "$status" 78
    assert_equal "$(count 'ERROR nothing was distributed')" 1
    assert_output --partial "[guard] nothing_shared = error: every rank exits 78"
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_GUARD_NOTHING_SHARED=off /bin/true
    assert_success
    refute_output --partial "nothing was distributed"
}

@test "Open MPI's default binding that leaves a rank fewer cores than its share: rank 0 says so, with the line to use" {
    # at np=1 mpirun binds the rank to one core of this machine's $(nproc)
    [ "$(nproc)" -ge 2 ] || skip "one core: no share to lose"
    run mpi 1 env LD_PRELOAD="$SHIM" /bin/true
    assert_success
    assert_output --partial "Open MPI bound each rank to 1 core(s) (its default binding), while this node has $(nproc) cores"
    assert_output --partial "mpirun --bind-to none"
    # a placement the user chose is theirs
    for choice in "--bind-to none" "--bind-to core" "--map-by slot:PE=1"; do
        run mpi 1 $choice env LD_PRELOAD="$SHIM" /bin/true
        assert_success
        refute_output --partial "default binding"
    done
}

@test "[cpu] threads = share: each rank's OpenMP and PyTorch threads are its share of the cores" {
    local cores share
    cores=$(nproc)
    [ "$cores" -ge 2 ] || skip "one core: every share is one thread"
    share=$((cores / 2))
    run mpi 2 --bind-to none env LD_PRELOAD="$SHIM" "$BUILD/bin/omp_threads"
    assert_success
    assert_equal "$(count "openmp threads $share")" 2
    # PyTorch reads the variable when it starts its pool, after the shim's constructor; one write
    # per line (print writes each piece apart under PYTHONUNBUFFERED=1, and two ranks' pieces
    # interleave)
    run mpi 2 --bind-to none env LD_PRELOAD="$SHIM" /usr/bin/python3 -c \
        'import os, sys, torch; sys.stdout.write("torch threads %d %s\n" % (torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]))'
    assert_success
    assert_equal "$(count "torch threads $share $share")" 2
    # alone, a count the user set, and keep: as the environment says
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/omp_threads"
    assert_output "openmp threads $cores"
    run mpi 2 --bind-to none env OMP_NUM_THREADS=3 LD_PRELOAD="$SHIM" "$BUILD/bin/omp_threads"
    assert_equal "$(count "openmp threads 3")" 2
    run mpi 2 --bind-to none env DPSHIM_CPU_THREADS=keep LD_PRELOAD="$SHIM" "$BUILD/bin/omp_threads"
    assert_equal "$(count "openmp threads $cores")" 2
}

@test "Open MPI's variables left in a shell without a launcher: ignored, with a warning naming them" {
    run env OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" \
        "$TRAINER" --steps 2 --no-eval --save "$BATS_TEST_TMPDIR/alone.ckpt"
    assert_success
    assert_output --partial "OMPI_COMM_WORLD_RANK=1 and OMPI_COMM_WORLD_SIZE=2 are set, but no Open MPI launcher"
    # rank 0 of 1: the checkpoint is written, not sent to a sink as rank 1's would be
    [ -s "$BATS_TEST_TMPDIR/alone.ckpt" ] || fail "the checkpoint was not written"
}

# identity ENV...: the identity line of a process started with ENV (no launcher behind it: no exit
# barrier, which would wait for ranks that never come).
# PMIX_SERVER_URI2 stands for srun --mpi=pmix's server (PMIx itself is not asked where the
# environment answers).
identity() {
    env PMIX_SERVER_URI2=unused "$@" DPSHIM_GUARD_EXIT_BARRIER=off DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" /bin/true 2>&1 |
        grep -o "rank [0-9]* of [0-9]* (local [0-9]* of [0-9]*, launcher [a-z]*"
}

@test "Slurm's local size from its tasks-per-node list; a PMI-2 launch under Slurm takes Slurm's local values" {
    # 2 tasks on each of the first two nodes, then 1: ranks 0-1 on node 0, 2-3 on node 1, 4 on node 2
    assert_equal "$(identity SLURM_PROCID=3 SLURM_NTASKS=5 SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_STEP_TASKS_PER_NODE='2(x2),1')" \
        "rank 3 of 5 (local 1 of 2, launcher slurm"
    assert_equal "$(identity SLURM_PROCID=4 SLURM_NTASKS=5 SLURM_LOCALID=0 SLURM_NODEID=2 SLURM_STEP_TASKS_PER_NODE='2(x2),1')" \
        "rank 4 of 5 (local 0 of 1, launcher slurm"
    # the job's list where the step has none
    assert_equal "$(identity SLURM_PROCID=2 SLURM_NTASKS=3 SLURM_LOCALID=2 SLURM_NODEID=0 SLURM_TASKS_PER_NODE=3)" \
        "rank 2 of 3 (local 2 of 3, launcher slurm"
    # srun --mpi=pmi2 with an Open MPI built with Slurm's PMI (its pmix/s2 component): PMI's rank
    # and size, Slurm's local rank and size
    mkdir -p "$BATS_TEST_TMPDIR/ompi" && : >"$BATS_TEST_TMPDIR/ompi/mca_pmix_s2.so"
    assert_equal "$(env -u PMIX_SERVER_URI2 OPAL_PKGLIBDIR="$BATS_TEST_TMPDIR/ompi" PMI_RANK=1 PMI_SIZE=2 SLURM_STEP_ID=0 \
        SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 SLURM_NODEID=0 SLURM_STEP_TASKS_PER_NODE=2 DPSHIM_GUARD_EXIT_BARRIER=off \
        DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" /bin/true 2>&1 | grep -o "rank [0-9]* of [0-9]* (local [0-9]* of [0-9]*, launcher [a-z]*")" \
        "rank 1 of 2 (local 1 of 2, launcher pmi"
    # ... and with this machine's Open MPI, which joins only through PMIx: stopped before main
    run env PMI_RANK=1 PMI_SIZE=2 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 LD_PRELOAD="$SHIM" /bin/true
    assert_equal "$status" 78
    assert_output --partial "srun started this process without a PMIx server"
}

@test "a local size the launcher gives that the ranks' hosts contradict ends the job, naming its source" {
    run mpi 2 sh -c 'OMPI_COMM_WORLD_LOCAL_SIZE=1 exec env LD_PRELOAD="$1" "$2" --steps 2 --no-eval' sh "$SHIM" "$TRAINER"
    assert_failure
    assert_output --partial "local rank 0 of 1 (from OMPI_COMM_WORLD_LOCAL_SIZE, launcher openmpi), but 2 rank(s) of the job run on this host ($(hostname))"
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
