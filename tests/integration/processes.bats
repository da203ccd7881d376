#!/usr/bin/env bats
# Children of a rank process: forked workers, vfork+exec and system() children never enter the
# job's collectives, never hang it, and never finalize its MPI; the parent's job goes on.
load helpers

@test "forked, vforked and system() children act alone and the job completes (np=3)" {
    run mpi 3 env LD_PRELOAD="$SHIM" "$BUILD/bin/fork_workers"
    echo "$output"
    assert_success
    assert_equal "$(grep -oE 'fork_workers rank [0-2]: ok' <<<"$output" | wc -l)" 3
    assert_output --partial "children never enter collectives"
}

@test "a singleton with children behaves the same" {
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/fork_workers"
    assert_success
    assert_output --partial "fork_workers rank 0: ok"
}

@test "an interposed function with no real definition ends with a message naming it, not a SIGSEGV" {
    run "$BUILD/bin/real_missing"
    assert_equal "$status" 3
    run env LD_PRELOAD="$SHIM" "$BUILD/bin/real_missing"
    echo "$output"
    assert_equal "$status" 70
    assert_output --partial "ERROR MPI_Init: the program calls it, but no library loaded after libdpshim.so defines it"
    refute_output --partial "crashed with signal"
}

# A wrapper the launch line puts in front of the trainer starts it as a child: the first process
# of the rank's tree to call a hook holds the rank's place, so the trainer is the rank.
@test "a C trainer behind a wrapper (sh -c, /usr/bin/time, a bash script) trains as launched directly (np=2)" {
    local d=$BATS_TEST_TMPDIR args=(--steps 20 --no-eval)
    cat >"$d/run.sh" <<'SH'
#!/bin/bash
mkdir -p "$1/out" && cd "$1/out" && "${@:2}"
echo "script done"
SH
    chmod +x "$d/run.sh"
    mkdir -p "$d/direct" "$d/sh" "$d/time"
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" "${args[@]}" --save "$d/direct/m.ckpt"
    assert_success
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" sh -c '"$@"; echo shell done' sh \
        "$TRAINER" "${args[@]}" --save "$d/sh/m.ckpt"
    echo "$output"
    assert_success
    assert_equal "$(count "shell done")" 2
    refute_output --partial "nothing was distributed"
    run "$CKPT" same "$d/direct/m.ckpt" "$d/sh/m.ckpt"
    assert_success
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" /usr/bin/time -a -o "$d/time/rss" -f 'maxrss %M' \
        "$TRAINER" "${args[@]}" --save "$d/time/m.ckpt"
    assert_success
    assert_equal "$(grep -c maxrss "$d/time/rss")" 2
    run "$CKPT" same "$d/direct/m.ckpt" "$d/time/m.ckpt"
    assert_success
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$d/run.sh" "$d/script" \
        "$TRAINER" "${args[@]}" --save m.ckpt
    assert_success
    assert_equal "$(count "script done")" 2
    run "$CKPT" same "$d/direct/m.ckpt" "$d/script/out/m.ckpt"
    assert_success
}

@test "a PyTorch script behind a wrapper gets the adapter and its share of each batch (np=2)" {
    [ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
    cd "$BATS_TEST_TMPDIR"
    cat >share.py <<'PY'
import ctypes, torch
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
model = torch.nn.Linear(3, 1)
opt, n = torch.optim.SGD(model.parameters(), lr=0.1), 0
for x, y in torch.utils.data.DataLoader(data, batch_size=8):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    n += len(x)
print("trained on %d samples of 40, world %d, weight %.12f" % (n, ctypes.CDLL(None).dp_world_size(), model.weight.sum()))
PY
    local w weights=()
    for w in "" "/usr/bin/time -f %e" "nice -n 1" "sh -c /usr/bin/python3\ share.py;echo\ done"; do
        if [[ $w == sh* ]]; then
            # a Python step without torch before the trainer leaves the rank's place to it
            run mpi 2 env LD_PRELOAD="$SHIM" sh -c '/usr/bin/python3 -c "import json" && /usr/bin/python3 share.py; echo done'
        else
            run mpi 2 env LD_PRELOAD="$SHIM" $w /usr/bin/python3 share.py
        fi
        echo "[$w] $output"
        assert_success
        assert_equal "$(count "trained on 20 samples of 40, world 2")" 2
        refute_output --partial "nothing was distributed"
        weights+=("$(grep -o 'weight [-0-9.]*' <<<"$output" | sort -u)")
    done
    # one model, the same whichever way it was launched
    assert_equal "$(printf '%s\n' "${weights[@]}" | sort -u | wc -l)" 1
}

@test "a child that calls a hook before the rank process does takes the rank's place; the parent's hook then ends the job" {
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/fork_workers" child-first
    echo "$output"
    assert_equal "$status" 70
    assert_equal "$(count "fork_workers wrapped rank")" 2
    assert_output --partial "sum 2"
    assert_output --regexp "dp_metric in rank [01]'s process [0-9]+, but its child [0-9]+ took the rank's place in the job by calling a hook first"
}
