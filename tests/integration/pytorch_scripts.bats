#!/usr/bin/env bats
# Ordinary PyTorch scripts in the style of pytorch/examples (tests/integration/pytorch_scripts/:
# synthetic data, nothing of dpshim in them), each run alone and under the shim at np=2 and np=3:
# what they print, and what they save. Seeded float64 scripts must print what they print alone
# (rank 0) and the same on every rank; unseeded ones cannot match a run alone, so they must end,
# print the same on every rank, and give a sound result.
load helpers
load torch_helpers

SCRIPTS=$SRC/tests/integration/pytorch_scripts

setup_file() {
    export OMP_NUM_THREADS=1
}

# alone SCRIPT ARGS...: the script alone in $BATS_TEST_TMPDIR/alone; its stdout in alone/out.
alone() {
    local script=$1 dir=$BATS_TEST_TMPDIR/alone start=$SECONDS
    shift
    mkdir -p "$dir"
    (cd "$dir" && "$PY" "$SCRIPTS/$script" "$@" >out) || fail "$script fails alone"
    echo "$script alone: $((SECONDS - start)) s" >&3
}

# ranks N SCRIPT ARGS...: the script under the shim on N ranks in $BATS_TEST_TMPDIR/np<N>, every
# stdout line tagged with its rank ([output] stdout = prefix) and *.pt per rank; rank r's lines go
# to np<N>/out.<r>. The environment of the caller (DPSHIM_DATA_MODE, ...) passes through.
ranks() {
    local n=$1 script=$2 dir=$BATS_TEST_TMPDIR/np$1 start=$SECONDS
    shift 2
    mkdir -p "$dir"
    cd "$dir"
    run mpi "$n" env DPSHIM_OUTPUT_STDOUT=prefix DPSHIM_FILES_PER_RANK='*.pt' LD_PRELOAD="$SHIM" \
        "$PY" "$SCRIPTS/$script" "$@"
    cd - >/dev/null
    echo "$output"
    echo "$script np=$n: $((SECONDS - start)) s" >&3
    assert_success
    for r in $(seq 0 $((n - 1))); do
        sed -n "s/^\[r$r\] //p" <<<"$output" >"$dir/out.$r"
    done
    [ -s "$dir/out.0" ] || fail "rank 0 printed nothing"
}

# same_on_all_ranks N: every rank printed exactly rank 0's lines.
same_on_all_ranks() {
    local dir=$BATS_TEST_TMPDIR/np$1
    for r in $(seq 1 $(($1 - 1))); do
        diff "$dir/out.0" "$dir/out.$r" || fail "rank $r printed other lines than rank 0 at np=$1"
    done
}

# same_numbers A B: the lines of A and B are the same text with the same numbers, within a
# relative 1e-6 or one unit of the last printed digit (a value 1e-12 away may round the other way).
# Integers (counts, batch numbers) must be equal.
same_numbers() {
    "$PY" - "$1" "$2" <<'PYEOF'
import re, sys
NUM = re.compile(r'[-+]?\d+(?:\.(\d+))?(?:[eE][-+]?\d+)?')
a, b = (open(f).read().splitlines() for f in sys.argv[1:])
bad = [] if len(a) == len(b) else ["%d lines against %d" % (len(a), len(b))]
for i, (x, y) in enumerate(zip(a, b)):
    if NUM.sub('#', x) != NUM.sub('#', y):
        bad.append("line %d differs: %r / %r" % (i + 1, x, y))
        continue
    for mx, my in zip(NUM.finditer(x), NUM.finditer(y)):
        u, v = float(mx.group()), float(my.group())
        digits = max(len(mx.group(1) or ''), len(my.group(1) or ''))
        unit = 10.0 ** -digits if digits else 0.0
        if abs(u - v) > max(1e-6 * max(abs(u), abs(v)), unit * 1.000001):
            bad.append("line %d: %s against %s: %r / %r" % (i + 1, mx.group(), my.group(), x, y))
print("\n".join(bad))
sys.exit(1 if bad else 0)
PYEOF
}

# saved_equal N FILE: rank 0's FILE (saved per rank) within 1e-9 of the one saved alone, and every
# rank's bitwise rank 0's.
saved_equal() {
    local stem=${2%.pt} dir=$BATS_TEST_TMPDIR
    saved_same "$1" "$2" 1e-9 "$dir/alone/$2" "$dir/np$1/$stem.rank0.pt"
}

# saved_same N FILE [TOL A B]...: every rank saved bitwise rank 0's FILE (and assert_rels of the
# triples given).
saved_same() {
    local stem=${2%.pt} dir=$BATS_TEST_TMPDIR/np$1 n=$1 k
    shift 2
    for k in $(seq 1 $((n - 1))); do
        set -- "$@" bitwise "$dir/$stem.rank0.pt" "$dir/$stem.rank$k.pt"
    done
    assert_rels "$@"
}

# seeded SCRIPT [SAVED]: alone, then np=2 and np=3: rank 0 prints alone's lines (same_numbers),
# every rank the same lines, and SAVED (if given) is alone's within 1e-9 on every rank.
seeded() {
    alone "$1"
    for n in 2 3; do
        ranks "$n" "$1"
        same_numbers "$BATS_TEST_TMPDIR/alone/out" "$BATS_TEST_TMPDIR/np$n/out.0" ||
            fail "np=$n: rank 0 printed other numbers than the run alone"
        same_on_all_ranks "$n"
        [ -z "${2:-}" ] || saved_equal "$n" "$2"
    done
}

@test "regression, unseeded, stopped by its own loss.item() read before backward: ends with the target learned" {
    # pytorch/examples' regression/main.py: target and batches from torch's global generator,
    # never seeded. Every rank must draw rank 0's target and batches (so loss.item(), read before
    # backward, is the same everywhere), or the averaged gradients chase the mean of the ranks'
    # targets, no rank's loss falls below 1e-3 and the job never ends (the timeout fails it).
    local MPI_TIMEOUT=90
    alone regression.py
    cat "$BATS_TEST_TMPDIR/alone/out"
    for n in 2 3; do
        ranks "$n" regression.py
        same_on_all_ranks "$n"
        "$PY" - "$BATS_TEST_TMPDIR/alone/out" "$BATS_TEST_TMPDIR/np$n/out.0" <<'PYEOF' || fail "np=$n: unsound result"
import re, sys
for f in sys.argv[1:]:
    text = open(f).read()
    loss, batches = re.search(r'Loss: (\S+) after (\d+) batches', text).groups()
    coef = lambda name: [float(c) for c in re.findall(r'([-+]\d+\.\d+)', re.search(name + r'.*', text).group())]
    learned, actual = coef('Learned function'), coef('Actual function')
    print(f, 'loss', loss, 'batches', batches, 'worst coefficient error', max(abs(a - b) for a, b in zip(learned, actual)))
    # alone it takes 150-900 batches (20 runs here), whatever the target
    assert float(loss) < 1e-3 and 20 <= int(batches) <= 5000, (loss, batches)
    assert len(learned) == len(actual) == 5 and all(abs(a - b) <= 0.5 for a, b in zip(learned, actual)), (learned, actual)
PYEOF
    done
}

@test "MNIST-style evaluation loops: validation and test sets are counted whole on every rank" {
    # seeded, float64, SGD with momentum, a shuffling DataLoader; the validation pass each epoch
    # and the test pass sum loss.item() and correct predictions over loaders under no_grad in eval
    # mode, and divide by len(dataset): sharded, each rank would count its part only
    seeded mnist_eval.py
    grep -q 'Test set: Average loss: .*, Accuracy: [0-9]*/250 ' "$BATS_TEST_TMPDIR/np3/out.0"
}

@test "an inference-only script: scores the whole set on every rank as alone, and says nothing was distributed" {
    # a model in eval mode scoring a DataLoader under no_grad: each rank prints what it prints
    # alone, and rank 0 says once, at the default log level, that no work was shared out
    seeded inference.py
    assert_equal "$(count "nothing was distributed in this job of 3 ranks")" 1
    assert_output --partial "The script only evaluated or ran inference (10 DataLoader batches"
    assert_output --partial "[data] eval = sharded shares it out"
    # sharded, each rank scores its share: work was shared out, and the warning is not given
    DPSHIM_DATA_EVAL=sharded ranks 2 inference.py
    refute_output --partial "nothing was distributed"
}

@test "MNIST-style evaluation loops in scale mode: training takes 1/N of each epoch, evaluation the whole set" {
    for n in 2 3; do
        DPSHIM_DATA_MODE=scale ranks "$n" mnist_eval.py
        same_on_all_ranks "$n"
        # 512 samples in batches of 32: 16 batches alone, 8 (np=2) or 6 (np=3, 171 samples) per rank
        local want=$((n == 2 ? 8 : 6))
        assert_equal "$(grep -c "^Train Epoch: 2 \[.*/$want (" "$BATS_TEST_TMPDIR/np$n/out.0")" 2
        assert_equal "$(grep -c '^Validation set: .*Accuracy: [0-9]*/150 ' "$BATS_TEST_TMPDIR/np$n/out.0")" 2
        # a classifier trained on this data gets well over chance (10%) on the whole test set
        acc=$(sed -n 's/^Test set: .*Accuracy: \([0-9]*\)\/250 .*/\1/p' "$BATS_TEST_TMPDIR/np$n/out.0")
        echo "np=$n scale: test accuracy $acc/250" >&3
        assert_le 50 "$acc"
    done
}

@test "early stopping on the validation loss: the same epochs, best.pt and test loss as alone" {
    # each rank's own share of the validation set would give each its own best epoch and stop
    seeded early_stopping.py best.pt
    grep -q '^early stop at epoch' "$BATS_TEST_TMPDIR/alone/out" || fail "the script no longer stops early"
}

@test "unseeded: seeds from random, the clock and the pid, numpy data and noise, Dropout: the same on every rank" {
    # every rank must take rank 0's seeds (Python's random, torch, numpy's legacy generator), so
    # all draw the same data; the weights, with Dropout, must stay identical
    alone unseeded_dropout.py
    for n in 2 3; do
        ranks "$n" unseeded_dropout.py
        same_on_all_ranks "$n"
        saved_same "$n" model.pt
        # sound: the validation loss falls, and most of the validation set is classified right
        # (alone, 84-97 of 100 after 5 epochs; chance is 50)
        first=$(sed -n 's/^initial val loss \([0-9.]*\),.*/\1/p' "$BATS_TEST_TMPDIR/np$n/out.0")
        last=$(sed -n 's/^epoch 5 train loss .* val loss \([0-9.]*\),.*/\1/p' "$BATS_TEST_TMPDIR/np$n/out.0")
        correct=$(sed -n 's/^epoch 5 .*, \([0-9]*\) correct$/\1/p' "$BATS_TEST_TMPDIR/np$n/out.0")
        echo "np=$n: val loss $first -> $last, $correct/100 correct" >&3
        [ -n "$first" ] && [ -n "$last" ] && [ -n "$correct" ] || fail "np=$n: no losses or count printed"
        assert_le "$last" "$first"
        assert_le 70 "$correct"
    done
}

@test "LBFGS with a closure that prints loss.item() before backward: alone's lines and weights" {
    # the closure's print comes before backward: the criterion's value must be the global batch's
    seeded lbfgs.py model.pt
}

@test "word language model: LSTM, bptt chunks, detached hidden state, clipping, SGD by hand, perplexity" {
    seeded word_language_model.py model.pt
}

@test "word language model in float32, batches made by hand: every rank trains bitwise the model alone trains" {
    # the mean of 3 equal float32 gradients summed in float32 is the gradient only to an ulp
    # (3g rounds), and SGD amplifies it: pytorch/examples' model trained another model at np=3
    alone word_language_model_f32.py
    for n in 3 4; do
        ranks "$n" word_language_model_f32.py
        diff "$BATS_TEST_TMPDIR/alone/out" "$BATS_TEST_TMPDIR/np$n/out.0" || fail "np=$n: other losses than alone"
        same_on_all_ranks "$n"
        assert_equal "$(rel "$BATS_TEST_TMPDIR/alone/model.pt" "$BATS_TEST_TMPDIR/np$n/model.rank0.pt")" bitwise
        saved_same "$n" model.pt
    done
}

# summary_lines DIR FILE: the "====>" lines (epoch averages and test losses) of DIR/FILE.
summary_lines() { grep '====>' "$1/$2" >"$1/$2.summary"; }

@test "VAE, a loss summed over the batch plus a KL term by hand: alone's averages and weights, no setting" {
    # pytorch/examples' vae/main.py: binary_cross_entropy(reduction='sum') + a torch.sum term; its
    # "Average loss" sums loss.item() over its own batches and divides by the data set's length.
    # Averaged gradients were half the summed ones (np=2), and "Average loss" half alone's.
    local d=$BATS_TEST_TMPDIR
    alone vae_summed.py
    summary_lines "$d/alone" out
    for n in 2 3; do
        ranks "$n" vae_summed.py
        for r in $(seq 0 $((n - 1))); do
            summary_lines "$d/np$n" "out.$r"
            same_numbers "$d/alone/out.summary" "$d/np$n/out.$r.summary" || fail "np=$n rank $r: other averages than alone"
        done
        saved_equal "$n" model.pt
        assert_output --partial "taken to be sums over the batch"
    done
    # [comm] reduce = sum gave 2x the average (the loss's value summed the global sum again)
    DPSHIM_COMM_REDUCE=sum ranks 2 vae_summed.py
    summary_lines "$d/np2" out.0
    same_numbers "$d/alone/out.summary" "$d/np2/out.0.summary" || fail "[comm] reduce = sum: other averages than alone"
    saved_equal 2 model.pt
}

@test "a summed loss divided by the batch's length before backward is averaged as a mean: alone's weights" {
    # summing the ranks' gradients of sum/len(share) gave N times alone's gradient (SGD shows it)
    local d=$BATS_TEST_TMPDIR
    alone vae_summed.py --per-sample
    grep 'Test set loss' "$d/alone/out" >"$d/alone/test"
    for n in 2 3; do
        ranks "$n" vae_summed.py --per-sample
        assert_equal "$(count "scales binary_cross_entropy at vae_summed.py:43 in loss_function (reduction='sum') before backward")" 1
        grep 'Test set loss' "$d/np$n/out.0" >"$d/np$n/test"
        same_numbers "$d/alone/test" "$d/np$n/test" || fail "np=$n: other test losses than alone"
        saved_equal "$n" model.pt
    done
}

@test "a step mixing summed and mean losses is told once, naming both calls" {
    ranks 2 vae_summed.py --mixed
    assert_equal "$(count "mixes losses summed over the batch (binary_cross_entropy at vae_summed.py:43 in loss_function) with means (mse_loss at vae_summed.py:46 in loss_function)")" 1
}

@test "torch.multiprocessing: a spawned process, a Pool and DataLoader workers beside a data-parallel rank" {
    # the children are not ranks: the Pool runs a module's forward, the spawned process fills a
    # shared tensor; the rank process must still train as alone (test set counted whole)
    seeded multiprocessing_workers.py model.pt
}

# ddp N [ENV...]: train_ddp.py on N ranks with ENV (the shim or not), weights to $BATS_TEST_TMPDIR/ddp<tag>.pt
ddp() {
    local n=$1 tag=$2
    shift 2
    cd "$BATS_TEST_TMPDIR"
    run mpi "$n" env MASTER_PORT=$((20000 + RANDOM % 20000)) DPSHIM_OUTPUT_STDOUT=rank0 "$@" \
        "$PY" "$SCRIPTS/train_ddp.py" --out "$BATS_TEST_TMPDIR/ddp$tag.pt"
    cd - >/dev/null
    echo "$output"
    assert_success
}

@test "a script that distributes itself (gloo, DistributedSampler, DDP): dpshim steps aside, weights bitwise DDP's" {
    for n in 2 3; do
        ddp $n alone$n
        local seen_alone
        seen_alone=$(grep -o "samples seen by this rank [0-9]*" <<<"$output" | head -1)
        ddp $n shim$n LD_PRELOAD="$SHIM"
        # said at the default log level, once for the job
        assert_equal "$(count "[dpshim r0/$n] NOTE the script distributes itself (torch.distributed.init_process_group (backend gloo))")" 1
        assert_equal "$(count "NOTE the script distributes itself")" 1
        assert_output --partial "; dpshim stepped aside: the script distributes itself (torch.distributed.init_process_group (backend gloo))"
        refute_output --partial "nothing was distributed"
        # the DistributedSampler's share, not a share of it
        assert_output --partial "$seen_alone"
        assert_equal "$(rel "$BATS_TEST_TMPDIR/ddpalone$n.pt" "$BATS_TEST_TMPDIR/ddpshim$n.pt")" bitwise
    done
}
