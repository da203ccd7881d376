#!/usr/bin/env bats
# [files] rank0_only and per_rank through every wrapped entry point, for C programs (plain and
# fortified builds), Python and shell children; unmatched paths behave exactly as without the
# shim; on rank0_only paths every rank sees what the program alone sees, and the tree ends as the
# program alone leaves it.
load helpers

# The files file_torture gated leaves for N ranks, and nothing else.
expected_tree() {
    local n=$1
    {
        printf '%s\n' append.ckpt ckpts ckpts/sub ckpts/sub/x.bin creat.ckpt creat64.ckpt excl.ckpt \
            fopen.ckpt fopen64.ckpt freopen.ckpt freopen64.ckpt open.ckpt open64.ckpt openat.ckpt \
            openat64.ckpt rename.ckpt renameat.ckpt renameat2.ckpt trunc.ckpt
        for r in $(seq 0 $((n - 1))); do printf 'train.rank%d.log\nplain.%d.txt\n' "$r" "$r"; done
    } | sort
}

torture() {
    local bin=$1 n=$2 dir=$BATS_TEST_TMPDIR/$1.$2
    mkdir -p "$dir"
    run mpi "$n" env DPSHIM_POLICY="$SRC/tests/integration/files/torture.conf" LD_PRELOAD="$SHIM" \
        "$BUILD/bin/$bin" gated "$dir"
    echo "$output"
    assert_success
    run bash -c "cd '$dir' && find . -mindepth 1 | sed 's|^\./||' | sort"
    assert_output "$(expected_tree "$n")"
    # every gated file holds what rank 0 wrote, complete
    for f in open open64 openat openat64 creat creat64 excl fopen fopen64 freopen freopen64 append rename renameat renameat2; do
        assert_equal "$(cat "$dir/$f.ckpt")" "$f by rank 0"
    done
    assert_equal "$(cat "$dir/trunc.ckpt")" "trunc"
    assert_equal "$(stat -c %a "$dir/trunc.ckpt")" 600
    for r in $(seq 0 $((n - 1))); do
        assert_equal "$(cat "$dir/train.rank$r.log")" "log by rank $r"
        assert_equal "$(cat "$dir/plain.$r.txt")" "plain by rank $r"
    done
}

@test "every entry point at np=3: plain build" { torture file_torture 3; }
@test "every entry point at np=2: -O2 -D_FORTIFY_SOURCE=2" { torture file_torture_fortify 2; }
@test "every entry point at np=4: -O2 -D_FORTIFY_SOURCE=2 -D_FILE_OFFSET_BITS=64" { torture file_torture_fortify64 4; }

@test "the fortified builds really call the fortified and 64-bit entry points" {
    run nm -D "$BUILD/bin/file_torture_fortify"
    assert_output --partial "__open_2"
    assert_output --partial "__openat_2"
    run nm -D "$BUILD/bin/file_torture_fortify64"
    for s in __open64_2 __openat64_2 open64 openat64 creat64 fopen64 freopen64 truncate64; do
        assert_output --partial " $s@"
    done
}

@test "threads writing gated and per-rank files at once (np=2): complete files, no temporaries" {
    local dir=$BATS_TEST_TMPDIR/threads
    mkdir -p "$dir"
    run mpi 2 env DPSHIM_POLICY="$SRC/tests/integration/files/torture.conf" LD_PRELOAD="$SHIM" \
        "$BUILD/bin/file_torture" threads "$dir"
    assert_success
    run bash -c "cd '$dir' && ls -A | sort"
    assert_output "$(for t in 0 1 2 3 4 5 6 7; do printf 't%d.ckpt\nt%d.rank0.log\nt%d.rank1.log\n' $t $t $t; done | sort)"
    for t in 0 1 2 3 4 5 6 7; do
        # the last round, complete, by rank 0
        assert_equal "$(sort -u "$dir/t$t.ckpt")" "thread $t round 49 by rank 0"
        assert_equal "$(wc -l <"$dir/t$t.ckpt")" 100
        assert_equal "$(wc -l <"$dir/t$t.rank1.log")" 50
    done
}

# errno_run BIN DIR [ENV...]: the unmatched-path calls, their results and errno.
errno_run() {
    local bin=$1 dir=$2
    shift 2
    rm -rf "$dir" && mkdir -p "$dir"
    env "$@" "$BUILD/bin/$bin" errno "$dir"
}

@test "unmatched paths: same return values and errno as without the shim, on rank 0 and rank 1" {
    for bin in file_torture file_torture_fortify64; do
        plain=$(errno_run $bin "$BATS_TEST_TMPDIR/plain")
        assert_equal "$(grep -c 'errno_kept=1' <<<"$plain")" 2
        shimmed=$(errno_run $bin "$BATS_TEST_TMPDIR/shim" LD_PRELOAD="$SHIM" \
            DPSHIM_FILES_RANK0_ONLY='*.ckpt ckpts/** /abs/**' DPSHIM_FILES_PER_RANK='*.log')
        assert_equal "$shimmed" "$plain"
        # rank 1 of 2, where gating is active (the launcher's environment names the rank: that of
        # srun --mpi=pmix, since Open MPI's counts only with a live launcher behind it)
        rank1=$(errno_run $bin "$BATS_TEST_TMPDIR/r1" LD_PRELOAD="$SHIM" SLURM_PROCID=1 \
            SLURM_NTASKS=2 PMIX_SERVER_URI2=unused DPSHIM_FILES_RANK0_ONLY='*.ckpt ckpts/** /abs/**' DPSHIM_FILES_PER_RANK='*.log')
        assert_equal "$rank1" "$plain"
    done
}

@test "the example trainer at np=4: one checkpoint, rank 0's, and one log per rank" {
    cd "$BATS_TEST_TMPDIR"
    mkdir gated own
    # the reference: the same job with every rank saving its own file
    run train_np 4 "$BATS_TEST_TMPDIR/own" --steps 20 --no-eval
    assert_success
    cd gated
    printf '[files]\nrank0_only = *.ckpt\nper_rank = *.log\n' >dpshim.conf
    run mpi 4 env LD_PRELOAD="$SHIM" "$TRAINER" --steps 20 --no-eval --save model.ckpt --log train.log
    assert_success
    run ls
    assert_output "$(printf '%s\n' dpshim.conf model.ckpt train.rank0.log train.rank1.log train.rank2.log train.rank3.log)"
    for r in 0 1 2 3; do assert_equal "$(cut -d' ' -f1-4 train.rank$r.log)" "epoch 1 steps 20"; done
    run "$CKPT" same model.ckpt ../own/rank0.ckpt
    assert_success
    run "$CKPT" diff model.ckpt ../own/rank3.ckpt
    assert_success
}

@test "the example trainer's checkpoint is byte-identical to the single-process one (before any step)" {
    cd "$BATS_TEST_TMPDIR"
    "$TRAINER" --steps 0 --epochs 0 --no-eval --seed 3 --save single.ckpt >/dev/null
    mkdir dist && cd dist
    run mpi 4 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" --epochs 0 --no-eval --seed 3 --save model.ckpt
    assert_success
    run cmp model.ckpt ../single.ckpt
    assert_success
}

@test "per_rank logs written by the trainer's children (a shell) land per rank" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 3 env DPSHIM_FILES_PER_RANK='*.log' LD_PRELOAD="$SHIM" sh -c 'echo "child of $OMPI_COMM_WORLD_RANK" >out.log; cp out.log copy.log'
    assert_success
    for r in 0 1 2; do
        assert_equal "$(cat out.rank$r.log)" "child of $r"
        assert_equal "$(cat copy.rank$r.log)" "child of $r"
    done
    run ls
    assert_output "$(printf 'copy.rank0.log\ncopy.rank1.log\ncopy.rank2.log\nout.rank0.log\nout.rank1.log\nout.rank2.log\n')"
}

@test "a shell child of the rank process (system(\"cp ...\")) keeps its rank's file policy" {
    cd "$BATS_TEST_TMPDIR"
    echo data >src.txt
    cat >prog.sh <<'SH'
cp src.txt copy.ckpt
mkdir -p ckdir
sh -c 'echo "$OMPI_COMM_WORLD_RANK" >ckdir/who.ckpt'
SH
    run mpi 3 env DPSHIM_FILES_RANK0_ONLY='*.ckpt ckdir' LD_PRELOAD="$SHIM" sh prog.sh
    assert_success
    assert_equal "$(cat copy.ckpt)" data
    assert_equal "$(cat ckdir/who.ckpt)" 0
}

@test "Python: open, os.rename, shutil.copy, os.makedirs under the file policy" {
    [ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
    cd "$BATS_TEST_TMPDIR"
    cat >prog.py <<'PY'
import ctypes, os, shutil
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
one = ctypes.c_double(1)  # a trainer's first collective comes before its files
ctypes.CDLL(None).dp_metric(ctypes.byref(one), ctypes.c_size_t(1), 0)
os.makedirs("runs/exp1", exist_ok=True)
with open("runs/exp1/model.ckpt", "w") as f:
    f.write(f"weights from rank {rank}\n")
with open(f"tmp.{rank}", "w") as f:
    f.write(f"best from rank {rank}\n")
os.rename(f"tmp.{rank}", "runs/exp1/best.ckpt")
shutil.copy("runs/exp1/model.ckpt" if rank == 0 else "/etc/hostname", "runs/exp1/copy.ckpt")
with open("metrics.log", "w") as f:
    f.write(f"metrics of rank {rank}\n")
with open("metrics.log") as f:
    assert f.read() == f"metrics of rank {rank}\n"
print("python ok", rank)
PY
    run mpi 3 env DPSHIM_FILES_RANK0_ONLY='runs runs/** *.ckpt' DPSHIM_FILES_PER_RANK='*.log' \
        LD_PRELOAD="$SHIM" /usr/bin/python3 prog.py
    echo "$output"
    assert_success
    assert_equal "$(count 'python ok')" 3
    run bash -c "find . -mindepth 1 -not -name 'prog.py' | sort"
    assert_output "$(printf '%s\n' ./metrics.rank0.log ./metrics.rank1.log ./metrics.rank2.log ./runs ./runs/exp1 \
        ./runs/exp1/best.ckpt ./runs/exp1/copy.ckpt ./runs/exp1/model.ckpt)"
    assert_equal "$(cat runs/exp1/model.ckpt)" "weights from rank 0"
    assert_equal "$(cat runs/exp1/best.ckpt)" "best from rank 0"
    assert_equal "$(cat runs/exp1/copy.ckpt)" "weights from rank 0"
}

# The tree under DIR as `find` and `stat` see it: type, mode, link target and content of each
# entry, per_rank logs aside (their names carry the rank by design).
tree() {
    (cd "$1" && find . -mindepth 1 -not -name '*.log' | sort | while read -r p; do
        printf '%s %s %s %s\n' "$p" "$(stat -c '%F %a' "$p")" "$(readlink "$p")" \
            "$([ -f "$p" ] && [ ! -L "$p" ] && md5sum <"$p" | cut -c1-12)"
    done)
}

# semantics BIN N [early]: file_semantics alone without the shim, then at np=N with it; every
# rank's report and the tree must be the run alone's.
semantics() {
    local bin=$1 n=$2 mode=${3:-} alone=$BATS_TEST_TMPDIR/alone shim=$BATS_TEST_TMPDIR/shim
    mkdir -p "$alone/ckpts" "$shim/ckpts"
    "$BUILD/bin/$bin" "$alone" "$BATS_TEST_TMPDIR/alone.report" $mode
    run mpi "$n" env DPSHIM_POLICY="$SRC/tests/integration/files/semantics.conf" LD_PRELOAD="$SHIM" \
        "$BUILD/bin/$bin" "$shim" "$BATS_TEST_TMPDIR/shim.report" $mode
    echo "$output"
    assert_success
    for r in $(seq 0 $((n - 1))); do
        run diff "$BATS_TEST_TMPDIR/alone.report.rank0" "$BATS_TEST_TMPDIR/shim.report.rank$r"
        echo "rank $r: $output"
        assert_success
    done
    run diff <(tree "$alone") <(tree "$shim")
    echo "$output"
    assert_success
    # one per_rank log per rank inside the rank0_only directory rank 0 made
    run ls "$shim/ckpts/logs"
    assert_output "$(for r in $(seq 0 $((n - 1))); do echo "train.rank$r.log"; done)"
}

@test "rank0_only paths at np=3: every rank sees every outcome the program alone sees; the tree ends as alone" {
    semantics file_semantics 3
}
@test "rank0_only paths at np=2, -O2 -D_FORTIFY_SOURCE=2: as the program alone" { semantics file_semantics_fortify 2; }
@test "rank0_only paths at np=4, fortified, 64-bit offsets: as the program alone" { semantics file_semantics_fortify64 4; }

# Before the job's first collective too: the first gated call opens the backend, so O_EXCL on a
# file rank 0 has, a folder rank 0 has not made yet, a missing file, a save through a temporary
# and a per_rank log in a rank0_only folder made just before all come out as alone.
@test "rank0_only paths before the first collective at np=3: as the program alone" { semantics file_semantics 3 early; }
@test "rank0_only paths before the first collective at np=2, fortified, 64-bit offsets: as alone" {
    semantics file_semantics_fortify64 2 early
}

# Only a program that calls hooks opens the backend at a gated call: a wrapper (a shell line)
# that writes a rank0_only file before it starts the trainer leaves the rank's place to it.
@test "a shell line that writes a rank0_only file, then starts the trainer: the trainer is the rank (np=2)" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" sh -c 'echo started >run.ckpt; "$@"; echo shell done' \
        sh "$TRAINER" --steps 5 --no-eval --save m.ckpt
    echo "$output"
    assert_success
    refute_output --partial "nothing was distributed"
    refute_output --partial "children never enter collectives"
    assert_equal "$(count "shell done")" 2
    assert_equal "$(cat run.ckpt)" started
}

@test "the save-to-temporary idiom with a temporary no glob matches: every save lands, and the policy says what to add" {
    cd "$BATS_TEST_TMPDIR"
    # Every rank writes the same weights, as in a real job. The first save goes through a
    # temporary every rank writes (the policy cannot know it yet): it lands, and so does the
    # second, which a slow rank's first write may still reach. From each rank's first rename on
    # the temporary is rank 0's, so from the third save on each is read back whole on every
    # rank: that save, or a later one where rank 0 is ahead (no training step between the saves
    # here), never an older one.
    cat >save.py <<'PY'
import ctypes, os
# a trainer's first collective (through the hook ABI) comes before its first save
one = ctypes.c_double(1)
ctypes.CDLL(None).dp_metric(ctypes.byref(one), ctypes.c_size_t(1), 0)
later = []
for i in range(5):
    with open("ckpt.tmp", "w") as f:
        f.write("weights %d\n" % i)
    os.rename("ckpt.tmp", "ckpt.pt")
    exists = os.path.exists("ckpt.pt")
    if i > 1:
        text = open("ckpt.pt").read()
        later.append(text in ["weights %d\n" % j for j in range(i, 5)])
    else:
        first = first and exists if i else exists
print("saved %s %s" % (first, later))
PY
    [ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
    run mpi 4 env DPSHIM_FILES_RANK0_ONLY='*.pt' LD_PRELOAD="$SHIM" /usr/bin/python3 save.py
    echo "$output"
    assert_success
    assert_equal "$(count 'saved True [True, True, True]')" 4
    assert_output --partial "[files] ckpt.tmp is renamed onto ckpt.pt, which rank0_only matches, but no glob matches ckpt.tmp"
    assert_equal "$(cat ckpt.pt)" "weights 4"
}

@test "a rank0_only file open when the job gets SIGTERM keeps what rank 0 wrote" {
    cd "$BATS_TEST_TMPDIR"
    cat >metrics.sh <<'SH'
exec 3>metrics.csv
echo "epoch,loss" >&3
echo "1,0.5" >&3
sleep 30
SH
    mpi 2 env DPSHIM_FILES_RANK0_ONLY='*.csv' LD_PRELOAD="$SHIM" sh metrics.sh 3>&- &
    local i
    for i in $(seq 100); do [ "$(cat metrics.csv 2>/dev/null | wc -l)" = 2 ] && break; sleep 0.1; done
    pkill -TERM -f '^sh metrics.sh' || true
    wait || true
    assert_equal "$(cat metrics.csv)" "$(printf 'epoch,loss\n1,0.5')"
    run ls -A
    assert_output "$(printf 'metrics.csv\nmetrics.sh\n')"
}

# A gated file call that only rank 0 can answer, made where rank 0 never makes it: a decision only
# one rank has (a rank-dependent branch, a time budget that ends the loop on one rank first, an
# rmdir on some ranks). The waiting rank asks rank 0 where it is and ends the job at once, with
# the default [guard] timeout of 300 s.
@test "a gated file call rank 0 never makes: the job ends within 10 s, naming both ranks' places" {
    [ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
    cd "$BATS_TEST_TMPDIR"
    cat >one_rank.py <<'PY'
import ctypes, os, sys
hooks, one = ctypes.CDLL(None), ctypes.c_double(1)
collective = lambda: hooks.dp_metric(ctypes.byref(one), ctypes.c_size_t(1), 0)
rank0 = os.environ["OMPI_COMM_WORLD_RANK"] == "0"
collective()
if sys.argv[1] == "branch" and not rank0:   # code that depends on the rank
    open("others.ckpt", "w").write("x")
elif sys.argv[1] == "budget":               # the time budget ran out on rank 0 one epoch later
    for epoch in range(3 if rank0 else 2):
        collective()
        open("model.ckpt", "w").write("epoch %d" % epoch)
    open("final.ckpt", "w").write("done")
elif sys.argv[1] == "rmdir" and not rank0:
    os.rmdir("ckpts/old")
collective()
PY
    mkdir -p ckpts/old
    for case in branch budget rmdir; do
        for n in 2 4; do
            local start=$SECONDS
            run mpi $n env DPSHIM_FILES_RANK0_ONLY='*.ckpt ckpts/**' LD_PRELOAD="$SHIM" /usr/bin/python3 one_rank.py $case
            echo "$case np=$n: $((SECONDS - start)) s"
            echo "$output"
            assert_equal "$status" 75
            [ $((SECONDS - start)) -le 10 ] || fail "$case np=$n took $((SECONDS - start)) s"
            assert_output --regexp "guard: rank [1-3] is in the shim's wait for rank 0's file operation #[0-9]+ \((open for writing|rmdir) [^)]*\).*, while rank 0 is in .*: neither can go on"
            assert_output --partial "a decision only one rank has"
        done
    done
    # rank 0 saved the epochs it finished, and never reached what the others waited for
    [ ! -e others.ckpt ] && [ -d ckpts/old ] && [ "$(cat model.ckpt)" = "epoch 1" ] && [ ! -e final.ckpt ]
}

# small_disk SIZE DIR OUT N ARGS...: mpirun -np N ARGS with a tmpfs of SIZE mounted at DIR, in a
# mount namespace of the test's own; what DIR holds at the end is copied to OUT.
small_disk() {
    local size=$1 dir=$2 out=$3
    shift 3
    mkdir -p "$dir" "$out"
    timeout --kill-after=10 "$MPI_TIMEOUT" unshare -m sh -c 'size=$1 dir=$2 out=$3; shift 3
        mount -t tmpfs -o size="$size" tmpfs "$dir" || exit 99
        mpirun --oversubscribe -np "$@"; rc=$?
        cp -a "$dir/." "$out/"; exit $rc' sh "$size" "$dir" "$out" "$@" </dev/null
}

saves_setup() {
    [ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
    unshare -m true 2>/dev/null || skip "no mount namespaces here (needs root)"
    cd "$BATS_TEST_TMPDIR"
    SAVES=$SRC/tests/integration/files/saves.py
    GATED='*.pt *.npy *.bin *.tmp'
}

# Where rank 0's file lies there is room for one copy of each save: the other ranks' stand-ins
# are in memory, so every rank's save succeeds and rank 0's files are the ones saved alone.
@test "gated saves need room for one copy only: torch.save, np.save, fwrite, tmp+replace at np=2, 4, 8" {
    saves_setup
    mkdir alone && /usr/bin/python3 "$SAVES" alone held
    local room=$(($(du -B1 -s alone | cut -f1) + 16384)) n # less than a second copy of any file
    for n in 2 4 8; do
        run small_disk "$room" disk$n out$n "$n" env DPSHIM_FILES_RANK0_ONLY="$GATED" LD_PRELOAD="$SHIM" \
            /usr/bin/python3 "$SAVES" disk$n held
        echo "np=$n: $output"
        assert_success
        refute_output --partial failed
        assert_equal "$(count ' ok')" $((6 * n))
        assert_equal "$(ls out$n)" "$(ls alone)"
        local f
        for f in held.bin zip.pt array.npy fwrite.bin replaced.pt; do cmp "alone/$f" "out$n/$f"; done
        # the legacy format names storages by address: equal as loaded
        /usr/bin/python3 -c 'import sys, torch; a, b = (torch.load(p)["w"] for p in sys.argv[1:]); assert torch.equal(a, b)' \
            alone/legacy.pt out$n/legacy.pt
    done
}

# full_disk N MODE: saves.py MODE at np=N on a 16 KiB file system, in diskN (kept in outN);
# rank 0 is left short, so the job exits 74.
full_disk() {
    run small_disk 16k disk$1 out$1 "$1" env DPSHIM_FILES_RANK0_ONLY="$GATED" LD_PRELOAD="$SHIM" \
        /usr/bin/python3 "$SAVES" disk$1 "$2"
    echo "np=$1: $output"
    assert_equal "$status" 74
}

# A save that fails on rank 0 (the disk is full) fails on every rank, so `except` runs on all of
# them or none; the truncated files rank 0 was left with end the job with status 74, naming them.
@test "a gated save that fails on rank 0 fails on every rank, and the job does not exit 0" {
    saves_setup
    local n
    for n in 2 4; do
        full_disk $n fail
        refute_output --partial " ok"
        assert_equal "$(grep -oE 'rank [0-9]+ [a-z]+\.[a-z]+ failed' <<<"$output" | wc -l)" $((3 * n))
        assert_output --regexp "\[files\] [^ ]*/legacy.pt is 16384 bytes, short of the 403[0-9]{2} the program wrote to it: its write failed \(No space left on device\)"
        # the same exception on every rank: what rank 0's failed write raised (fwrite's too)
        local f
        for f in legacy.pt array.npy fwrite.bin; do
            assert_equal "$(grep -oE "rank [0-9]+ $f failed [A-Za-z]+ [-0-9]+" <<<"$output" | cut -d' ' -f3- | sort -u | wc -l)" 1
        done
    done
}

# Each write rank 0 makes returns on every rank what it returned on rank 0: the same count for a
# short write, the same errno at the same call, before and after a collective.
@test "a gated write that fails on rank 0 fails at the same call with the same errno on every rank" {
    saves_setup
    local n
    for n in 2 4; do
        full_disk $n writes
        local said=$(grep -oE 'rank [0-9]+ writes: ([0-9]+ |ENOSPC ?)+' <<<"$output" | sed 's/ $//' | cut -d' ' -f4- | sort | uniq -c)
        assert_equal "$(echo $said)" "$n 3000 3000 3000 3000 3000 1384 ENOSPC ENOSPC ENOSPC ENOSPC ENOSPC"
        assert_equal "$(stat -c %s out$n/writes.bin)" 16384
    done
}

# A rank's writes wait for rank 0's of the same bytes; where rank 0 writes fewer (content that
# differs by rank), rank 0's next collective ends the wait, without the guard.
@test "gated writes that differ by rank: no wait outlasts rank 0's next collective" {
    saves_setup
    local n start
    for n in 2 4; do
        start=$SECONDS
        run mpi $n env DPSHIM_FILES_RANK0_ONLY="$GATED" LD_PRELOAD="$SHIM" /usr/bin/python3 "$SAVES" . differ
        echo "np=$n: $output"
        assert_success
        assert_equal "$(count 'differ.tmp ok')" "$n"
        refute_output --partial guard
        [ $((SECONDS - start)) -le 15 ] || fail "np=$n took $((SECONDS - start)) s"
        assert_equal "$(wc -l <differ.tmp)" 50
        assert_equal "$(grep -c x <differ.tmp)" 50
    done
}

# A rank's stand-in keeps [files] standin_mb of what it writes; past that, size and offsets only.
@test "a stand-in keeps at most [files] standin_mb in memory; rank 0's file is whole" {
    saves_setup
    run mpi 2 env DPSHIM_FILES_RANK0_ONLY="$GATED" DPSHIM_FILES_STANDIN_MB=1 LD_PRELOAD="$SHIM" \
        /usr/bin/python3 "$SAVES" . bound
    echo "$output"
    assert_success
    assert_equal "$(count ' ok')" 2
    local kept=$(sed -n 's/.*rank 1 size 3145728 kept \([0-9]*\).*/\1/p' <<<"$output")
    [ -n "$kept" ] && [ "$kept" -le $((1024 * 1024 + 65536)) ] || fail "rank 1's stand-in kept ${kept:-?} bytes"
    assert_output --partial "rank 0 size 3145728 kept 3145728"
    assert_equal "$(stat -c %s bound.bin)" 3145728
    assert_equal "$(tail -c 65536 bound.bin | od -An -v -tu1 | tr -s ' \n' '\n' | sort -u | grep -v '^$')" 47
}

# fprintf, vfprintf, fputc and putc (and the fortified and _unlocked names a compiler emits for
# them) on a gated stream pair by call as fwrite does: where the disk fills, each call returns on
# every rank what it returns alone (rank 0's -1 and ENOSPC on the others too, whose stand-ins
# are in memory), with the stream's error indicator; the job then exits 74 for rank 0's short file.
@test "fprintf, vfprintf, fputc, putc on a full disk: every rank's results are the program alone's (plain, fortified)" {
    unshare -m true 2>/dev/null || skip "no mount namespaces here (needs root)"
    cd "$BATS_TEST_TMPDIR"
    local bin r
    for bin in file_semantics file_semantics_fortify; do
        mkdir -p "alone.$bin" "kept.$bin"
        timeout 60 unshare -m sh -c 'mount -t tmpfs -o size=16k tmpfs "$1" && "$2" "$1" "$3" full; cp -a "$1/." "$4/"' \
            sh "$PWD/alone.$bin" "$BUILD/bin/$bin" "$PWD/alone.$bin.report" "kept.$bin"
        grep -q '^call .*No space left on device' "alone.$bin.report.rank0" # the disk did fill
        run small_disk 16k "disk.$bin" "out.$bin" 2 env DPSHIM_POLICY="$SRC/tests/integration/files/semantics.conf" \
            LD_PRELOAD="$SHIM" "$BUILD/bin/$bin" "$PWD/disk.$bin" "$PWD/shim.$bin.report" full
        echo "$bin: $output"
        assert_equal "$status" 74
        for r in 0 1; do
            run diff "alone.$bin.report.rank0" "shim.$bin.report.rank$r"
            echo "$bin rank $r: $output"
            assert_success
        done
        cmp "out.$bin/ckpts/stdio.bin" "kept.$bin/ckpts/stdio.bin" # rank 0's file is the one alone left
    done
}
