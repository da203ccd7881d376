#!/usr/bin/env bats
# C++ programs on libtorch, unmodified, under mpirun: the libtorch adapter (hooks/adapters/libtorch/)
# shares out their batches and averages their gradients where libtorch's own functions run.
# Each trainer runs alone and at np = 2 and 3; in float64 what rank 0 prints agrees with the run
# alone to 1e-9 (relative), and every rank prints the same.
load helpers

setup() {
    T=$BUILD/bin/torch_trainer
    [ -x "$T" ] || skip "built without libtorch-dev: no libtorch adapter"
    cd "$BATS_TEST_TMPDIR"
}

# same_numbers A B: the two outputs line by line, words equal and numbers within 1e-9 relative.
same_numbers() {
    python3 - "$1" "$2" <<'PYEOF'
import sys
a, b = (open(p).read().split("\n") for p in sys.argv[1:])
assert len(a) == len(b), "%d lines against %d" % (len(a), len(b))
for la, lb in zip(a, b):
    for x, y in zip(la.split(), lb.split()):
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            assert x == y, "%r against %r" % (la, lb)
            continue
        assert abs(fx - fy) <= 1e-9 * max(abs(fx), abs(fy), 1e-300), "%r against %r" % (la, lb)
print("same")
PYEOF
}

# against_alone N ARGS...: the trainer alone, then on N ranks; rank 0's stdout against alone's,
# every rank's stdout alike, and each rank's samples per epoch on stderr in $samples.
against_alone() {
    local n=$1 r
    shift
    "$T" "$@" >alone.txt 2>alone.err
    rm -f out.* err.*
    run mpi "$n" sh -c 'exec env LD_PRELOAD="$0" "$@" >out.$OMPI_COMM_WORLD_RANK 2>err.$OMPI_COMM_WORLD_RANK' \
        "$SHIM" "$T" "$@"
    cat err.0
    assert_success
    # the weights' bytes and the optimizer's own state are for the sharding tests below
    sed -i '/^weights_hash /d; /^state_elements /d' alone.txt out.*
    run same_numbers alone.txt out.0
    assert_output same
    for r in $(seq 1 $((n - 1))); do cmp out.0 out.$r; done
    ! grep -q "nothing was distributed" err.0 || fail "nothing was distributed"
    samples=$(cat err.* | sed -n 's/^epoch 1 trained on \([0-9]*\) samples.*/\1/p' | paste -sd+)
    samples=$((samples))
    most=$(cat err.* | sed -n 's/^epoch 1 trained on \([0-9]*\) samples.*/\1/p' | sort -n | tail -1)
}

# each rank took its share of every epoch: all of the 100 samples, once
took_shares() {
    echo "np=$1: $samples samples over the ranks, at most $most on one"
    assert_equal "$samples" 100
    [ "$most" -lt 100 ] || fail "a rank trained on the whole epoch"
}

# at_2_and_3 ARGS...: as alone, and each rank its share, at np = 2 and 3
at_2_and_3() {
    local n
    for n in 2 3; do
        against_alone $n "$@"
        took_shares $n
    done
}

@test "a C++ trainer (SequentialSampler, SGD with momentum, a test pass under NoGradGuard): np=2, 3 print as alone" {
    at_2_and_3 --epochs 3
}

@test "RandomSampler with 2 DataLoader worker threads: one order on every rank, as alone" {
    at_2_and_3 --sampler random --workers 2
}

@test "two loaders taking turns by epoch, with 2 worker threads (a short last batch each): as alone" {
    # the first batch of a pass through the other loader is weighed as its own, not as one the
    # last step of the previous loader used
    against_alone 3 --sampler alternate --epochs 3 --batch 12 --workers 2
    took_shares 3
}

@test "two optimizers in one program, each stepping every batch, with 2 worker threads: as alone" {
    at_2_and_3 --two --opt sgd --workers 2
}

# A test pass in the middle of an epoch resets the test loader's sampler: the batches the training
# loader's workers fetched ahead still weigh the steps they are trained on.
@test "a test pass every 3 batches, in the middle of each epoch, with 2 worker threads: as alone" {
    at_2_and_3 --eval-every 3 --workers 2 --batch 8
}

# RandomSampler draws its order from rank 0's generator; afterwards each rank draws from its own
# again (dropout, augmentation), rank 0 as the run alone. (Ranks 1 and 2 draw alike: the trainer
# seeds every rank with one constant, as a program run alone does.)
@test "after RandomSampler's order, each rank draws its own random numbers; rank 0 those of the run alone" {
    against_alone 3 --sampler random --draw --epochs 1
    local alone0 r0 r1 r2
    alone0=$(sed -n 's/^draw //p' alone.err) r0=$(sed -n 's/^draw //p' err.0)
    r1=$(sed -n 's/^draw //p' err.1) r2=$(sed -n 's/^draw //p' err.2)
    echo "alone $alone0, ranks $r0 $r1 $r2"
    assert_equal "$r0" "$alone0"
    [ "$r1" != "$r0" ] && [ "$r2" != "$r0" ] || fail "ranks 1 and 2 draw rank 0's numbers"
}

@test "Adam, AdamW, RMSprop, Adagrad; a last batch with fewer samples than ranks taken whole: as alone" {
    local opt
    for opt in adam adamw rmsprop adagrad; do
        against_alone 3 --opt $opt --batch 7 --epochs 2
        # 14 batches of 7 shared out, the last 2 samples taken by each of the 3 ranks
        assert_equal "$samples" 104
    done
    against_alone 2 --opt adam --batch 7 --epochs 2
    took_shares 2
}

@test "LBFGS: the closure's backward passes averaged, the line search sees the global loss: as alone" {
    at_2_and_3 --opt lbfgs --epochs 2
}

@test "batches cut by hand, without a DataLoader: every rank trains on the whole batch, as alone" {
    local n
    for n in 2 3; do
        against_alone $n --manual --opt rmsprop
        assert_equal "$samples" $((100 * n))
    done
    # float32 too: the same batch on every rank is averaged in float64, so nothing rounds
    "$T" --manual --float >alone32.txt 2>/dev/null
    run mpi 3 env LD_PRELOAD="$SHIM" "$T" --manual --float
    assert_success
    while read -r line; do assert_equal "$(count "$line")" 3; done <alone32.txt
}

@test "a CNN with BatchNorm2d and BatchNorm1d: statistics of the global batch, as alone at np=2, 3" {
    # each epoch's test pass in eval mode and the running statistics as alone (1e-9), unequal
    # shares of 16 at np=3; BatchNorm1d's momentum none. The last batch of 4 is shared out at
    # np=2; at np=3 (fewer than 2N samples: a share of one would stop BatchNorm1d) each rank
    # takes it whole
    T=$BUILD/bin/bn_cnn
    against_alone 2
    grep -q "^bn1 running_var " out.0
    assert_equal "$samples" 100
    against_alone 3
    assert_equal "$samples" $((96 + 3 * 4))
}

# the libtorch adapter's BatchNorm against its reference formulas (bn_reference in helpers.bash);
# the single pass gives libtorch 1.13's bits, not 2.6's (Debian 13: its ops stay there)
BN_REFERENCE=("$BUILD/bin/bn_reference")
BN_ONE_PASS=$(sed -n 2p "$BUILD/lib/dpshim/libdpshim-libtorch.needs" 2>/dev/null | grep '^1\.' || true)

@test "synchronized BatchNorm, np=2 and 3: bitwise its reference formulas over shapes, dtypes and layouts" {
    bn_reference_np23
}

@test "synchronized BatchNorm: libtorch's ops where its kernels round otherwise or run on more threads, same bits" {
    bn_reference_ops
}

@test "[bn] sync = off: each rank's BatchNorm keeps its own share's statistics" {
    T=$BUILD/bin/bn_cnn
    run mpi 2 sh -c 'exec env LD_PRELOAD="$0" DPSHIM_BN_SYNC=off "$@" >out.$OMPI_COMM_WORLD_RANK' "$SHIM" "$T" --epochs 1
    assert_success
    run cmp <(grep running_mean out.0) <(grep running_mean out.1)
    assert_failure
}

@test "a gradient penalty through synchronized BatchNorm: every rank stops, saying why; with sync off it trains" {
    # the penalty differentiates BatchNorm's backward again; its gradient sums over the ranks,
    # which no graph records: refused when reached (as PyTorch's SyncBatchNorm), not left out
    T=$BUILD/bin/bn_cnn
    "$T" --penalty --epochs 1 >/dev/null 2>&1 || fail "the gradient penalty fails alone"
    run mpi 2 env LD_PRELOAD="$SHIM" "$T" --penalty --epochs 1
    assert_failure
    assert_equal "$(count 'a second derivative through a BatchNorm layer synchronized across the ranks')" 2
    assert_output --partial "set [bn] sync = off"
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_BN_SYNC=off "$T" --penalty --epochs 1
    assert_success
    assert_equal "$(count 'epoch 1 trained on 50 samples')" 2
}

@test "per-sample losses (Reduction::None) backpropagated as they are, shares of one sample: weights as alone" {
    # 100 samples in batches of 16 at np=3: the last batch of 4 leaves two ranks a share of one
    # sample, a loss of one element there and of two on the third; none is a scalar loss
    "$T" --per-sample --epochs 2 >alone.txt
    run mpi 3 env DPSHIM_OUTPUT_STDOUT=rank0 LD_PRELOAD="$SHIM" "$T" --per-sample --epochs 2
    assert_success
    assert_equal "$(count 'epoch 2 trained on')" 3
    grep '^weights ' alone.txt >alone.w
    grep '^weights ' <<<"$output" >job.w
    run same_numbers alone.w job.w
    assert_output same
}

@test "a loss of shape [1] (added up in torch::zeros({1})): its value after backward is the global batch's, as alone" {
    at_2_and_3 --shape-one
}

@test "every rank makes the collectives; torch::save under rank0_only writes one model and one optimizer" {
    mkdir alone job
    (cd alone && "$T" --save run >/dev/null 2>&1)
    cd job
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_DIAG_DIR=diag DPSHIM_FILES_RANK0_ONLY='*.pt' "$T" --save run
    assert_success
    assert_equal "$(ls)" "$(printf 'diag\nrun.model.pt\nrun.optim.pt')"
    # the weights agree to 1e-15 or so, not always bitwise: the same archive, the same size
    assert_equal "$(stat -c %s run.model.pt)" "$(stat -c %s ../alone/run.model.pt)"
    assert_equal "$(stat -c %s run.optim.pt)" "$(stat -c %s ../alone/run.optim.pt)"
    local names='import sys, zipfile; print(sorted(zipfile.ZipFile(sys.argv[1]).namelist()))'
    assert_equal "$(python3 -c "$names" run.model.pt)" "$(python3 -c "$names" ../alone/run.model.pt)"
    local r
    for r in 0 1; do
        [ "$(sed -n 's/^collectives //p' diag/stats.rank$r.txt)" -gt 20 ] || fail "rank $r made too few collectives"
    done
}

@test "scale mode: each rank takes every other batch, the ranks stay identical, fewer steps per epoch" {
    local n=2
    "$T" --epochs 2 2>alone.err >/dev/null
    rm -f out.* err.*
    run mpi $n sh -c 'exec env LD_PRELOAD="$0" DPSHIM_DATA_MODE=scale "$@" >out.$OMPI_COMM_WORLD_RANK 2>err.$OMPI_COMM_WORLD_RANK' \
        "$SHIM" "$T" --epochs 2
    assert_success
    cmp out.0 out.1
    grep -q "epoch 1 trained on 100 samples in 7 batches" alone.err
    # 7 batches: 4 pairs, the last padded with the first batch of its pair
    grep -q "epoch 1 trained on 52 samples in 4 batches" err.0
    grep -q "epoch 1 trained on 52 samples in 4 batches" err.1
    # uneven = drop: the short last pair ends the epoch
    run mpi $n env LD_PRELOAD="$SHIM" DPSHIM_DATA_MODE=scale DPSHIM_DATA_UNEVEN=drop "$T" --epochs 1
    assert_success
    assert_equal "$(count 'epoch 1 trained on 48 samples in 3 batches')" 2
}

# lost_rank KILL ARGS...: the trainer at np=3 in scale mode under --enable-recovery, MPI rank KILL
# SIGKILLed before its second batch of epoch 1 (or ARGS' --kill-epoch); true where the launcher
# keeps the survivors (Open MPI 4), else the job ended as it must there.
lost_rank() {
    local kill=$1
    shift
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_DATA_MODE=scale DPSHIM_GUARD_TIMEOUT=30 \
        "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery "$T" --epochs 3 --kill "$kill" "$@" </dev/null
    echo "$output"
    if ! mpirun --version | grep -q 'Open MPI) 4'; then
        # Open MPI 5 (./dev.sh test-libtorch2): the job ends, and dpshim-run said why
        assert_failure 75
        assert_output --partial "Open MPI 5's mpirun does not tell the ranks that it keeps them"
        return 1
    fi
    assert_success
    assert_output --partial "the job lost rank $kill in step"
    for epoch in 2 3; do
        assert_equal "$(count "epoch $epoch trained on 52 samples in 4 batches")" 2
        # the survivors' models stay one: both print the same epoch line
        assert_equal "$(grep -c "^epoch $epoch loss" <<<"$output")" 2
        assert_equal "$(grep "^epoch $epoch loss" <<<"$output" | sort -u | wc -l)" 1
    done
}

@test "scale mode, a rank lost in epoch 1 or between epochs (--enable-recovery): its untrained batches are trained, and the survivors share every later epoch" {
    # 100 samples in 7 batches of 16 (the last of 4): after the loss each of the two survivors
    # takes every other batch (4, the last pair padded), not every third with the lost rank's left
    # untrained. With rank 0 lost (RandomSampler), the order comes from the new rank 0: one order
    # on both. In epoch 1 the lost rank trained its first batch (16) and was killed before its
    # second: that batch comes first in the survivors' next pair, so they train 48 and 36, and
    # with the lost rank's 16 every one of the 100 samples is trained once
    local kill
    for kill in 1:sequential 0:random; do
        lost_rank "${kill%:*}" --sampler "${kill#*:}" || return 0 # Open MPI 5: once is enough
        assert_output --partial "the 16 samples of this epoch the lost rank(s) had not trained (1 batch(es)) are trained now"
        assert_equal "$(count "epoch 1 trained on 48 samples in 3 batches")" 1
        assert_equal "$(count "epoch 1 trained on 36 samples in 3 batches")" 1
    done
    # DataLoader workers fetch ahead: the third group (the batch of 4, the others' places padded
    # with it) was cut before the loss, the lost batch is handed out after it, padded too: 52 each
    lost_rank 1 --workers 2 || return 0
    assert_output --partial "the 16 samples of this epoch the lost rank(s) had not trained (1 batch(es)) are trained now"
    assert_equal "$(count "epoch 1 trained on 52 samples in 4 batches")" 2
    # gradient accumulation: a step's batches may have been trained before the loss, and which is
    # not known, so none is handed out, and rank 0 says so; epoch 1 cuts the rest as before
    lost_rank 1 --accumulate 2
    assert_output --partial "are not trained: the program steps once for several batches (gradient accumulation)"
    refute_output --partial "are trained now"
    assert_equal "$(count "epoch 1 trained on 36 samples in 3 batches")" 2
    # rank 0 lost between epochs: RandomSampler's order for epoch 2 comes from the rank that takes
    # its place (before, from no rank: a generator state of zeros, which libtorch refuses)
    lost_rank 0 --sampler random --kill-epoch 2
    assert_output --partial "the job lost rank 0 in step"
}

@test "scale mode at np=4, a second rank lost while the survivors list the first one's batches: said, and the two left go on as one" {
    # rank 1 killed before its second batch; rank 2 stopped as it enters the survivors' first sum
    # of the hand-out (the places still there): a place would read as lost whose batch was
    # trained, so nothing is handed out, and rank 0 says so
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_DATA_MODE=scale DPSHIM_GUARD_TIMEOUT=30 METRIC_STOP=2:1 \
        "$BUILD/bin/dpshim-run" -np 4 --oversubscribe --enable-recovery \
        env LD_PRELOAD="$BUILD/lib/libring_faults.so:$SHIM" "$T" --epochs 3 --kill 1 </dev/null
    echo "$output"
    mpirun --version | grep -q 'Open MPI) 4' || skip "Open MPI 5's mpirun does not keep the survivors"
    assert_success
    assert_output --partial "ring_faults: rank 2 stops in a dp_metric after the loss"
    assert_output --partial "another rank was lost as the survivors listed the batches the lost rank(s) had not trained: those are not trained"
    refute_output --partial "are trained now"
    for epoch in 2 3; do
        assert_equal "$(count "epoch $epoch trained on 52 samples in 4 batches")" 2
        assert_equal "$(grep "^epoch $epoch loss" <<<"$output" | sort -u | wc -l)" 1
    done
}

# pytorch/examples' cpp/mnist as a user copies it (libtorch/mnist_cnn.cpp: two convolutions, feature
# dropout and dropout, log_softmax and nll_loss, SGD at lr 0.01 with momentum 0.5, batch 64, a
# test pass after each epoch) on the first 6400 training images of Fashion-MNIST (its sampler's
# size), 2 epochs. Under mpirun it trains as alone: at np=1 bitwise (the launcher changes the rank's
# affinity and its OMPI_, PMIX_ and PRTE_ variables, nothing libtorch reads); at np=2 and 3 each
# rank draws dropout masks for its share of the batch with its share of the threads, so within
# 0.03 of alone's accuracy, every loss finite (the program asserts it at each step).
@test "pytorch/examples' MNIST CNN on Fashion-MNIST: at np=1 bitwise as alone, at np=2 and 3 trains as alone" {
    local data=/usr/share/datasets/fashion-mnist n acc alone_acc
    [ -r $data/train-images-idx3-ubyte.gz ] || skip "no Fashion-MNIST: install Debian's dataset-fashion-mnist"
    mkdir fm
    for f in $data/*-ubyte.gz; do gzip -dc "$f" >fm/"$(basename "$f" .gz)"; done
    # libtorch 2.6's convolution backward reads memory that nothing wrote: with a heap's leftovers
    # the first layer's weight gradients come out NaN now and then, alone too; blocks handed out
    # zeroed keep both runs clean (docs/libtorch.md)
    export MALLOC_PERTURB_=255
    "$BUILD/bin/mnist_cnn" fm 2 6400 >alone.txt
    grep '^Test' alone.txt >alone.test
    alone_acc=$(tail -1 alone.test | awk '{ print $NF }')
    echo "alone: $(paste -sd' ' alone.test)"
    for n in 1 2 3; do
        run mpi $n env LD_PRELOAD="$SHIM" DPSHIM_OUTPUT_STDOUT=rank0 "$BUILD/bin/mnist_cnn" fm 2 6400
        grep '^Test' <<<"$output" >np$n.test || true
        echo "np=$n: $(paste -sd' ' np$n.test)"
        assert_success
        assert_equal "$(wc -l <np$n.test)" 2
        if [ $n = 1 ]; then
            cmp alone.test np1.test
        else
            acc=$(tail -1 np$n.test | awk '{ print $NF }')
            awk -v a="$acc" -v b="$alone_acc" 'BEGIN { exit !(a - b <= 0.03 && b - a <= 0.03) }' ||
                fail "np=$n: accuracy $acc, alone $alone_acc"
        fi
    done
}

@test "a libtorch other than the one the adapter is built for: said once, and its calls run unchanged" {
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/other_libtorch_user"
    assert_success
    assert_equal "$(count "the other libtorch's SGD::step ran")" 2
    assert_equal "$(count 'the libtorch adapter is built for libtorch_cpu.so.')" 2 # the warning, the summary
    assert_output --regexp "but this process runs [^ ]*/libtorch_cpu\.so\.0\.1: its C\+\+ calls run without the adapter"
    assert_output --partial "The libtorch adapter did not run"
}

# with_adapter PLUGIN: one epoch of the trainer on 2 ranks, with the build's plugins but PLUGIN
# as the libtorch adapter (libdpshim-libtorch.so)
with_adapter() {
    local dir=$BATS_TEST_TMPDIR/plugins
    mkdir "$dir"
    ln -s "$BUILD"/lib/dpshim/* "$dir"/
    ln -sf "$1" "$dir"/libdpshim-libtorch.so
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_PLUGIN_DIR="$dir" "$T" --epochs 1
    assert_success
}

@test "a libtorch of the adapter's soname but another version: said once, and its calls run unchanged" {
    with_adapter "$BUILD/tests/adapter_for_0_1/libdpshim-libtorch.so"
    assert_equal "$(count 'libdpshim-libtorch.so is built for libtorch 0.1, but this process runs libtorch ')" 2 # warning, summary
    assert_output --regexp "runs libtorch [0-9]+\.[0-9]+: its C\+\+ calls run without the adapter; build dpshim against"
    assert_output --partial "The libtorch adapter did not run"
    assert_equal "$(count 'epoch 1 trained on 100 samples')" 2 # each rank the whole epoch, as alone
}

@test "an adapter that needs functions this libtorch lacks: said once, and its calls run unchanged" {
    with_adapter "$BUILD/tests/unfit_adapter/libdpshim-libtorch.so"
    assert_equal "$(count 'needs functions this process')" 2 # the warning, the summary
    assert_output --partial "(another version under the same soname): its C++ calls run without the adapter"
    assert_equal "$(count 'epoch 1 trained on 100 samples')" 2
}

@test "no libtorch adapter installed: the job says so at its end; a damaged description of it stops the job" {
    local dir=$BATS_TEST_TMPDIR/plugins
    mkdir "$dir"
    ln -s "$BUILD"/lib/dpshim/libdpshim-mpi.so "$dir"/
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_PLUGIN_DIR="$dir" "$T" --epochs 1
    assert_success
    assert_output --partial "no libtorch adapter is installed in $dir"
    assert_equal "$(count 'epoch 1 trained on 100 samples')" 2 # each rank the whole epoch, as alone
    ln -s "$BUILD"/lib/dpshim/libdpshim-libtorch.so "$dir"/
    printf 'libtorch_cpu.so.1.13\n' >"$dir/libdpshim-libtorch.needs" # the version line is missing
    run mpi 2 env LD_PRELOAD="$SHIM" DPSHIM_PLUGIN_DIR="$dir" "$T" --epochs 1
    assert_failure
    assert_output --partial "$dir/libdpshim-libtorch.needs is not what a build of the libtorch adapter writes"
    refute_output --partial "epoch 1 trained"
}

@test "the adapter built apart (tests/gpu/libtorch, as the GPU check builds it) serves this libdpshim.so" {
    local lt=$BATS_TEST_TMPDIR/apart
    # the adapter only: the trainer beside it is the one this build made from the same source
    cmake -S "$SRC/tests/gpu/libtorch" -B "$lt" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$lt" -j"$(nproc)" --target dpshim-libtorch >/dev/null
    mkdir "$lt/all"
    ln -s "$BUILD"/lib/dpshim/libdpshim-mpi.so "$lt"/plugins/* "$lt/all/"
    "$T" --epochs 2 >alone.txt
    run mpi 2 env DPSHIM_DIAG_LOG=info DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_PLUGIN_DIR="$lt/all" LD_PRELOAD="$SHIM" \
        "$T" --epochs 2
    assert_success
    assert_output --partial "the libtorch adapter (libtorch "
    assert_output --partial "in this process, from $lt/all/libdpshim-libtorch.so"
    assert_equal "$(count 'epoch 1 trained on 50 samples')" 2
    grep '^epoch [0-9]* loss\|^weights ' <<<"$output" >job.txt
    run python3 "$SRC/tests/gpu/libtorch/same_as_alone.py" alone.txt job.txt
    assert_success
}

# shard_run N MODE ARGS...: the trainer on N ranks with [optim] shard = MODE, lines tagged by rank.
shard_run() {
    local n=$1 mode=$2
    shift 2
    run mpi "$n" env DPSHIM_OPTIM_SHARD="$mode" DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$SHIM" "$T" "$@"
    assert_success
}

# rank_value KEY R: what rank R printed after KEY.
rank_value() { sed -n "s/^\[r$2\] $1 //p" <<<"$output"; }

# sharded_as_unsharded N MODE ARGS...: every rank's weights bitwise those of shard = off; each
# rank keeps about 1/N of the optimizer's state.
sharded_as_unsharded() {
    local n=$1 mode=$2 r hash whole
    shift 2
    shard_run "$n" off "$@"
    hash=$(rank_value weights_hash 0)
    whole=$(rank_value state_elements 0)
    shard_run "$n" "$mode" "$@"
    for r in $(seq 0 $((n - 1))); do
        assert_equal "$(rank_value weights_hash $r)" "$hash"
        [ "$(rank_value state_elements $r)" -le $((whole / n + 4)) ] ||
            fail "np=$n $*: rank $r keeps $(rank_value state_elements $r) state elements of $whole"
    done
    echo "np=$n $mode $*: bitwise; state per rank $(for r in $(seq 0 $((n - 1))); do rank_value state_elements $r; done | xargs) of $whole" >&3
}

@test "[optim] shard: Adam, AdamW, RMSprop, Adagrad (auto), SGD (on), two optimizers: bitwise unsharded, 1/N of the state" {
    local n
    # each optimizer at np=2; the uneven cut of np=3 with Adam, SGD and two optimizers
    for opt in adam adamw rmsprop adagrad; do sharded_as_unsharded 2 auto --opt $opt --hidden 40; done
    for n in 2 3; do
        sharded_as_unsharded $n on --opt sgd --hidden 40
        sharded_as_unsharded $n auto --opt adam --two --workers 2 --hidden 40
    done
    sharded_as_unsharded 3 auto --opt adam --hidden 40
    # SGD stays whole under auto; LBFGS under on too, said once
    shard_run 2 auto --opt sgd --hidden 40
    assert_equal "$(rank_value state_elements 0)" 282
    shard_run 2 on --opt lbfgs --epochs 1
    assert_equal "$(count 'LBFGS keeps every parameter on every rank')" 1
}

@test "[optim] shard: torch::save writes the whole state; it resumes alone and at np=3 as the unsharded one's" {
    local mode
    for mode in auto off; do
        mkdir "$mode"
        (cd "$mode" && run mpi 2 env DPSHIM_OPTIM_SHARD=$mode DPSHIM_FILES_RANK0_ONLY='*.pt' LD_PRELOAD="$SHIM" \
            "$T" --opt adam --hidden 40 --save ck && assert_success)
    done
    "$T" --opt adam --hidden 40 --load auto/ck --epochs 2 >alone.auto
    "$T" --opt adam --hidden 40 --load off/ck --epochs 2 >alone.off
    cmp alone.auto alone.off
    shard_run 3 auto --opt adam --hidden 40 --load auto/ck --epochs 2
    local hash=$(rank_value weights_hash 2)
    shard_run 3 off --opt adam --hidden 40 --load off/ck --epochs 2
    assert_equal "$(rank_value weights_hash 2)" "$hash"
}
