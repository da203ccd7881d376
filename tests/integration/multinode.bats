#!/usr/bin/env bats
# Across two nodes: network namespaces (tests/multinode/netns.sh) that talk over TCP only, each
# with its own host name, mpirun on nodeA reaching nodeB through an rsh agent that starts the
# far daemon with a login's environment, as ssh would. What a job spread over nodes must keep:
# the single-process weights, one copy of rank 0's files and output, one GPU per local rank of
# each node, a guard that ends the job when a far rank dies or freezes, or the link to its node
# is cut, and names its host.
# Skipped where namespaces cannot be made (not root, no veth or bridge), with the reason.
load helpers

NETNS=$SRC/tests/multinode/netns.sh
# batch 100 is not divisible by 3: shares 34/33/33
ARGS=(--batch 100 --no-eval --seed 7)
TIMEOUT=5

setup_file() {
    # namespaces of this run's own, so that another run at the same time keeps its nodes
    export DPS_NETNS_PREFIX=dpst$$
    local why
    if ! why=$("$NETNS" can 2>&1); then
        echo "$why" >"$BATS_FILE_TMPDIR/cannot"
        return 0
    fi
    "$NETNS" up 2 || { "$NETNS" down; return 1; }
    export REF=$BATS_FILE_TMPDIR/ref
    mkdir -p "$REF"
    "$TRAINER" "${ARGS[@]}" --steps 1 --save "$REF/one.ckpt" >/dev/null
    "$TRAINER" "${ARGS[@]}" --steps 50 --save "$REF/fifty.ckpt" >/dev/null
}

teardown_file() {
    [ -e "$BATS_FILE_TMPDIR/cannot" ] || "$NETNS" down
}

setup() {
    if [ -e "$BATS_FILE_TMPDIR/cannot" ]; then skip "no network namespaces: $(cat "$BATS_FILE_TMPDIR/cannot")"; fi
}

# end_mpirun: links forward again and no mpirun of this run's nodes is left (after a cut link)
end_mpirun() {
    "$NETNS" heal
    pkill -f "^mpirun --hostfile /run/dpshim-netns/$DPS_NETNS_PREFIX/" || true
    wait || true
}

teardown() {
    [ -e "$BATS_FILE_TMPDIR/cannot" ] || end_mpirun
}

# mpi N ARGS...: helpers.bash's mpi (and train_np through it) across the nodes: mpirun on nodeA,
# ranks dealt out node by node (np=3: ranks 0 and 2 on nodeA, rank 1 on nodeB), under a timeout.
mpi() {
    local n=$1
    shift
    timeout --kill-after=10 "$MPI_TIMEOUT" "$NETNS" mpirun -np "$n" --map-by node "$@" </dev/null
}


@test "each rank runs on its node, under its host name, with its local rank counted per node" {
    run mpi 3 --tag-output sh -c 'echo "on $(hostname)"; exec env LD_PRELOAD="$0" "$1" env' "$SHIM" "$BUILD/bin/dpshim-diag"
    echo "$output"
    assert_success
    assert_line "[1,0]<stdout>:on nodeA"
    assert_line "[1,1]<stdout>:on nodeB"
    assert_line "[1,2]<stdout>:on nodeA"
    assert_line "[1,0]<stdout>:rank       0 of 3 (local 0 of 2), rank process"
    assert_line "[1,1]<stdout>:rank       1 of 3 (local 0 of 1), rank process"
    assert_line "[1,2]<stdout>:rank       2 of 3 (local 1 of 2), rank process"
}

@test "np=2 (1+1): one step equals the single-process run within 1e-6, ranks bitwise the same" { check_np 2 1 "$REF/one.ckpt" 1e-6; }
@test "np=3 (2+1, uneven): one step equals the single-process run within 1e-6, ranks bitwise the same" { check_np 3 1 "$REF/one.ckpt" 1e-6; }
@test "np=4 (2+2): one step equals the single-process run within 1e-6, ranks bitwise the same" { check_np 4 1 "$REF/one.ckpt" 1e-6; }
@test "np=3 (2+1, uneven): 50 steps equal the single-process run within 1e-4, ranks bitwise the same" { check_np 3 50 "$REF/fifty.ckpt" 1e-4; }

@test "a DPSHIM_ variable left in mpirun's environment reaches nodeA only: the job does not start, naming it" {
    # the far daemon starts with a login's environment: only -x carries a variable there
    DPSHIM_BN_SYNC=off run mpi 3 -x LD_PRELOAD="$SHIM" "$TRAINER" "${ARGS[@]}" --steps 1
    echo "$output"
    assert_failure
    assert_output --partial "[bn] sync differs between the ranks"
    assert_output --partial "ranks 0, 2: off (env DPSHIM_BN_SYNC)"
    assert_output --partial "rank 1: on (default)"
    refute_output --partial "epoch 1:"
    DPSHIM_BN_SYNC=off run mpi 3 -x DPSHIM_BN_SYNC -x LD_PRELOAD="$SHIM" "$TRAINER" "${ARGS[@]}" --steps 1
    assert_success
}

@test "[files] on a file system both nodes share: rank0_only written once, by rank 0; per_rank named by global rank" {
    cd "$BATS_TEST_TMPDIR"
    # every rank appends: without the policy the file would hold 3 lines
    run mpi 3 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' DPSHIM_FILES_PER_RANK='*.log' LD_PRELOAD="$SHIM" \
        sh -c 'me="rank $OMPI_COMM_WORLD_RANK on $(hostname)"; echo "$me" >>shared.ckpt; echo "$me" >train.log'
    assert_success
    assert_equal "$(cat shared.ckpt)" "rank 0 on nodeA"
    # local rank 0 of nodeB must not take rank 0's name
    assert_equal "$(cat train.rank0.log)" "rank 0 on nodeA"
    assert_equal "$(cat train.rank1.log)" "rank 1 on nodeB"
    assert_equal "$(cat train.rank2.log)" "rank 2 on nodeA"
    run ls
    assert_output "$(printf '%s\n' shared.ckpt train.rank0.log train.rank1.log train.rank2.log)"
    # the trainer's checkpoint, saved by rank 0 alone, holds the run's weights
    mkdir trainer && cd trainer
    run mpi 3 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" "${ARGS[@]}" --steps 1 --save model.ckpt
    assert_success
    run ls
    assert_output model.ckpt
    assert_le "$(rel_diff "$REF/one.ckpt" model.ckpt)" 1e-6
}

@test "[output] stdout = rank0 across nodes: each line once, from nodeA; stderr from every rank" {
    run mpi 4 env DPSHIM_OUTPUT_STDOUT=rank0 LD_PRELOAD="$SHIM" sh -c \
        'h=$(hostname); for i in $(seq 1 50); do echo "line $i on $h"; done; echo "err $OMPI_COMM_WORLD_RANK on $h" >&2'
    assert_success
    assert_equal "$(grep -c '^line [0-9]* on nodeA$' <<<"$output")" 50
    assert_equal "$(grep '^line ' <<<"$output" | sort -u | wc -l)" 50
    assert_equal "$(grep -c '^err [13] on nodeB$' <<<"$output")" 2
    assert_equal "$(grep -c '^err [02] on nodeA$' <<<"$output")" 2
}

@test "[gpu] bind: the local ranks of each node share out that node's own list" {
    # a per-node device list, as each machine's environment would set it
    run mpi 4 sh -c 'case $(hostname) in nodeA) list=2,3 ;; nodeB) list=5,7 ;; esac
        exec env CUDA_VISIBLE_DEVICES=$list LD_PRELOAD="$0" sh -c \
            "echo rank \$OMPI_COMM_WORLD_RANK on \$(hostname) sees \${CUDA_VISIBLE_DEVICES-unset}"' "$SHIM"
    echo "$output"
    assert_success
    assert_line "rank 0 on nodeA sees 2"
    assert_line "rank 2 on nodeA sees 3"
    assert_line "rank 1 on nodeB sees 5"
    assert_line "rank 3 on nodeB sees 7"
    refute_output --partial "share" # 4 ranks, 2 GPUs per node: nothing shared
}

@test "GPU tensors (the CUDA/NCCL test double): the same device on two nodes is not a shared GPU" {
    [ -x "$BUILD/bin/gpu_hooks" ] || skip "gpu_hooks not built"
    # The double's NCCL meets in /dev/shm, which the namespaces share; its duplicate-GPU check,
    # like NCCL's, compares host and bus id, and so must the shim's choice of path.
    run mpi 4 env LD_LIBRARY_PATH="$BUILD/tests/gpu_double" GPU_DOUBLE_DEVICES=2 CUDA_VISIBLE_DEVICES=0,1 \
        DPSHIM_GUARD_TIMEOUT=60 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$BUILD/bin/gpu_hooks" --dtype f32
    echo "$output"
    assert_success
    for r in 0 1; do assert_output --partial "[dpshim r$r/4] INFO [gpu] bind: local rank 0 of 2 sees GPU 0 only"; done
    for r in 2 3; do assert_output --partial "[dpshim r$r/4] INFO [gpu] bind: local rank 1 of 2 sees GPU 1 only"; done
    assert_output --partial "GPU tensors go through NCCL"
    refute_output --regexp "shar(e|es|ing) (the|a) GPU"
    assert_equal "$(grep -o 'grads f32 checksum [0-9a-f]* ok' <<<"$output" | sort | uniq -c | awk '{ print $1 }')" 4
}

# fault (helpers.bash) runs on 4 ranks here: ranks 1 and 3 on nodeB.
@test "rank 1 on nodeB killed by SIGKILL at step 5: the job ends by itself, naming the rank" {
    fault kill 1 5
    assert_failure
    # Nothing in the killed rank can speak. Its daemon tells mpirun, which ends the job (status
    # 128 + 9) within seconds, before [guard] timeout, so the guard's table names the rank only
    # on a machine slow enough for the watchdog to come first.
    assert_output --regexp "process rank 1 with PID [0-9]+ on node 10\.77\.0\.2 exited on signal 9|rank 1 \(nodeB\): no answer"
}

@test "rank 1 on nodeB stopped by SIGSTOP at step 5: the watchdog ends the job, naming the silent rank" {
    fault stop 1 5
    assert_equal "$status" 75
    assert_output --partial "guard: dp_grads collective #6 (after step 4) has waited"
    assert_output --regexp "rank 1( \(nodeB\))?: no answer \(crashed, killed, stopped, or left with _exit\)  <-- culprit"
    assert_output --partial "guard: ending the job (exit status 75)"
}

@test "the guard's table names each rank's host" {
    fault stall 3 5
    assert_failure
    assert_output --regexp "guard:   rank 0 \(nodeA\): in dp_grads \(all-reduce f32 x 1000\), collective #6 after step 4"
    assert_output --regexp "guard:   rank 1 \(nodeB\): in dp_grads \(all-reduce f32 x 1000\), collective #6 after step 4"
    assert_output --regexp "guard:   rank 2 \(nodeA\): in dp_grads \(all-reduce f32 x 1000\), collective #6 after step 4"
    assert_output --regexp "guard:   rank 3 \(nodeB\): in the program's own code for [0-9.]+ s, .*  <-- culprit"
}

@test "the link to nodeB cut during training: every rank reports and ends itself within [guard] timeout + 15 s, nodeB's ranks named unreachable" {
    local diag=$BATS_TEST_TMPDIR/diag out=$BATS_TEST_TMPDIR/out
    mkdir -p "$diag"
    # 20 steps an epoch at np=4 and an epoch line each time: a job that runs until the cut
    mpi 4 -x LD_PRELOAD="$SHIM" -x DPSHIM_GUARD_TIMEOUT=$TIMEOUT -x DPSHIM_DIAG_DIR="$diag" \
        "$TRAINER" --train-limit 2000 --epochs 1000000 --no-eval >"$out" 2>&1 3>&- &
    local i
    for i in $(seq 600); do grep -q '^epoch 2:' "$out" && break; sleep 0.2; done
    grep -q '^epoch 2:' "$out" || fail "the job did not reach epoch 2: $(cat "$out")"
    "$NETNS" cut nodeB
    local start=$SECONDS
    while pgrep -f "^$TRAINER " >/dev/null && [ $((SECONDS - start)) -le $((TIMEOUT + 30)) ]; do sleep 0.2; done
    local elapsed=$((SECONDS - start))
    # mpirun waits for nodeB's daemon until TCP gives up (README): teardown heals and ends it
    end_mpirun
    echo "ranks ended $elapsed s after the cut" >&3
    run cat "$out"
    echo "$output"
    [ "$elapsed" -le $((TIMEOUT + 15)) ] || fail "ranks still running $elapsed s after the cut"
    assert_output --partial "rank 1 (nodeB): no answer: unreachable (no rank on nodeB answered"
    assert_output --partial "rank 3 (nodeB): no answer: unreachable (no rank on nodeB answered"
    assert_output --partial "guard: ending the job (exit status 75)"
    # the far side ended itself too, after writing what it saw (its stderr went with the link);
    # the stats name the rank whose watchdog reported first
    for r in 0 1 2 3; do
        grep "^failure guard: .* waited longer than the timeout on rank [0-3]$" "$diag/stats.rank$r.txt" ||
            fail "rank $r: $(cat "$diag/stats.rank$r.txt")"
    done
}

# elastic_run STEPS [MODE]: elastic_train STEPS on 4 ranks (1 and 3 on nodeB) through dpshim-run
# under mpirun --enable-recovery, in the background, its output in $out; with MODE (before:
# SIGKILL; stop: SIGSTOP) ranks 1 and 3 each end or stop at step 3.
elastic_run() {
    out=$BATS_TEST_TMPDIR/out
    timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=$TIMEOUT \
        "$NETNS" launch "$BUILD/bin/dpshim-run" -np 4 --map-by node --enable-recovery \
        sh -c 'if [ $((OMPI_COMM_WORLD_RANK % 2)) = 1 ] && [ -n "$2" ]; then exec "$0" "$1" "$OMPI_COMM_WORLD_RANK" 3 "$2"; else exec "$0" "$1"; fi' \
        "$BUILD/bin/elastic_train" "$1" "${2:-}" </dev/null >"$out" 2>&1 3>&- &
    job=$!
}

# elastic_done: waits for the job; its status and output in $status and $output, its seconds
# since SINCE (default: now) in $elapsed.
elastic_done() {
    local start=${1:-$SECONDS}
    status=0
    wait "$job" || status=$?
    elapsed=$((SECONDS - start))
    output=$(cat "$out")
    echo "$output"
    echo "status $status, ended after $elapsed s" >&3
}

@test "elastic: nodeB's ranks killed at step 3: nodeA's go on, and the job ends by itself with status 0" {
    local start=$SECONDS
    elastic_run 6 before
    elastic_done "$start"
    assert_equal "$status" 0
    # both end at step 3, but one may still be finishing the collective before it when the other
    # ends: the survivors lose them in one agreement, or in two (the second during the rerun of
    # the collective the first loss broke off)
    local losses
    losses=$(grep -E "elastic: lost rank .* during step 3; the lost batch of the step is missing" <<<"$output" || true)
    grep -qE "rank 1 \(nodeB, process [0-9]+: " <<<"$losses" || fail "rank 1's loss not named"
    grep -qE "rank 3 \(nodeB, process [0-9]+: " <<<"$losses" || fail "rank 3's loss not named"
    assert_output --regexp "during step 3; the lost batch of the step is missing from the gradient sums not complete at the loss; 2 rank\(s\) go on"
    # steps 1-2 average 1..4 (2.5), steps 3-6 average 1 and 3 (2)
    assert_output --partial "rank 0 of 2 (started as 0 of 4): small -0.12999998 large -0.12999998"
    assert_output --partial "rank 1 of 2 (started as 2 of 4): small -0.12999998 large -0.12999998"
    [ "$elapsed" -le $((TIMEOUT + 30)) ] || fail "took $elapsed s"
}

@test "elastic: nodeB's ranks stopped, too few left ([elastic] min_ranks): the guard ends the job, stopped ranks and all" {
    # nodeA's ranks cannot end the stopped ones on another node, nor does the launcher in
    # recovery mode: dpshim-run ends it once the guard has ended the job
    local start=$SECONDS
    DPSHIM_ELASTIC_MIN_RANKS=3 elastic_run 6 stop
    elastic_done "$start"
    assert_equal "$status" 75
    assert_output --partial "the survivors of a lost rank cannot go on: 2 rank(s) are left, fewer than [elastic] min_ranks = 3"
    assert_output --partial "the guard ended the job, and mpirun still runs 10 s later, waiting for rank(s) 1 3 (stopped, or on a node it cannot reach): ending it"
    assert_output --partial "the job failed: rank 0 exited with status 75"
    [ "$elapsed" -le $((TIMEOUT + 40)) ] || fail "took $elapsed s"
    ! pgrep -f "elastic_train 6 [13] 3 stop" || fail "a stopped rank is still there"
}

@test "elastic: the link to nodeB cut: nodeA's ranks go on, and the job ends by itself with status 0" {
    ELASTIC_TRAIN_STEPS=1 ELASTIC_TRAIN_SLEEP_MS=20 elastic_run 300
    local i
    for i in $(seq 600); do grep -q '^rank 0 step 20:' "$out" && break; sleep 0.2; done
    grep -q '^rank 0 step 20:' "$out" || fail "the job did not reach step 20: $(cat "$out")"
    "$NETNS" cut nodeB
    local start=$SECONDS
    elastic_done "$start"
    assert_equal "$status" 0
    assert_output --regexp "elastic: lost rank 1 \(nodeB, process [0-9]+: no answer past \[guard\] timeout[^)]*\), rank 3 \(nodeB"
    [ "$(grep -c '^rank .* checksum' <<<"$output")" -eq 2 ] || fail "expected nodeA's 2 ranks to finish"
    [ "$(grep -o 'checksum [0-9a-f]*' <<<"$output" | sort -u | wc -l)" -eq 1 ] || fail "the survivors' weights differ"
    assert_output --partial "every rank has left, and mpirun still runs 10 s later"
    # the guard's timeout, the survivors' last steps, then the launcher's 10 s and 3 s
    [ "$elapsed" -le $((TIMEOUT + 40)) ] || fail "took $elapsed s"
}
