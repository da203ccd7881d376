# Shared by the integration tests: real mpirun, always under a timeout, and the built tree.
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

BUILD=${DPS_BUILD:?run through ctest, or set DPS_BUILD to the build directory}
SRC=${DPS_SRC:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}
SHIM=$BUILD/lib/libdpshim.so
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
