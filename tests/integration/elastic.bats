#!/usr/bin/env bats
# [elastic] lost_rank = continue under mpirun --enable-recovery: a rank SIGKILLed while the job
# runs does not end it. The survivors agree, complete the step at the loss over their own shares
# and go on as a smaller job; their weights are bitwise the same, and what each step averaged
# says which ranks took part. elastic_train's gradient on the rank that started as r is r + 1
# everywhere, and each step takes 0.01 of the average.
load helpers

TRAIN=$BUILD/bin/elastic_train

# trained_per_epoch PREFIX EPOCHS: from the lines "EPOCH SAMPLE..." of PREFIX.* (one file a rank),
# what each epoch trained: "epoch E: N samples, T twice" in $output.
trained_per_epoch() {
    run python3 -c '
import collections, glob, sys
seen = collections.defaultdict(collections.Counter)
for f in glob.glob(sys.argv[1] + ".*"):
    for line in open(f):
        epoch, *samples = map(int, line.split())
        seen[epoch].update(samples)
for epoch in range(int(sys.argv[2])):
    c = seen[epoch]
    print(f"epoch {epoch}: {len(c)} samples, {sum(c.values()) - len(c)} twice")' "$1" "$2"
    echo "$output"
}

# elastic N ARGS...: elastic_train ARGS on N ranks through dpshim-run, whose status is the ranks'
# own under the launcher's recovery mode; timed.
elastic() {
    local n=$1 start=$SECONDS
    shift
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=${DPSHIM_GUARD_TIMEOUT:-30} \
        "$BUILD/bin/dpshim-run" -np "$n" --oversubscribe --enable-recovery "$TRAIN" "$@" </dev/null
    elapsed=$((SECONDS - start))
    echo "$output"
}

# survivors_agree COUNT: COUNT ranks finished, all with one checksum, each counting COUNT ranks,
# and each told of the job's size alike at every step.
survivors_agree() {
    [ "$(grep -c '^rank .* ranks$' <<<"$output")" -eq "$1" ] || fail "expected $1 ranks to finish"
    [ "$(grep -o 'checksum [0-9a-f]*' <<<"$output" | sort -u | wc -l)" -eq 1 ] || fail "the survivors' weights differ"
    [ "$(grep -c ", $1 ranks\$" <<<"$output")" -eq "$1" ] || fail "dp_metric did not count $1 ranks"
    [ "$(grep '^rank [0-9]* sizes:' <<<"$output" | sed 's/^rank [0-9]* //' | sort -u | wc -l)" -eq 1 ] ||
        fail "the survivors were told of the job's size at different steps"
}

# torch_scale_lost SHARED TWICE ENV...: elastic_torch.py at np=3 in scale mode with ENV
# (KILL_RANK, ...): it succeeds, says that SHARED samples the lost rank had not trained are
# trained now by the two survivors, who end with one set of parameters; every epoch trained every
# sample, TWICE (a list, one number an epoch) of them twice (the padding's). The job's output is
# left in $job_output.
torch_scale_lost() {
    local shared=$1 twice=($2) e
    shift 2
    rm -f "$BATS_TEST_TMPDIR"/trained.*
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=60 "$@" DPSHIM_DATA_MODE=scale \
        TRACE="$BATS_TEST_TMPDIR/trained" "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery \
        /usr/bin/python3 "$SRC/tests/integration/elastic_torch.py" </dev/null
    echo "$output"
    job_output=$output
    assert_success
    assert_output --partial "elastic: the $shared samples of this epoch the lost rank(s) had not trained are trained now, $(((shared + 1) / 2)) by each survivor"
    [ "$(grep -o 'loss [0-9.]*, parameters [-0-9.]*' <<<"$output" | sort -u | wc -l)" -eq 1 ] ||
        fail "the survivors' parameters differ"
    trained_per_epoch "$BATS_TEST_TMPDIR/trained" 3
    assert_output "$(for e in 0 1 2; do echo "epoch $e: 512 samples, ${twice[e]} twice"; done)"
}

@test "a healthy job under --enable-recovery: the weights bitwise those of a job without it" {
    run mpi 3 env LD_PRELOAD="$SHIM" "$TRAIN" 6
    assert_success
    local plain
    plain=$(grep -o 'checksum [0-9a-f]*' <<<"$output" | sort -u)
    elastic 3 6
    assert_success
    assert_output --partial "rank 0 of 3 (started as 0 of 3): small -0.11999999 large -0.11999999 $plain, 3 ranks"
    survivors_agree 3
}

@test "rank 2 of 3 SIGKILLed at step 3: the other two go on, renumbered, and exit 0" {
    DPSHIM_DIAG_DIR=$BATS_TEST_TMPDIR elastic 3 6 2 3
    assert_success
    assert_output --regexp "elastic: lost rank 2 \([^,]+, process [0-9]+: its process ended\) during step 3; the lost batch of the step is missing from the gradient sums not complete at the loss; 2 rank\(s\) go on"
    assert_output --partial "elastic: the job lost rank 2 in step 3 and went on with 2 of its 3 ranks"
    # steps 1-2 average 1, 2, 3; steps 3-6 (the step at the loss too) average 1 and 2
    assert_output --partial "rank 0 of 2 (started as 0 of 3): small -0.100000001 large -0.100000001"
    assert_output --partial "rank 1 of 2 (started as 1 of 3): small -0.100000001 large -0.100000001"
    survivors_agree 2
    [ "$elapsed" -lt 30 ] || fail "took $elapsed s"
    # the diagnostics report lists the loss
    run "$BUILD/bin/dpshim-diag" report "$BATS_TEST_TMPDIR"
    assert_success
    assert_output --partial "lost: the job went on without rank 2 in step 3 (its process ended)"
}

@test "a rank killed while the gradient sum runs: the survivors hold one result, and go on" {
    for i in 1 2 3; do
        elastic 3 6 1 3 during
        assert_success
        survivors_agree 2
        # rank 1 averaged 2 with 1 and 3, and 1 and 3 average 2 too: every step took 0.02
        assert_output --partial "rank 1 of 2 (started as 2 of 3): small -0.11999999 large -0.11999999"
        elastic 3 6 2 3 during
        assert_success
        survivors_agree 2
        # the thread kills rank 2 in step 3 or, on a busy machine, up to three steps later; each
        # tensor's sum at the loss either completed with rank 2 (2) or ran again without it (1.5):
        # 2 to 6 steps of 0.02, the rest of 0.015
        local took='-0\.1(00000001|04999997|09999999|14999995|1999999)'
        assert_output --regexp "rank 0 of 2 \(started as 0 of 3\): small $took large $took"
    done
}

@test "a rank lost in a step's last sum that one survivor completed: both are told at the same collective" {
    # rank 2 stops inside step 3's ring all-reduce, after its last send: rank 0 completes the sum,
    # rank 1 (its send to rank 2 held back, so never received) gets the result replayed. Both
    # must renumber at step 4's first collective, where rank 0 finds the loss: a program cuts its
    # next batch from dp_world_size() before that.
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=30 DPSHIM_DIAG_LOG=debug \
        DPSHIM_COMM_PIECE_KB=4096 RING_STOP=2:12 RING_LATE=1:12:20 "$BUILD/bin/dpshim-run" -np 3 --oversubscribe \
        --enable-recovery env LD_PRELOAD="$BUILD/lib/libring_faults.so:$SHIM" "$TRAIN" 6 </dev/null
    echo "$output"
    assert_success
    assert_output --partial "ring_faults: rank 2 stops in the ring step of its send"
    assert_output --regexp "elastic: dp_grads: .*laggard 1, abandoned 1, replayed 1"
    assert_output --partial "elastic: the job lost rank 2 in step 4 and went on with 2 of its 3 ranks"
    assert_output --partial "rank 0 sizes: 3 3 3 3 2 2"
    # steps 1-3 average 1, 2 and 3; steps 4-6 average 1 and 2
    assert_output --partial "rank 1 of 2 (started as 1 of 3): small -0.104999997 large -0.104999997"
    survivors_agree 2
    # the same with rank 0 lost, and a rank0_only log and checkpoint written after each step:
    # rank 1 completed the sum and finds the loss waiting for rank 0's write of the log, rank 2
    # has the sum replayed; neither is told before step 4's first collective
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=30 DPSHIM_DIAG_LOG=debug \
        DPSHIM_COMM_PIECE_KB=4096 RING_STOP=0:12 RING_LATE=2:12:20 ELASTIC_TRAIN_SAVE="$BATS_TEST_TMPDIR" \
        DPSHIM_FILES_RANK0_ONLY='*.ckpt *.log' "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery \
        env LD_PRELOAD="$BUILD/lib/libring_faults.so:$SHIM" "$TRAIN" 6 </dev/null
    echo "$output"
    assert_success
    assert_output --regexp "r1/3\] DEBUG elastic: wait for rank 0's write of [^ ]*train.log.*replayed 0"
    assert_output --regexp "r2/3\] DEBUG elastic: dp_grads: .*laggard 1, abandoned 1, replayed 1"
    assert_output --partial "elastic: the job lost rank 0 in step 4 and went on with 2 of its 3 ranks"
    assert_output --partial "rank 0 sizes: 3 3 3 3 2 2"
    survivors_agree 2
    [ "$(grep -o 'checkpoint 1204000 bytes, checksum [0-9a-f]*' <<<"$output" | sort -u | wc -l)" -eq 1 ] ||
        fail "the survivors read different checkpoints"
}

@test "two ranks of 4 lost one after the other: the last two go on" {
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=30 "$BUILD/bin/dpshim-run" -np 4 --oversubscribe \
        --enable-recovery sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$0" 8 1 6; else exec "$0" 8 3 3; fi' \
        "$TRAIN" </dev/null
    echo "$output"
    assert_success
    assert_output --partial "elastic: the job lost rank 1 in step 6, rank 3 in step 3 and went on with 2 of its 4 ranks"
    # 2 steps of (1+2+3+4)/4, 3 of (1+2+3)/3, 3 of (1+3)/2
    assert_output --partial "rank 1 of 2 (started as 2 of 4): small -0.169999972 large -0.169999972"
    survivors_agree 2
}

@test "rank 0 lost: rank 1 takes its place, its output included" {
    elastic 3 6 0 3
    assert_success
    # said by the new rank 0, which started as rank 1
    assert_output --regexp "\[dpshim r1/3\] WARN elastic: lost rank 0 \([^,]+, process [0-9]+: its process ended\) during step 3; the lost batch of the step is missing from the gradient sums not complete at the loss; 2 rank\(s\) go on"
    # steps 1-2 average 1, 2, 3; steps 3-6 average 2 and 3
    assert_output --partial "rank 0 of 2 (started as 1 of 3): small -0.139999986 large -0.139999986"
    survivors_agree 2
    assert_output --regexp "\[dpshim r1/3\] SUMMARY 3 ranks"
    [ "$elapsed" -lt 30 ] || fail "took $elapsed s"
    # [output] stdout = rank0: the new rank 0 prints, and only it, each line once and whole: the
    # line rank 0 had begun when it was lost ("step 3:", in its buffer) is the new rank 0's to end
    DPSHIM_OUTPUT_STDOUT=rank0 ELASTIC_TRAIN_PROGRESS=1 elastic 3 6 0 3
    assert_success
    assert_output --partial "rank 0 of 2 (started as 1 of 3): small -0.139999986 large -0.139999986"
    assert_equal "$(grep -c '^rank .* checksum' <<<"$output")" 1
    assert_equal "$(grep '^step' <<<"$output" | paste -sd'|')" \
        "step 1: done|step 2: done|step 3: done|step 4: done|step 5: done|step 6: done"
}

@test "rank 0 of a PyTorch script lost with stdout = rank0: the new rank 0 prints each line once, whole" {
    # rank 0 dies in epoch 1 (step 13, of 8 an epoch), with "epoch 1:" begun; the new rank 0
    # prints from then on: not again the lines rank 0 printed (they waited in its block buffer,
    # the silenced stdout not being a terminal), and the line rank 0 begun (lost in its buffer)
    # whole. Under python -u, where rank 0 wrote "epoch 1:" at once, the new one writes the rest
    local unbuffered out=$BATS_TEST_TMPDIR/stdout err=$BATS_TEST_TMPDIR/stderr
    for unbuffered in '' 1; do
        # stdout apart from stderr, where the loss is said between the line's two pieces
        run timeout --kill-after=10 "$MPI_TIMEOUT" env PYTHONUNBUFFERED=$unbuffered KILL_RANK=0 KILL_STEP=13 \
            PROGRESS=1 DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_GUARD_TIMEOUT=60 bash -c 'e=$1; shift; "$@" >"$0" 2>"$e"' "$out" "$err" \
            "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery /usr/bin/python3 \
            "$SRC/tests/integration/elastic_torch.py" </dev/null
        cat "$out" "$err"
        assert_success
        grep -q "elastic: lost rank 0 ([^)]*) during step 13" "$err" || fail "no loss of rank 0 at step 13"
        assert_equal "$(grep '^epoch' "$out" | paste -sd'|')" "epoch 0: done|epoch 1: done|epoch 2: done"
    done
}

# saves N ARGS...: elastic N ARGS with the trainer's log and checkpoint rank0_only, in a new $dir.
saves() {
    dir=$(mktemp -d "$BATS_TEST_TMPDIR/saves.XXXX")
    DPSHIM_FILES_RANK0_ONLY='*.ckpt *.log' ELASTIC_TRAIN_SAVE=$dir elastic "$@"
}

# whole_files STEPS: the log, open through the loss, holds each step once, in order; the
# checkpoint, read back on each of the two survivors, holds their weights.
whole_files() {
    assert_equal "$(tr '\n' ' ' <"$dir/train.log")" "$(for s in $(seq "$1"); do printf 'step %d ' "$s"; done)"
    local weights
    weights=$(grep -o 'checksum [0-9a-f]*, ' <<<"$output" | sort -u)
    [ "$(grep -c "checkpoint 1204000 bytes, ${weights%, }\$" <<<"$output")" -eq 2 ] ||
        fail "the checkpoint does not hold the survivors' weights"
}

@test "rank 0 lost with rank0_only files: the lowest survivor writes them from then on, each whole" {
    local how
    # rank 0 killed before its step's sum (the others wait in the sum), while the sum runs (they
    # go on to the save and wait for rank 0's), halfway through its save (they wait for the rest)
    for how in before during save; do
        saves 3 6 0 3 $how
        assert_success
        assert_output --partial "elastic: the job lost rank 0 in step"
        survivors_agree 2
        whole_files 6
        [ "$elapsed" -lt 30 ] || fail "$how: took $elapsed s"
    done
    # the lead passes twice: rank 0 lost at step 3, then rank 1 at step 6 (of 4 ranks)
    dir=$(mktemp -d "$BATS_TEST_TMPDIR/saves.XXXX")
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=30 DPSHIM_FILES_RANK0_ONLY='*.ckpt *.log' \
        ELASTIC_TRAIN_SAVE="$dir" "$BUILD/bin/dpshim-run" -np 4 --oversubscribe --enable-recovery \
        sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$0" 8 1 6 save; else exec "$0" 8 0 3; fi' \
        "$TRAIN" </dev/null
    echo "$output"
    assert_success
    assert_output --partial "elastic: the job lost rank 0 in step 3, rank 1 in step 7 and went on with 2 of its 4 ranks"
    survivors_agree 2
    whole_files 8
}

@test "a rank stalled in its own code, or stopped: past [guard] timeout it is ended, and the others go on" {
    DPSHIM_GUARD_TIMEOUT=4 elastic 3 6 2 3 stall
    assert_success
    assert_output --regexp "guard: rank 2 \([^)]*\) is in the program's own code for [0-9.]+ s, since dp_grads collective #[0-9]+ after step 2, while the other ranks wait for it in a collective: stalled past \[guard\] timeout = 4 s"
    assert_output --regexp "elastic: lost rank 2 \([^,]+, process [0-9]+: stalled in the program's own code past \[guard\] timeout; ended\) during step 3; the lost batch of the step is missing from the gradient sums not complete at the loss; 2 rank\(s\) go on"
    assert_output --partial "rank 1 of 2 (started as 1 of 3): small -0.100000001 large -0.100000001"
    survivors_agree 2
    [ "$elapsed" -lt 30 ] || fail "took $elapsed s"
    # SIGSTOP: it cannot answer, nor end itself; the survivors on its host end it. Rank 0 comes
    # to the sum 1 s late, so rank 2 finds it first and ends it, and rank 0 (which prints the
    # loss) sees its process gone before the agreement: it still names the cause rank 2 found
    ELASTIC_TRAIN_LATE=0:1000 DPSHIM_GUARD_TIMEOUT=4 elastic 3 6 1 3 stop
    assert_success
    assert_output --regexp "elastic: lost rank 1 \([^,]+, process [0-9]+: no answer past \[guard\] timeout: stopped, or its host or link is down\) during step 3"
    assert_output --partial "rank 1 of 2 (started as 2 of 3): small -0.11999999 large -0.11999999"
    survivors_agree 2
    [ "$elapsed" -lt 30 ] || fail "took $elapsed s"
    ! pgrep -f "elastic_train 6 1 3 stop" || fail "the stopped rank is still there"
}

@test "a rank killed, and another stopped as the survivors agree: that one is lost too, and the last two go on" {
    # rank 2 stops where rank 1 dies: the agreement on rank 1's loss never hears from it
    local start=$SECONDS
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=4 "$BUILD/bin/dpshim-run" -np 4 \
        --oversubscribe --enable-recovery \
        sh -c 'case $OMPI_COMM_WORLD_RANK in 1) exec "$0" 6 1 3 before ;; 2) exec "$0" 6 2 3 stop ;; *) exec "$0" 6 ;; esac' \
        "$TRAIN" </dev/null
    echo "$output"
    assert_success
    assert_output --regexp "elastic: lost rank 1 \([^,]+, process [0-9]+: its process ended\), rank 2 \([^,]+, process [0-9]+: no answer past \[guard\] timeout: stopped, or its host or link is down\) during step 3"
    survivors_agree 2
    [ $((SECONDS - start)) -lt 30 ] || fail "took $((SECONDS - start)) s"
    ! pgrep -f "elastic_train 6 2 3 stop" || fail "the stopped rank is still there"
}

@test "a rank lost as every rank reads the checkpoint back, before rank 0 replaces it: no wait for it" {
    # rank 0 waits for the others to have read the file before it renames the next one onto it;
    # rank 2 dies before its read (rank 0 stops waiting for it), or rank 0 before its own (the
    # others stop waiting for rank 0, and rank 1 reads and replaces it instead)
    local lost
    for lost in 2 0; do
        saves 3 6 $lost 3 load
        assert_success
        assert_output --partial "elastic: the job lost rank $lost in step"
        survivors_agree 2
        whole_files 6
        [ "$elapsed" -lt 30 ] || fail "rank $lost: took $elapsed s"
    done
}

@test "rank 0 stalled: ended past [guard] timeout, and rank 1 takes its place, its files too" {
    DPSHIM_GUARD_TIMEOUT=4 elastic 3 6 0 3 stall
    assert_success
    assert_output --regexp "elastic: lost rank 0 \([^,]+, process [0-9]+: stalled in the program's own code past \[guard\] timeout; ended\) during step 3"
    assert_output --partial "rank 0 of 2 (started as 1 of 3): small -0.139999986 large -0.139999986"
    survivors_agree 2
    DPSHIM_GUARD_TIMEOUT=4 saves 3 6 0 3 stall
    assert_success
    survivors_agree 2
    whole_files 6
}

@test "two of 3 ranks stalled: the one left is no quorum (more than half of the ranks), and the job ends" {
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=4 "$BUILD/bin/dpshim-run" -np 3 --oversubscribe \
        --enable-recovery sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec "$0" 6; else exec "$0" 6 "$OMPI_COMM_WORLD_RANK" 3 stall; fi' \
        "$TRAIN" </dev/null
    echo "$output"
    assert_failure 75
    assert_output --partial "the survivors of a lost rank cannot go on: the 1 rank(s) this rank still reaches are not a quorum of the 3 before"
}

@test "a rank killed before the start-up broadcast: MPI cannot start without it, and the job ends at [guard] timeout" {
    # the limit the docs name: the others wait in the backend's start-up, which cannot be given
    # up; the start-up watch ends the job (exit 75) instead of a hang
    SECONDS=0
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=5 "$BUILD/bin/dpshim-run" -np 3 --oversubscribe \
        --enable-recovery "$TRAIN" 4 2 0 start </dev/null
    echo "$output"
    assert_failure 75
    assert_output --partial "the backend's start-up (opened by dp_params) has waited"
    [ $SECONDS -lt 30 ] || fail "the job took $SECONDS s to end"
}

@test "[elastic] min_ranks = 3, lost_rank = end, or no recovery mode: a lost rank ends the job" {
    DPSHIM_ELASTIC_MIN_RANKS=3 elastic 3 6 2 3
    assert_failure 75
    assert_output --partial "the survivors of a lost rank cannot go on: 2 rank(s) are left, fewer than [elastic] min_ranks = 3"
    # the job did not go on without rank 2: its loss is what ended it
    assert_output --regexp "rank 2 \([^)]*\): gone: its process has ended .*<-- culprit"
    refute_output --partial "lost earlier"
    DPSHIM_ELASTIC_LOST_RANK=end elastic 3 6 2 3
    assert_failure 75
    assert_output --partial "is gone: its process ended without leaving the program"
    run mpi 3 env DPSHIM_GUARD_TIMEOUT=30 LD_PRELOAD="$SHIM" "$TRAIN" 6 2 3
    assert_failure
    refute_output --partial "elastic: lost"
}

@test "a PyTorch script, rank 1 or rank 0 of 3 killed at step 5: the survivors' parameters agree, exit 0" {
    local lost
    for lost in 1 0; do
        # torch.save of each epoch's model, rank 0's alone
        run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=60 KILL_RANK=$lost \
            DPSHIM_FILES_RANK0_ONLY='*.pt' SAVE="$BATS_TEST_TMPDIR/model.pt" "$BUILD/bin/dpshim-run" \
            -np 3 --oversubscribe --enable-recovery /usr/bin/python3 "$SRC/tests/integration/elastic_torch.py" </dev/null
        echo "$output"
        assert_success
        # the shares of 64 at np=3: 22, 21, 21
        assert_output --regexp "elastic: lost rank $lost \([^)]*\) during step 5; the step's lost share \($((lost == 0 ? 22 : 21)) of 64 samples\) is missing"
        # counted, not as lines: under PYTHONUNBUFFERED=1 print writes the line and its newline
        # apart, and the launcher may put another rank's line in between
        [ "$(grep -o 'steps, loss' <<<"$output" | wc -l)" -eq 2 ] || fail "two survivors should finish"
        # the loss step's batch is the lost share short; every later step is the whole batch
        [ "$(grep -o 'loss [0-9.]*, parameters [-0-9.]*' <<<"$output" | sort -u | wc -l)" -eq 1 ] ||
            fail "the survivors' parameters differ"
        assert_output --partial "24 steps"
        # the last checkpoint, loaded on each survivor, holds those parameters
        [ "$(grep -o 'the checkpoint holds' <<<"$output" | wc -l)" -eq 2 ] || fail "two survivors should load it"
        [ "$(grep -o 'parameters [-0-9.]*' <<<"$output" | sort -u | wc -l)" -eq 1 ] ||
            fail "the checkpoint does not hold the survivors' parameters"
    done
}

@test "PyTorch with Adam: its state is not sharded where a rank may be lost, so the survivors train on" {
    # [optim] shard = auto would shard Adam's state: the lost rank's share went with it, and the
    # survivors' model collapsed (loss ln 2) while the job exited 0. Now auto is off here, and
    # the survivors' parameters are bitwise those of shard = off; shard = on ends the job at the
    # loss, as rank 0 says at the start
    local shard params=()
    for shard in auto off; do
        run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=60 KILL_RANK=1 OPT=adam \
            DPSHIM_OPTIM_SHARD=$shard DPSHIM_DIAG_LOG=info "$BUILD/bin/dpshim-run" -np 3 --oversubscribe \
            --enable-recovery /usr/bin/python3 "$SRC/tests/integration/elastic_torch.py" </dev/null
        echo "$output"
        assert_success
        [ "$(grep -o 'loss [0-9.]*, parameters [-0-9.]*' <<<"$output" | sort -u | wc -l)" -eq 1 ] ||
            fail "the survivors' parameters differ"
        params+=("$(grep -o 'parameters [-0-9.]*' <<<"$output" | head -1)")
        refute_output --partial "loss 0.693147"
        [ $shard = off ] || assert_output --partial "[optim] shard = auto is off: every rank keeps the whole optimizer state"
    done
    [ "${params[0]}" = "${params[1]}" ] || fail "auto (${params[0]}) is not off (${params[1]})"
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=60 KILL_RANK=1 OPT=adam \
        DPSHIM_OPTIM_SHARD=on "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery \
        /usr/bin/python3 "$SRC/tests/integration/elastic_torch.py" </dev/null
    echo "$output"
    assert_failure 75
    assert_output --partial "off, as [optim] shard = on keeps each rank's share of the optimizer's state on that rank alone"
}

@test "scale mode, rank 1 or rank 0 of 3 killed in an epoch, with or without DataLoader workers: the survivors train what it had not, once" {
    # 512 samples at np=3: shards of 171 (one sample twice), batches of 64, 64, 43; killed in
    # epoch 1's second step, after one batch: 107 left, 54 for each survivor (one twice)
    torch_scale_lost 107 "1 2 0" KILL_RANK=1
    torch_scale_lost 107 "1 2 0" KILL_RANK=0
    # two DataLoader workers (persistent: one iterator for every epoch) fetch 4 batches ahead, so
    # each epoch's sampler (3 batches here) has ended before its first step; rank 1 is killed in
    # epoch 1's last step, after two batches: its 43 left are shared out where the loop's pass ends
    torch_scale_lost 43 "1 2 0" KILL_RANK=1 KILL_STEP=6 WORKERS=2 PERSISTENT=1
}

@test "scale mode, a step of two batches (gradient accumulation) or two steps a batch (a GAN's two optimizers): what a lost rank trained is counted in batches" {
    # rank 1 killed before epoch 1's third batch: its first two are trained (one step of two
    # batches, or two steps each), its last 43 are not. Counted in steps, the first trained 64
    # samples twice and the second lost 43
    torch_scale_lost 43 "1 2 0" KILL_RANK=1 KILL_STEP=6 ACCUMULATE=2
    torch_scale_lost 43 "1 2 0" KILL_RANK=1 KILL_STEP=6 TWO_STEPS=1
    # steps of two batches that carry what is left into the next step: rank 1 killed before its
    # second batch (none stepped: its 171 shared out, 86 each), rank 2 before its first batch of
    # that share, its last batch of the shard (43) given to a step that never ended: those 43
    # and its 86 go to rank 0. Counted as done where the survivors asked for the rest, the 43
    # were lost
    torch_scale_lost 171 "2 0 0" KILL_RANK=1 KILL_STEP=2 KILL_ALSO=2:4 ACCUMULATE=2 CARRY=1
    grep -q "elastic: the 129 samples of this epoch the lost rank(s) had not trained are trained now" <<<"$job_output" ||
        fail "rank 2's 43 and 86 are not shared out"
}

@test "a C framework's epochs in scale mode (dp_epoch_rest), rank 1 or rank 0 of 3 killed, or a second rank in the share: every sample trained once" {
    local lost
    for lost in 1 0; do
        rm -f "$BATS_TEST_TMPDIR"/trained.*
        run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=60 DPSHIM_DATA_MODE=scale \
            TRACE="$BATS_TEST_TMPDIR/trained" "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery \
            "$BUILD/bin/elastic_epochs" 3 100 10 $lost 6 </dev/null
        echo "$output"
        assert_success
        # 100 samples at np=3: shards of 34 (two samples twice), 4 steps an epoch; killed as
        # epoch 1's second step starts, after one batch: 24 left, 12 for each survivor
        assert_output --partial "elastic: the 24 samples of this epoch the lost rank(s) had not trained are trained now, 12 by each survivor"
        [ "$(grep -c '^rank .*: 15 steps, 2 ranks$' <<<"$output")" -eq 2 ] || fail "two survivors should finish"
        trained_per_epoch "$BATS_TEST_TMPDIR/trained" 3
        assert_output "epoch 0: 100 samples, 2 twice
epoch 1: 100 samples, 2 twice
epoch 2: 100 samples, 0 twice"
    done
    # np=4, shards of 25 in 3 steps: rank 1 killed at step 2 (15 left, 5 for each survivor), then
    # rank 2 as the step of its share starts: the program asks again once its share is trained,
    # and gets its part of those 5 (3 each, one twice)
    rm -f "$BATS_TEST_TMPDIR"/trained.*
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=60 DPSHIM_DATA_MODE=scale \
        TRACE="$BATS_TEST_TMPDIR/trained" "$BUILD/bin/dpshim-run" -np 4 --oversubscribe --enable-recovery \
        "$BUILD/bin/elastic_epochs" 2 100 10 1 2 2 4 </dev/null
    echo "$output"
    assert_success
    assert_output --partial "the 15 samples of this epoch the lost rank(s) had not trained are trained now, 5 by each survivor"
    assert_output --partial "the 5 samples of this epoch the lost rank(s) had not trained are trained now, 3 by each survivor"
    trained_per_epoch "$BATS_TEST_TMPDIR/trained" 2
    assert_output "epoch 0: 100 samples, 1 twice
epoch 1: 100 samples, 0 twice"
}

@test "dp_epoch_rest: a loss in the first epoch, then rank 0 lost as it sends the list: every sample trained once" {
    # np=4, 400000 samples, batches of 5000: rank 1 is killed as step 2 starts, in the epoch drawn
    # before the job's first collective; at the shard's end rank 0 stops inside the broadcast of
    # the list of the 95000 samples rank 1 had not trained (its first ring send of 1/3 of it), so
    # the rank that takes its place sends the list
    rm -f "$BATS_TEST_TMPDIR"/trained.*
    run timeout --kill-after=10 "$MPI_TIMEOUT" env DPSHIM_GUARD_TIMEOUT=60 DPSHIM_DATA_MODE=scale \
        TRACE="$BATS_TEST_TMPDIR/trained" RING_STOP=0:1 "$BUILD/bin/dpshim-run" -np 4 --oversubscribe \
        --enable-recovery env LD_PRELOAD="$BUILD/lib/libring_faults.so:$SHIM" "$BUILD/bin/elastic_epochs" \
        1 400000 5000 1 2 </dev/null
    echo "$output"
    assert_success
    assert_output --partial "ring_faults: rank 0 stops in the ring step of its send"
    assert_output --partial "the job lost rank 0 in step 21, rank 1 in step 2 and went on with 2 of its 4 ranks"
    assert_output --partial "the 95000 samples of this epoch the lost rank(s) had not trained are trained now, 47500 by each survivor"
    trained_per_epoch "$BATS_TEST_TMPDIR/trained" 1
    assert_output "epoch 0: 400000 samples, 0 twice"
}

# Through mpirun itself (the ThreadSanitizer build runs this one: its runtime comes first in $SHIM):
# the watchdog finds the loss and carries the agreement while the main thread gives up its sum.
@test "the watchdog and the main thread through a loss: rank 1 of 3 killed during the sum at step 3" {
    run mpi 3 --enable-recovery env DPSHIM_GUARD_TIMEOUT=60 LD_PRELOAD="$SHIM" "$TRAIN" 6 1 3 during
    echo "$output"
    assert_output --regexp "elastic: lost rank 1 \([^)]*\) during step [3-6]"
    survivors_agree 2
}
