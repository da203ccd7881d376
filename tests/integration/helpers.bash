# Shared by the integration tests: real mpirun, always under a timeout, and the built tree.
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

BUILD=${DPS_BUILD:?run through ctest, or set DPS_BUILD to the build directory}
SRC=${DPS_SRC:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}
# What LD_PRELOAD names: the shim, after ThreadSanitizer's runtime in its build (threads.sh sets
# DPS_PRELOAD_FIRST), whose interceptors must come before the shim's.
SHIM=${DPS_PRELOAD_FIRST:+$DPS_PRELOAD_FIRST:}$BUILD/lib/libdpshim.so
TRAINER=$BUILD/bin/fmnist_train
CKPT=$BUILD/bin/dpnn-ckpt
MPI_TIMEOUT=${DPS_TEST_TIMEOUT:-300}

if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Open MPI's shared-memory transport needs no network; keep tests off any interface.
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
unset DPSHIM_POLICY

# count TEXT: occurrences of TEXT in $output. mpirun merges the ranks' output in chunks and may
# join or split their lines, so lines are not counted, occurrences are.
count() { grep -oF -- "$1" <<<"$output" | wc -l; }

# mpi N CMD...: mpirun under a timeout, so a hang fails the test instead of stalling CI.
mpi() {
    local n=$1
    shift
    timeout --kill-after=10 "$MPI_TIMEOUT" mpirun --oversubscribe -np "$n" "$@" </dev/null
}

# train_np N DIR ARGS...: the trainer on N ranks with the shim; rank r saves DIR/rank<r>.ckpt.
train_np() {
    local n=$1 dir=$2
    shift 2
    mpi "$n" sh -c 'shim=$1 bin=$2 dir=$3; shift 3
        exec env LD_PRELOAD="$shim" "$bin" --save "$dir/rank$OMPI_COMM_WORLD_RANK.ckpt" "$@"' \
        sh "$SHIM" "$TRAINER" "$dir" "$@"
}

# rel_diff A B: max|a-b| / max|a| of two checkpoints.
rel_diff() {
    "$CKPT" diff "$1" "$2" | sed -n 's/.* rel \([^ ]*\) .*/\1/p'
}

# assert_le X Y: X <= Y as floating-point numbers.
assert_le() {
    awk -v x="$1" -v y="$2" 'BEGIN { exit !(x + 0 <= y + 0) }' || fail "expected $1 <= $2"
}

# check_np N STEPS REF TOL: the trainer on N ranks (the calling file's ARGS, through train_np,
# so across the nodes in multinode.bats) gives rank 0 the single-process weights REF within TOL,
# and every rank holds bitwise the same weights.
check_np() {
    local n=$1 steps=$2 ref=$3 tol=$4
    local dir=$BATS_TEST_TMPDIR/np$n
    mkdir -p "$dir"
    run train_np "$n" "$dir" "${ARGS[@]}" --steps "$steps"
    assert_success
    rel=$(rel_diff "$ref" "$dir/rank0.ckpt")
    echo "np=$n steps=$steps rel=$rel" >&3
    assert_le "$rel" "$tol"
    for r in $(seq 1 $((n - 1))); do
        run "$CKPT" same "$dir/rank0.ckpt" "$dir/rank$r.ckpt"
        assert_success # every rank holds bitwise the same weights
    done
}

# fault FAULT RANK STEP: guard_faults on 4 ranks (through mpi, as the calling file defines it)
# with one fault and [guard] timeout = $TIMEOUT; the job must end by itself within the timeout
# + 15 s. Its time goes to $elapsed.
fault() {
    local start=$SECONDS
    run mpi 4 env DPSHIM_GUARD_TIMEOUT=$TIMEOUT ${DPSHIM_GUARD_DESYNC:+DPSHIM_GUARD_DESYNC=$DPSHIM_GUARD_DESYNC} \
        ${DPSHIM_GUARD_DRIFT_EVERY:+DPSHIM_GUARD_DRIFT_EVERY=$DPSHIM_GUARD_DRIFT_EVERY} \
        ${GUARD_FAULTS_ANNOUNCE:+GUARD_FAULTS_ANNOUNCE=$GUARD_FAULTS_ANNOUNCE DPSHIM_COMM_OVERLAP=on} \
        LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 10 "$@"
    elapsed=$((SECONDS - start))
    echo "$output"
    echo "ended after $elapsed s" >&3
    [ "$elapsed" -le $((TIMEOUT + 15)) ] || fail "took $elapsed s"
}

# bn_reference N [ENV...] -- [ARGS...]: the calling file's BatchNorm reference check
# ("${BN_REFERENCE[@]}" ARGS: tests/integration/bn_reference.py, libtorch/bn_reference.cpp) on N
# ranks: output, gradients and running statistics of each case bitwise the reference formulas, on
# every rank.
bn_reference() {
    local n=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1") && shift; done
    shift
    run mpi "$n" env OMP_NUM_THREADS=1 "${envs[@]}" LD_PRELOAD="$SHIM" "${BN_REFERENCE[@]}" "$@"
    echo "$output"
    assert_success
    assert_equal "$(grep -oE 'bitwise [0-9]+' <<<"$output" | wc -l)" "$n" # one per rank (lines may interleave)
}

# bn_reference_np23: bn_reference at np=2 and 3; on an x86-64 CPU with AVX2 and FMA, where the
# framework runs its AVX2 kernels, every rank's backward took the single pass in both dtypes
# (unless the calling file sets BN_ONE_PASS empty: a framework whose bits the pass does not give).
bn_reference_np23() {
    local n
    for n in 2 3; do
        bn_reference "$n" --
        if [ -n "${BN_ONE_PASS-1}" ] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
            assert_equal "$(grep -o 'backward in one pass: float32 float64' <<<"$output" | wc -l)" "$n"
        fi
    done
}

# bn_reference_ops: the framework's ops, not the single pass, and the same bits, where its
# kernels round otherwise (without vector instructions addcmul_ rounds twice: the probe keeps the
# ops) or run on two threads (its three passes run in parallel).
bn_reference_ops() {
    bn_reference 2 ATEN_CPU_CAPABILITY=default --
    assert_equal "$(grep -o 'backward in one pass: none' <<<"$output" | wc -l)" 2
    bn_reference 2 -- 2
    assert_equal "$(grep -o 'backward in one pass: none' <<<"$output" | wc -l)" 2
}
