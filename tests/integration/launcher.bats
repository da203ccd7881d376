#!/usr/bin/env bats
# dpshim-run, the launcher: the line it prints and runs (the library by its full path, no one-core
# binding, the root variables where needed, the policy and DPSHIM_* variables passed on), its
# refusals, and jobs it starts from the build tree, a prefix install and as another user. The
# Debian package's copy is tested in install.bats, srun's in slurm.bats.
load helpers

RUN=$BUILD/bin/dpshim-run

# line ARGS...: the line dpshim-run prints for ARGS (--dry-run), without its "dpshim-run: " prefix.
line() { "$RUN" --dry-run "$@" 2>&1 | sed -n 's/^dpshim-run: //p'; }

@test "dpshim-run -np 2 PROGRAM: a data-parallel job, with the line it runs printed first" {
    cd "$BATS_TEST_TMPDIR"
    run timeout --kill-after=10 "$MPI_TIMEOUT" env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
        "$RUN" -np 2 --oversubscribe "$BUILD/bin/guard_faults" 3
    echo "$output"
    assert_success
    local root=
    [ "$(id -u)" != 0 ] || root="OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
    assert_line "dpshim-run: ${root}mpirun --bind-to none -np 2 --oversubscribe env LD_PRELOAD=$(readlink -f "$SHIM") $BUILD/bin/guard_faults 3"
    # distributed: both ranks summed over 2 ranks, and rank 0's summary
    assert_output --partial "rank 0 finished 3 steps, 2 ranks"
    assert_output --partial "rank 1 finished 3 steps, 2 ranks"
    assert_output --partial "SUMMARY 2 ranks on 1 host"
}

@test "dpshim-run's line: the user's binding, options and arguments kept, the policy and variables passed on" {
    cd "$BATS_TEST_TMPDIR"
    local lib
    lib=$(readlink -f "$SHIM")
    # a binding of the user's own: no --bind-to none; the program's own options stay its own
    run line -np 4 --bind-to core --map-by socket ./train.py --epochs 3 -x 1
    assert_output --regexp "mpirun -np 4 --bind-to core --map-by socket env LD_PRELOAD=$lib ./train.py --epochs 3 -x 1\$"
    run line -np 2 --map-by ppr:1:node:PE=2 ./t
    assert_output --regexp "mpirun -np 2 --map-by ppr:1:node:PE=2 env "
    run line -np 2 --mca btl self,vader -H a,b python3 t.py "a b"
    assert_output --regexp "mpirun --bind-to none -np 2 --mca btl self,vader -H a,b env LD_PRELOAD=$lib python3 t.py a\\\\ b\$"
    # DPSHIM_* variables to every node; a relative DPSHIM_POLICY made absolute
    printf '[output]\nstdout = rank0\n' >p.conf
    run env DPSHIM_POLICY=p.conf DPSHIM_DATA_MODE=scale "$RUN" --dry-run -np 2 ./t
    assert_output --regexp "DPSHIM_POLICY=$BATS_TEST_TMPDIR/p.conf mpirun --bind-to none -np 2 -x DPSHIM_DATA_MODE -x DPSHIM_POLICY env "
    # ./dpshim.conf, found where the job starts, named for every rank
    mv p.conf dpshim.conf
    run line -np 2 ./t
    assert_output --regexp "DPSHIM_POLICY=$BATS_TEST_TMPDIR/dpshim.conf mpirun --bind-to none -np 2 -x DPSHIM_POLICY env "
    rm dpshim.conf
    # an option this tool does not know ends with '--' before the program
    run line -np 2 --some-new-option value -- ./t
    assert_output --regexp "mpirun --bind-to none -np 2 --some-new-option value env LD_PRELOAD=$lib ./t\$"
    # srun: its own words
    run line --launcher srun -np 3 -l ./t
    assert_output "srun --mpi=pmix --cpu-bind=none -n 3 -l env LD_PRELOAD=$lib ./t"
    run line --launcher srun -n3 --cpu-bind=cores ./t
    assert_output "srun --mpi=pmix -n3 --cpu-bind=cores env LD_PRELOAD=$lib ./t"
}

@test "dpshim-run refuses what would go wrong: a library that does not load, no rank count, an unknown option" {
    cd "$BATS_TEST_TMPDIR"
    run "$RUN" --lib /etc/passwd -np 2 "$BUILD/bin/guard_faults" 3
    assert_failure 2
    assert_output --partial "dpshim-run: /etc/passwd does not load: "
    assert_output --partial "cannot be preloaded"
    refute_output --partial "finished"
    run env DPSHIM_LIB=$BATS_TEST_TMPDIR/none.so "$RUN" -np 2 ./t
    assert_failure 2
    assert_output "dpshim-run: --lib $BATS_TEST_TMPDIR/none.so: no such file"
    run "$RUN" ./t
    assert_failure 2
    assert_output --partial "give -np N"
    run "$RUN" -np 2 --frob 3 ./t
    assert_failure 2
    assert_output --partial "--frob: not an option of mpirun that this tool knows; end the launcher's options with '--'"
    run "$RUN" --launcher torchrun -np 2 ./t
    assert_failure 2
    assert_output --partial "unknown; use mpirun or srun"
    run "$RUN" -np 2
    assert_failure 2
    assert_output --partial "no program to run"
    run "$RUN" --help
    assert_success
    assert_output --partial "usage: dpshim-run"
}

@test "dpshim-run from a prefix install finds its own library, with nothing on the loader's path" {
    local stage=$BATS_TEST_TMPDIR/stage
    cmake --install "$BUILD" --prefix "$stage" >/dev/null
    cd "$BATS_TEST_TMPDIR"
    # the mission's line with the bare name: the loader finds no libdpshim.so, ignores the
    # preload, and every rank runs alone (the pitfall dpshim-run avoids)
    run mpi 2 env LD_PRELOAD=libdpshim.so "$BUILD/bin/guard_faults" 3
    assert_output --partial "cannot be preloaded"
    run timeout --kill-after=10 "$MPI_TIMEOUT" "$stage/bin/dpshim-run" -np 2 --oversubscribe "$BUILD/bin/guard_faults" 3
    echo "$output"
    assert_success
    local lib
    lib=$(find "$stage" -name libdpshim.so)
    assert_output --partial "env LD_PRELOAD=$lib $BUILD/bin/guard_faults 3"
    assert_output --partial "rank 1 finished 3 steps, 2 ranks"
    refute_output --partial "cannot be preloaded"
}

@test "dpshim-run as a user other than root: no root variables, the job runs" {
    [ "$(id -u)" = 0 ] || skip "needs root to become another user"
    command -v setpriv >/dev/null || skip "no setpriv (util-linux)"
    # an install and a program in a directory the user can reach (bats's and the build tree's
    # may be root's alone)
    local home
    home=$(mktemp -d /tmp/dpshim-run-nobody.XXXXXX)
    cmake --install "$BUILD" --prefix "$home/stage" >/dev/null
    cp "$BUILD/bin/guard_faults" "$home/"
    chmod -R a+rX "$home" && chmod 777 "$home"
    cd "$home"
    run timeout --kill-after=10 "$MPI_TIMEOUT" setpriv --reuid=nobody --regid=nogroup --clear-groups \
        env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM HOME="$home" \
        "$home/stage/bin/dpshim-run" -np 2 --oversubscribe ./guard_faults 3
    echo "$output"
    local lib
    lib=$(find "$home/stage" -name libdpshim.so)
    cd / && rm -rf "$home"
    assert_success
    assert_line "dpshim-run: mpirun --bind-to none -np 2 --oversubscribe env LD_PRELOAD=$lib ./guard_faults 3"
    assert_output --partial "rank 1 finished 3 steps, 2 ranks"
}

# recovered RUN-ARGS...: dpshim-run under mpirun's recovery mode, whose own status is 0 whatever
# the ranks return.
recovered() {
    run timeout --kill-after=10 "$MPI_TIMEOUT" "$RUN" -np "$@" </dev/null
    echo "$output"
    # the folders dpshim-run made, for the test to check they are gone
    grep -o 'DPSHIM_STATUS_DIR=[^ ]*' <<<"$output" | cut -d= -f2 >>"$BATS_TEST_TMPDIR/status_dirs" || true
}

@test "mpirun --enable-recovery: dpshim-run exits with the ranks' status, not the launcher's 0" {
    cd "$BATS_TEST_TMPDIR"
    local exit3=(/usr/bin/python3 -c 'raise SystemExit(3)')
    # the launcher alone: 0, which is why dpshim-run reads the ranks' own
    run timeout --kill-after=10 "$MPI_TIMEOUT" mpirun --oversubscribe --enable-recovery -np 2 \
        env LD_PRELOAD="$SHIM" "${exit3[@]}"
    assert_success
    recovered 2 --oversubscribe --enable-recovery "${exit3[@]}"
    assert_failure 3
    assert_output --partial "dpshim-run: the job failed: rank 0 exited with status 3"
    recovered 2 --oversubscribe --enable-recovery "$BUILD/bin/guard_faults" 3
    assert_success
    assert_output --regexp "mpirun --bind-to none -np 2 --oversubscribe --enable-recovery -x DPSHIM_STATUS_DIR env "
    # rank 2 killed, with [elastic] lost_rank = end: the guard ends the others with 75, and so does
    # the job (elastic.bats has the job that goes on, and exits 0)
    DPSHIM_ELASTIC_LOST_RANK=end DPSHIM_GUARD_TIMEOUT=60 recovered 3 --oversubscribe --enable-recovery \
        "$BUILD/bin/guard_faults" 10 kill 2 4
    assert_failure 75
    assert_output --partial "dpshim-run: the job failed: rank 0 exited with status 75"
    # the folders it made are gone again
    [ "$(wc -l <"$BATS_TEST_TMPDIR/status_dirs")" -eq 3 ] || fail "dpshim-run did not name its three folders"
    local dir
    while read -r dir; do [ ! -e "$dir" ] || fail "$dir is left"; done <"$BATS_TEST_TMPDIR/status_dirs"
}

@test "dpshim-run --enable-recovery: a rank that leaves no status is named; a folder given is cleared; a bad one is refused" {
    cd "$BATS_TEST_TMPDIR"
    mkdir shared
    # rank 1 is killed after its last collective: rank 0 finishes with 0, rank 1 leaves nothing
    DPSHIM_STATUS_DIR=shared DPSHIM_GUARD_TIMEOUT=60 recovered 2 --oversubscribe --enable-recovery \
        "$BUILD/bin/guard_faults" 3 kill 1 4
    assert_output --partial "rank 0 finished 3 steps, 2 ranks"
    assert_failure 75
    assert_output --partial "dpshim-run: rank(s) 1 left no exit status in $BATS_TEST_TMPDIR/shared: lost"
    # the folder again, with an earlier job's marks of a lost rank 1 and of a guard's end: rank
    # 1's exit 3 now is the job's, and nothing is ended early
    touch shared/lost.1 shared/end.0
    DPSHIM_STATUS_DIR=shared recovered 2 --oversubscribe --enable-recovery /usr/bin/python3 -c \
        'import os, time; time.sleep(12); raise SystemExit(3 * int(os.environ["OMPI_COMM_WORLD_RANK"]))'
    assert_failure 3
    assert_output --partial "dpshim-run: the job failed: rank 1 exited with status 3"
    refute_output --partial "ending it"
    DPSHIM_STATUS_DIR=/nonexistent recovered 2 --enable-recovery /bin/true
    assert_failure 2
    assert_output --partial "DPSHIM_STATUS_DIR=/nonexistent: not a folder this user can write to"
    # a job the launcher cannot start (one slot, two ranks): its own status and message, not lost ranks
    recovered 2 --host localhost:1 --enable-recovery /bin/true
    assert_failure 1
    assert_output --partial "dpshim-run: mpirun exited with status 1 and no rank left an exit status: it could not start the job"
    refute_output --partial "left no exit status in"
    # ranks that ran without the shim (a node where it does not load) leave no status: said so
    recovered 2 --oversubscribe --enable-recovery env LD_PRELOAD=/nonexistent/libdpshim.so /bin/true
    assert_failure 75
    assert_output --partial "cannot be preloaded"
    assert_output --partial "dpshim-run: rank(s) 0 1 left no exit status in"
    assert_output --partial "run without libdpshim.so (the loader says why above)"
    # stopped by a signal (Ctrl-C, scancel): said as such, not as lost ranks; sent to the whole
    # process group (as timeout does), and to dpshim-run alone, which passes it on: either way
    # mpirun gets it once (at a second within 5 s it would exit, leaving the ranks running)
    # the sleeper names this test's folder, so that pgrep finds its ranks and no other test's
    local sleeper=(/usr/bin/python3 -c 'import time; time.sleep(60)' "$BATS_TEST_TMPDIR") i
    run timeout --preserve-status --kill-after=20 4 "$RUN" -np 2 --oversubscribe --enable-recovery \
        "${sleeper[@]}" </dev/null
    assert_failure 143
    assert_output --partial "dpshim-run: the job was stopped by SIGTERM: rank(s) 0 1 ended without an exit status"
    refute_output --partial "lost"
    for i in $(seq 20); do pgrep -f "time.sleep\\(60\\) $BATS_TEST_TMPDIR" >/dev/null || break; sleep 0.5; done
    run pgrep -f "time.sleep\\(60\\) $BATS_TEST_TMPDIR"
    assert_failure
    # to dpshim-run alone, from its parent: it passes the signal on, and ends by it too, as the
    # program alone would (a calling shell's loop stops at Ctrl-C)
    run timeout --kill-after=10 "$MPI_TIMEOUT" /usr/bin/python3 -c '
import signal, subprocess, sys, time
job = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=open("alone.out", "w"), stderr=subprocess.STDOUT)
time.sleep(4)
job.send_signal(signal.SIGTERM)
print("dpshim-run returned", job.wait())' "$RUN" -np 2 --oversubscribe --enable-recovery "${sleeper[@]}"
    assert_success
    assert_output "dpshim-run returned -15"
    run cat alone.out
    assert_output --partial "dpshim-run: the job was stopped by SIGTERM: rank(s) 0 1 ended without an exit status"
    for i in $(seq 20); do pgrep -f "time.sleep\\(60\\) $BATS_TEST_TMPDIR" >/dev/null || break; sleep 0.5; done
    run pgrep -f "time.sleep\\(60\\) $BATS_TEST_TMPDIR"
    assert_failure
}

@test "dpshim-run --enable-recovery: mpirun gets a signal once, directly or from dpshim-run 7 s on" {
    # a stand-in mpirun that logs each signal and ends 3 s after the first, as Open MPI's ends
    # the ranks; the real one exits at a second signal within 5 s and leaves the ranks running,
    # so dpshim-run passes one on only where mpirun did not get it
    cd "$BATS_TEST_TMPDIR"
    mkdir bin
    cat >bin/mpirun <<'STUB'
#!/bin/bash
[ "$1" != --version ] || { echo "mpirun (Open MPI) 4.1.4"; exit 0; }
t0=$(date +%s%N) left=300
trap 'echo "TERM $((($(date +%s%N) - t0) / 1000000))" >>signals; [ "$left" -le 30 ] || left=30' TERM
while [ "$left" -gt 0 ]; do sleep 0.1; left=$((left - 1)); done
exit 143
STUB
    chmod +x bin/mpirun
    local job job_status
    # to the whole process group (Ctrl-C in a terminal): mpirun got it, and nothing more
    rm -f signals
    run timeout --preserve-status --kill-after=20 2 env PATH="$PWD/bin:$PATH" "$RUN" -np 2 --enable-recovery /bin/true
    assert_failure 143
    sleep 8 # past the time dpshim-run would have passed it on, were it still running
    assert_equal "$(wc -l <signals)" 1
    # to dpshim-run alone: mpirun gets it once, 7 s on
    rm -f signals
    env PATH="$PWD/bin:$PATH" timeout --foreground --kill-after=40 60 "$RUN" -np 2 --enable-recovery /bin/true \
        </dev/null >alone.out 2>&1 &
    job=$!
    sleep 1
    kill -TERM "$job"
    job_status=0
    wait "$job" || job_status=$?
    assert_equal "$job_status" 143
    assert_equal "$(wc -l <signals)" 1
    local at
    read -r _ at <signals
    # 7 s after dpshim-run got it, 1 s after the start: apart from any it could have got itself by
    # more than Open MPI's 5 s
    [ "$at" -ge 6000 ] && [ "$at" -le 15000 ] || fail "mpirun got the signal $at ms after it started"
}
