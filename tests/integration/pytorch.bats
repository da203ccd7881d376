#!/usr/bin/env bats
# Unmodified PyTorch scripts (Debian's python3-torch): examples/pytorch/train_fmnist.py (Conv2d,
# BatchNorm, Linear, Adadelta + StepLR, a shuffling DataLoader over torchvision's FashionMNIST,
# torch.save) under the shim, against the same script run alone.
load helpers
load torch_helpers

SCRIPT=$SRC/examples/pytorch/train_fmnist.py

setup_file() {
    export DATA=$BATS_FILE_TMPDIR/tv
    mkdir -p "$DATA/FashionMNIST/raw" # torchvision's layout, from Debian's dataset files
    for f in /usr/share/datasets/fashion-mnist/*.gz; do
        gunzip -c "$f" >"$DATA/FashionMNIST/raw/$(basename "$f" .gz)"
    done
    export OMP_NUM_THREADS=1
}

# torch_np N DIR ARGS...: the script on N ranks with the shim, in DIR.
torch_np() {
    local n=$1 dir=$2
    shift 2
    mkdir -p "$dir"
    (cd "$dir" && mpi "$n" env LD_PRELOAD="$SHIM" "$PY" "$SCRIPT" --data "$DATA" --no-eval "$@")
}

# equal_alone N ARGS...: rank 0's weights after the run on N ranks vs the run alone, within 1e-9.
equal_alone() {
    local n=$1
    shift
    (cd "$BATS_TEST_TMPDIR" && "$PY" "$SCRIPT" --data "$DATA" --no-eval --double --save alone.pt "$@") >/dev/null
    DPSHIM_FILES_RANK0_ONLY='*.pt' run torch_np "$n" "$BATS_TEST_TMPDIR/np$n" --double --save model.pt "$@"
    assert_success
    r=$(rel "$BATS_TEST_TMPDIR/alone.pt" "$BATS_TEST_TMPDIR/np$n/model.pt")
    echo "np=$n rel=$r" >&3
    [ "$r" = bitwise ] || assert_le "$r" 1e-9
}

@test "float64, np=2: 12 steps equal the run alone within 1e-9" { equal_alone 2 --steps 12; }

@test "float64, np=3, 2 DataLoader workers per rank: 21 steps with a short last batch equal the run alone" {
    # 992 samples in batches of 48: shares 16/16/16, and 11/11/10 of the last 32; the workers
    # fetch ahead (4 batches), the weights must still follow the batch the loop is on
    equal_alone 3 --workers 2 --train-limit 992 --batch-size 48
}

@test "float64, np=3: a last batch with fewer samples than ranks (2) is taken whole by every rank, weighted 1/3" {
    equal_alone 3 --train-limit 962 --batch-size 48
}

@test "float64, np=2: gradient clipping between backward and step sees the global gradient" {
    equal_alone 2 --steps 12 --clip 0.05
}

@test "an IterableDataset loader (no sampler to shard) runs as it would alone" {
    run mpi 2 env LD_PRELOAD="$SHIM" "$PY" -c '
import torch
class Numbers(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))
import sys
# one write per line: unbuffered, print writes the number and the newline apart, and the
# launcher can merge the line of the other rank in between
sys.stdout.write("%d\n" % sum(int(b.sum()) for b in torch.utils.data.DataLoader(Numbers(), batch_size=4)))'
    assert_success
    assert_equal "$(grep -cx 45 <<<"$output")" 2
    # no training, nothing shared out: rank 0 says so at exit
    assert_equal "$(grep -c '^\[dpshim r0/2\] WARN' <<<"$output")" 1
    assert_output --partial "nothing was distributed in this job of 2 ranks"
    assert_output --partial "; no work was shared out (see the warning above); more:" # the summary says it too
}

@test "float32, np=2: one checkpoint, one copy of the prints, the loss falls" {
    local dir=$BATS_TEST_TMPDIR/run
    DPSHIM_FILES_RANK0_ONLY='*.pt' DPSHIM_OUTPUT_STDOUT=rank0 run torch_np 2 "$dir" --steps 100 --save model.pt
    echo "$output"
    assert_success
    assert_equal "$(count 'step 100: ')" 1
    assert_equal "$(count 'epoch 1: 100 batches of 938')" 1
    assert_equal "$(ls "$dir")" model.pt
    # the mean loss of the 100 steps, against ln 10 = 2.30 untrained (alone: 0.88-0.91)
    loss=$(sed -n 's/^epoch 1: .*, mean loss \([0-9.]*\)$/\1/p' <<<"$output")
    [ -n "$loss" ] || fail "no mean loss printed"
    assert_le "$loss" 1.5
}

@test "Dropout: trains, and the drift check finds every rank identical" {
    DPSHIM_FILES_PER_RANK='*.pt' DPSHIM_GUARD_DRIFT_EVERY=10 run torch_np 2 "$BATS_TEST_TMPDIR" --dropout --steps 30 --save m.pt
    echo "$output"
    assert_success
    assert_equal "$(rel "$BATS_TEST_TMPDIR/m.rank0.pt" "$BATS_TEST_TMPDIR/m.rank1.pt")" bitwise
}

@test "ranks that start from different seeds are made identical by the first forward" {
    # --seed differs per rank: the broadcast from rank 0 must win
    run mpi 2 sh -c 'cd "$1" && exec env LD_PRELOAD="$2" DPSHIM_FILES_PER_RANK="*.pt" "$3" "$4" --data "$5" \
        --no-eval --steps 1 --lr 0 --seed $((OMPI_COMM_WORLD_RANK + 5)) --save m.pt' \
        sh "$BATS_TEST_TMPDIR" "$SHIM" "$PY" "$SCRIPT" "$DATA"
    assert_success
    assert_equal "$(rel "$BATS_TEST_TMPDIR/m.rank0.pt" "$BATS_TEST_TMPDIR/m.rank1.pt")" bitwise
}

@test "scale mode: each rank takes half of each epoch" {
    DPSHIM_DATA_MODE=scale DPSHIM_OUTPUT_STDOUT=rank0 run torch_np 2 "$BATS_TEST_TMPDIR" --train-limit 1000 --epochs 2
    echo "$output"
    assert_success
    # 1000 samples: 500 per rank, 8 batches of 64 (the last of 52)
    assert_line --partial "epoch 1: 8 batches of 8"
    assert_line --partial "epoch 2: 8 batches of 8"
}

@test "world size 1: bitwise the run alone" {
    (cd "$BATS_TEST_TMPDIR" && "$PY" "$SCRIPT" --data "$DATA" --no-eval --steps 20 --save alone.pt) >/dev/null
    run torch_np 1 "$BATS_TEST_TMPDIR/one" --steps 20 --save model.pt
    assert_success
    assert_equal "$(rel "$BATS_TEST_TMPDIR/alone.pt" "$BATS_TEST_TMPDIR/one/model.pt")" bitwise
}

@test "a Python script without torch runs as before: environment and path restored, torch never loaded" {
    mkdir -p "$BATS_TEST_TMPDIR/site"
    echo 'print("user sitecustomize ran")' >"$BATS_TEST_TMPDIR/site/sitecustomize.py"
    run mpi 2 env PYTHONPATH="$BATS_TEST_TMPDIR/site" LD_PRELOAD="$SHIM" "$PY" -c '
import os, sys
on_path = any(os.path.exists(os.path.join(p, "dpshim_pytorch", "__init__.py")) for p in sys.path)
print("PYTHONPATH=%s torch=%s adapter-on-path=%s." % (os.environ.get("PYTHONPATH"), "torch" in sys.modules, on_path))'
    echo "$output"
    assert_success
    assert_equal "$(count 'user sitecustomize ran')" 2
    assert_equal "$(count "PYTHONPATH=$BATS_TEST_TMPDIR/site torch=False adapter-on-path=False.")" 2
    run mpi 1 --bind-to none env LD_PRELOAD="$SHIM" "$PY" -c 'import os; print("PYTHONPATH", os.environ.get("PYTHONPATH"))'
    assert_output "PYTHONPATH None"
}

@test "a program that is not Python gets no adapter; [adapters] python = off keeps it out of Python" {
    # --bind-to none: at np=1 mpirun's default binding would get rank 0's placement warning
    run mpi 1 --bind-to none env LD_PRELOAD="$SHIM" sh -c 'echo "PYTHONPATH=${PYTHONPATH-unset}"'
    assert_output "PYTHONPATH=unset"
    run mpi 1 --bind-to none env DPSHIM_ADAPTERS_PYTHON=off LD_PRELOAD="$SHIM" "$PY" -c 'import sys; print(sys.modules.get("dpshim_pytorch"))'
    assert_output "None"
}

# tests/integration/pytorch_cases/*.py: small float64 scripts of what user scripts do (synthetic
# data). pytorch_case: the ones that save m.pt, alone vs. np=2 and np=3: rank 0 within 1e-9, all
# ranks bitwise equal. The others are run by tests of their own further down.
pytorch_case() {
    local script=$SRC/tests/integration/pytorch_cases/$1.py dir=$BATS_TEST_TMPDIR
    local saved=()
    mkdir -p "$dir/alone"
    (cd "$dir/alone" && "$PY" "$script") || fail "$1 fails alone"
    for n in 2 3; do
        mkdir -p "$dir/np$n"
        cd "$dir/np$n" && run mpi "$n" env DPSHIM_FILES_PER_RANK='*.pt' LD_PRELOAD="$SHIM" "$PY" "$script"
        cd - >/dev/null
        echo "$output"
        assert_success
        # rank 0's model within 1e-9 of the run alone's, every rank's bitwise rank 0's
        saved+=(1e-9 "$dir/alone/m.pt" "$dir/np$n/m.rank0.pt")
        for k in $(seq 1 $((n - 1))); do
            saved+=(bitwise "$dir/np$n/m.rank0.pt" "$dir/np$n/m.rank$k.pt")
        done
    done
    assert_rels "${saved[@]}"
}

@test "gradient accumulation over 3 backward passes" { pytorch_case accumulation; }
@test "two optimizers over disjoint parameters" { pytorch_case two_optimizers; }
@test "a fresh model per learning rate, each in the memory of the last on some ranks" { pytorch_case fresh_models; }
@test "per-sample losses (reduction none) weighted by hand, shares of one sample" { pytorch_case per_sample_loss; }
@test "a loss of shape [1] added up by hand drives ReduceLROnPlateau" { pytorch_case loss_of_shape_one; }
@test "a sweep of trainers that refer to themselves, collected at different times on the ranks" { pytorch_case cyclic_trainer; }
@test "datasets that seed per sample (torchvision's FakeData), fetched in the loop's process" {
    pytorch_case seeded_dataset
    # the seeding of each rank's own samples leaves the generators the ranks draw from after it alike
    cd "$BATS_TEST_TMPDIR"
    assert_rels bitwise np2/draws.rank0.pt np2/draws.rank1.pt bitwise np3/draws.rank0.pt np3/draws.rank2.pt
}
@test "passes left early over a loader shuffled by the script's own generator" { pytorch_case pass_left_early; }
@test "draws sized by unequal shares, then a choice per step: every rank makes the same choices" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 3 env DPSHIM_FILES_PER_RANK='*.pt' LD_PRELOAD="$SHIM" "$PY" "$SRC/tests/integration/pytorch_cases/uneven_share_draws.py"
    assert_success
    assert_rels bitwise m.rank0.pt m.rank1.pt bitwise m.rank0.pt m.rank2.pt
    assert_equal "$(grep -c "WARN after step 1 the ranks' random generators differed" <<<"$output")" 1
    # shares of equal sizes (np=2) draw alike: nothing to set right, nothing said
    run mpi 2 env DPSHIM_FILES_PER_RANK='*.pt' LD_PRELOAD="$SHIM" "$PY" "$SRC/tests/integration/pytorch_cases/uneven_share_draws.py"
    assert_success
    refute_output --partial "random generators differed"
}

@test "scale mode: a sweep of trainers that refer to themselves counts the same steps per epoch on every rank" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_DATA_MODE=scale DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$SHIM" "$PY" \
        "$SRC/tests/integration/pytorch_cases/cyclic_trainer.py"
    echo "$output"
    assert_success
    # 96 samples, batches of 24: 2 steps for each rank's half of the epoch
    assert_equal "$(grep -c '^\[r[01]\] steps 2$' <<<"$output")" 6
}
@test "LBFGS with a strong-Wolfe line search (the loss value is the global batch's)" { pytorch_case lbfgs_strong_wolfe; }
@test "ReduceLROnPlateau fed with loss.item()" { pytorch_case plateau_scheduler; }
@test "a parameter outside any module, initialized differently per rank" { pytorch_case parameter_outside_modules; }
@test "an update written by hand, without torch.optim" { pytorch_case update_by_hand; }
@test "BatchNorm without running statistics, in eval mode too" { pytorch_case batchnorm_without_running_stats; }
@test "BatchNorm with momentum=None and steps in eval mode" { pytorch_case batchnorm_eval_and_momentum_none; }

# the PyTorch adapter's BatchNorm against its reference formulas (bn_reference in helpers.bash)
BN_REFERENCE=("$PY" "$SRC/tests/integration/bn_reference.py")

@test "synchronized BatchNorm, np=2 and 3: bitwise its reference formulas over shapes, dtypes and layouts" {
    bn_reference_np23
}
@test "synchronized BatchNorm: PyTorch's ops where its kernels round otherwise or run on more threads, same bits" {
    bn_reference_ops
}
@test "a branch used on some steps only" { pytorch_case conditional_branch; }
@test "a non-contiguous parameter with the drift check at every step: no false alarm" {
    DPSHIM_GUARD_DRIFT_EVERY=1 pytorch_case non_contiguous_parameter
}

# case_np N SCRIPT [ENV...]: a script of pytorch_cases/ on N ranks, each line tagged [rK].
case_np() {
    local n=$1 script=$SRC/tests/integration/pytorch_cases/$2.py
    shift 2
    mkdir -p "$BATS_TEST_TMPDIR/np$n"
    cd "$BATS_TEST_TMPDIR/np$n" && run mpi "$n" env DPSHIM_OUTPUT_STDOUT=prefix DPSHIM_FILES_PER_RANK='*.pt' "$@" \
        LD_PRELOAD="$SHIM" "$PY" "$script"
    cd - >/dev/null
}

# guard_ends N CASE: the case on N ranks, ended by the guard (status 75) within 30 s.
guard_ends() {
    SECONDS=0
    case_np "$1" "$2"
    assert_equal "$status" 75
    [ "$SECONDS" -le 30 ] || fail "took $SECONDS s"
}

# lines_of RANK: that rank's lines, untagged, in order.
lines_of() { sed -n "s/^\[r$1\] //p" <<<"$output"; }

@test "random state: every rank draws what rank 0 draws, whatever the script seeds with (pid, None, torch.seed, constants)" {
    alone=$(cd "$BATS_TEST_TMPDIR" && "$PY" "$SRC/tests/integration/pytorch_cases/random_state.py")
    for n in 2 3; do
        case_np "$n" random_state
        assert_success
        for k in $(seq 1 $((n - 1))); do
            assert_equal "$(lines_of "$k")" "$(lines_of 0)"
        done
        # a constant seed is the script's own: the draws after it are those of the run alone
        assert_equal "$(lines_of 0 | grep '^constant seeds')" "$(grep '^constant seeds' <<<"$alone")"
        assert_equal "$(lines_of 0 | grep -c .)" 6
    done
}

@test "Python's string hashes: one seed for every rank of a job, another for the next job, the user's kept" {
    case_np 2 hash_order
    assert_success
    assert_equal "$(lines_of 1)" "$(lines_of 0)"
    assert_output --partial "child hashes like a program alone: True"
    local first=$(lines_of 0 | grep '^vocabulary')
    case_np 2 hash_order
    assert_success
    assert_equal "$(lines_of 1)" "$(lines_of 0)"
    # a new job, a new seed: as random from run to run as alone (26 words: orders repeat by chance
    # far less often than once in a million runs)
    [ "$(lines_of 0 | grep '^vocabulary')" != "$first" ] || fail "two jobs hashed alike: $first"
    # the user's own seed is the job's
    case_np 3 hash_order PYTHONHASHSEED=7
    assert_success
    assert_equal "$(lines_of 0 | grep '^vocabulary')" "$(PYTHONHASHSEED=7 "$PY" "$SRC/tests/integration/pytorch_cases/hash_order.py" | grep '^vocabulary')"
    # ... and one that differs between ranks stops every rank
    cd "$BATS_TEST_TMPDIR" && run mpi 2 sh -c 'PYTHONHASHSEED=$OMPI_COMM_WORLD_RANK exec env LD_PRELOAD="$1" "$2" "$3"' \
        sh "$SHIM" "$PY" "$SRC/tests/integration/pytorch_cases/hash_order.py"
    assert_failure
    assert_output --partial "PYTHONHASHSEED differs between ranks"
    refute_output --partial "vocabulary"
}

@test "evaluation passes take the whole data set on every rank: each rank prints what the run alone prints" {
    local saved=()
    alone=$(cd "$BATS_TEST_TMPDIR" && "$PY" "$SRC/tests/integration/pytorch_cases/evaluation_passes.py")
    for n in 2 3; do
        case_np "$n" evaluation_passes
        assert_success
        for k in $(seq 0 $((n - 1))); do
            # every evaluation line is alone's
            assert_equal "$(lines_of "$k" | grep -v 'trained on')" "$(grep -v 'trained on' <<<"$alone")"
        done
        # training is sharded: the ranks' shares of each epoch's 90 samples add up to 90; so is
        # fine-tuning in eval mode once a pass over its loader ran backward
        for e in "epoch 0" "fine-tuning epoch 1"; do
            assert_equal "$(sed -n "s/^\[r[0-9]*\] $e: trained on \([0-9]*\) samples here$/\1/p" <<<"$output" |
                awk '{ s += $1; k++ } END { print k, s }')" "$n 90"
        done
        saved+=(1e-9 "$BATS_TEST_TMPDIR/m.pt" "$BATS_TEST_TMPDIR/np$n/m.rank0.pt")
    done
    assert_rels "${saved[@]}"
}

@test "[data] eval = sharded: evaluation passes are sharded as training is" {
    case_np 2 evaluation_passes DPSHIM_DATA_EVAL=sharded
    assert_success
    # 33 validation samples in batches of 8: 4 + 4 + 4 + 4 each, and the last sample on both
    assert_equal "$(lines_of 0 | grep -c '^validation under no_grad: 17 samples')" 2
    assert_equal "$(lines_of 1 | grep -c '^the training loader under no_grad: 45 samples')" 2
}

@test "a branch only one rank takes: the job ends at the first differing call, naming each rank's script line" {
    guard_ends 2 rank_dependent_branch
    assert_output --partial "desync: the ranks are about to make different collective calls"
    assert_output --regexp "rank 1 \([^)]*\): dp_grads \(all-reduce f64 x 1\), collective #[0-9]+ after step 2, from rank_dependent_branch.py:12 in <module>"
    # batches made by hand go as float64 (the mean of equal float32 gradients is exact there)
    assert_output --regexp "rank 0 \([^)]*\): dp_grads \(all-reduce f64 x 7 in 3 tensors: 4, 1, 2\), collective #[0-9]+ after step 3, from rank_dependent_branch.py:9 in <module>"
}

@test "[comm] overlap = on: gradients reduced in the background during backward, weights bitwise those without" {
    for ov in off on; do
        DPSHIM_COMM_OVERLAP=$ov DPSHIM_DIAG_DIR=$BATS_TEST_TMPDIR/diag-$ov DPSHIM_FILES_RANK0_ONLY='*.pt' \
            run torch_np 2 "$BATS_TEST_TMPDIR" --double --steps 20 --save $ov.pt
        assert_success
    done
    assert_equal "$(rel "$BATS_TEST_TMPDIR/off.pt" "$BATS_TEST_TMPDIR/on.pt")" bitwise
    assert_equal "$(sed -n 's/^bg_collectives //p' "$BATS_TEST_TMPDIR/diag-off/stats.rank0.txt")" 0
    [ "$(sed -n 's/^bg_collectives //p' "$BATS_TEST_TMPDIR/diag-on/stats.rank0.txt")" -ge 20 ] || fail "no background reductions"
}

@test "[comm] overlap = on, a backward that reaches other parameters on one rank: a desync, not wrong weights" {
    case_np 2 branch_on_one_rank DPSHIM_COMM_OVERLAP=on
    assert_equal "$status" 75
    assert_output --partial "desync: the ranks are about to make different collective calls"
    # without overlap the parameter this rank's backward missed gets zeros: the job runs
    case_np 2 branch_on_one_rank DPSHIM_COMM_OVERLAP=off
    assert_success
    assert_equal "$(lines_of 0)" "$(lines_of 1)"
}

@test "one backward more on one rank while rank 0 finishes: the job ends at once (not after [guard] timeout), naming who left" {
    guard_ends 2 extra_backward_on_one_rank
    assert_output --partial "rank 0 left the program after step 0"
    assert_output --regexp "rank 0 \([^)]*\): left the program \(exit\) after step 0 and collective #[0-9]+  <-- culprit"
}
