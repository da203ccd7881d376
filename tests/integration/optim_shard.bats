#!/usr/bin/env bats
# [optim] shard: each rank steps the optimizer for its share of the parameters. The same
# script with sharding off and on must leave every rank with bitwise the same parameters and
# the same optimizer state_dict() (the bytes torch.save writes), with each rank holding about
# 1/N of the optimizer's state; checkpoints load at another world size and alone.
load helpers
load torch_helpers

SCRIPT=$SRC/tests/integration/optim/shard.py

setup_file() {
    export OMP_NUM_THREADS=1
}

# shard N MODE ARGS...: the script on N ranks with [optim] shard = MODE, every line tagged with
# its rank; checkpoints (*.pt) written by rank 0 only.
shard() {
    local n=$1 mode=$2
    shift 2
    cd "$BATS_TEST_TMPDIR"
    run mpi "$n" env DPSHIM_OPTIM_SHARD="$mode" DPSHIM_OUTPUT_STDOUT=prefix DPSHIM_FILES_RANK0_ONLY='*.pt' \
        LD_PRELOAD="$SHIM" "$PY" "$SCRIPT" "$@"
    cd - >/dev/null
    echo "$output"
}

# value KEY RANK: what rank RANK printed after KEY.
value() { sed -n "s/^\[r$2\] $1 //p" <<<"$output"; }

# same_everywhere N KEY: every rank printed one and the same value for KEY; it is printed.
same_everywhere() {
    local values
    values=$(for r in $(seq 0 $(($1 - 1))); do value "$2" $r; done | sort -u)
    [ "$(wc -l <<<"$values")" = 1 ] && [ -n "$values" ] || fail "ranks differ in $2: $values"
    echo "$values"
}

# equal_to_unsharded N OPTS ARGS...: shard.py --opt OPTS ARGS on N ranks: for each of the
# optimizers OPTS (a comma-separated list, trained in turn in one run), params and state_dict
# bitwise those of shard = off on every rank; each rank's own optimizer state at most 1/N of the
# unsharded one (and a few scalars).
equal_to_unsharded() {
    local n=$1 opts=$2 opt tag several=
    shift 2
    [[ $opts != *,* ]] || several=1 # then each line starts with its optimizer's name
    local -A params state whole
    shard "$n" off --opt "$opts" "$@"
    assert_success
    for opt in ${opts//,/ }; do
        tag=${several:+$opt }
        params[$opt]=$(same_everywhere "$n" "${tag}params")
        state[$opt]=$(same_everywhere "$n" "${tag}state")
        whole[$opt]=$(same_everywhere "$n" "${tag}state_elements")
    done
    shard "$n" on --opt "$opts" "$@"
    assert_success
    for opt in ${opts//,/ }; do
        tag=${several:+$opt }
        [ "$(same_everywhere "$n" "${tag}params")" = "${params[$opt]}" ] ||
            fail "np=$n $opt $*: parameters differ from shard = off"
        [ "$(same_everywhere "$n" "${tag}state")" = "${state[$opt]}" ] ||
            fail "np=$n $opt $*: state_dict differs from shard = off"
        local r mine per_rank=()
        for r in $(seq 0 $((n - 1))); do
            mine=$(value "${tag}state_elements" $r)
            [ "$mine" -le $((whole[$opt] / n + 32)) ] ||
                fail "np=$n $opt $*: rank $r keeps $mine state elements of ${whole[$opt]}"
            per_rank+=("$mine")
        done
        echo "np=$n $opt${*:+ $*}: bitwise; state elements per rank ${per_rank[*]} of ${whole[$opt]}" >&3
    done
}

@test "Adam and SGD with momentum at np=2, 3 and 4: bitwise the unsharded step, 1/N of the state" {
    for n in 2 3 4; do
        equal_to_unsharded $n adam,sgd
    done
}

@test "AdamW (amsgrad), RMSprop (centered), Adagrad, two groups with a scheduler, a closure, at np=2 and 3; groups at 4" {
    # several models and optimizers trained one after the other in one process, each sharded
    # anew; each optimizer's fields are cut alike at any N (np=2 even, 3 uneven)
    for n in 2 3; do
        equal_to_unsharded $n adamw,rmsprop,adagrad,groups,sgd_closure
    done
    equal_to_unsharded 4 groups
}

@test "a custom optimizer: whole tensors under on, a rank with no tensor at np=4; left whole under auto" {
    shard 4 off --opt custom --tensors few
    assert_success
    local params state
    params=$(same_everywhere 4 params)
    state=$(same_everywhere 4 state)
    shard 4 on --opt custom --tensors few
    assert_success
    [ "$(same_everywhere 4 params)" = "$params" ] && [ "$(same_everywhere 4 state)" = "$state" ] ||
        fail "custom optimizer: differs from shard = off"
    # three tensors (640, 200 and 5 elements) for four ranks: one rank owns none
    local per_rank
    per_rank=$(for r in 0 1 2 3; do value state_elements $r; done | sort -n | xargs)
    assert_equal "$per_rank" "0 5 200 640"
    shard 4 auto --opt custom --tensors few
    assert_success
    for r in 0 1 2 3; do assert_equal "$(value state_elements $r)" 845; done
}

@test "the default (auto) shards torch.optim's Adam, not SGD; LBFGS stays whole, said once under on" {
    shard 2 auto --opt adam
    assert_success
    [ "$(value state_elements 0)" -lt 30000 ] || fail "auto did not shard Adam"
    shard 2 auto --opt sgd
    assert_success
    assert_equal "$(value state_elements 0)" 24699
    shard 2 on --opt lbfgs --steps 3
    assert_success
    assert_equal "$(count 'LBFGS keeps every parameter on every rank')" 1
    assert_equal "$(value state_elements 0)" "$(value state_elements 1)"
}

@test "checkpoints: the file saved at np=2 with shard on is shard off's; it resumes at np=3 and alone" {
    # (torch.save names its archive's records after the file: one name for both)
    shard 2 off --opt adam --save opt.pt
    assert_success
    mv "$BATS_TEST_TMPDIR/opt.pt" "$BATS_TEST_TMPDIR/off.pt"
    shard 2 on --opt adam --save opt.pt
    assert_success
    cmp "$BATS_TEST_TMPDIR/off.pt" "$BATS_TEST_TMPDIR/opt.pt" || fail "the checkpoint differs from shard = off's"
    # resumed at np=3: sharded as unsharded
    equal_to_unsharded 3 adam --load opt.pt --steps 6
    # and alone: the whole state loads, and training goes on
    run "$PY" "$SCRIPT" --opt adam --load "$BATS_TEST_TMPDIR/opt.pt" --steps 6
    assert_success
    assert_output --partial "state_elements 49406"
    # a state that holds None (SGD without momentum) loads into cut parameters too
    shard 2 on --opt sgd0 --save sgd0.pt
    assert_success
    equal_to_unsharded 3 sgd0 --load sgd0.pt --steps 6
}

# parted MODE: optim/parted.py MODE on 2 ranks, in the test's directory; it must end within 30 s.
parted() {
    cd "$BATS_TEST_TMPDIR"
    SECONDS=0
    run mpi 2 env LD_PRELOAD="$SHIM" "$PY" "$SRC/tests/integration/optim/parted.py" "$1"
    cd - >/dev/null
    [ "$SECONDS" -le 30 ] || fail "took $SECONDS s"
}

@test "a parameter made non-contiguous after the first sharded step: every rank stops, naming what to do" {
    parted relayout
    assert_failure
    assert_equal "$(count 'changed its size or memory layout after the optimizer')" 2
}

@test "state_dict() asked on rank 0 only: the job ends at once, the report naming the call" {
    parted rank0-saves
    assert_equal "$status" 75
    assert_output --partial "from parted.py:15 in <module>, state_dict of a sharded optimizer  <-- culprit"
}
