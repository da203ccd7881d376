#!/usr/bin/env bats
# Declarative hooks ([hook NAME] sections, bound with libffi): the legacy trainer
# (examples/legacy), which knows nothing of dpshim, distributed by its policy file alone;
# signatures of 0 to 8 mixed arguments called through the closures (progs/ffi_roundtrip.c); and
# actions that communicate, as the guard and the traces see them (progs/ffi_actions.c).
load helpers

LEGACY=$BUILD/bin/legacy_train
POLICY=$SRC/examples/legacy/legacy.conf
ROUNDTRIP=$SRC/tests/integration/policies/ffi_roundtrip.conf
ACTIONS=$SRC/tests/integration/policies/ffi_actions.conf

# legacy_np N DIR ARGS...: the legacy trainer on N ranks with its policy, in DIR.
legacy_np() {
    local n=$1 dir=$2
    shift 2
    mkdir -p "$dir"
    (cd "$dir" && mpi "$n" env DPSHIM_POLICY="$POLICY" LD_PRELOAD="$SHIM" "$LEGACY" "$@")
}

check_legacy() {
    local n=$1 steps=$2 tol=$3
    "$LEGACY" --steps "$steps" --save "$BATS_TEST_TMPDIR/alone.bin" >/dev/null
    run legacy_np "$n" "$BATS_TEST_TMPDIR/np$n" --steps "$steps" --save model.bin
    echo "$output"
    assert_success
    # save_model ran on rank 0 only: one file, and every rank's program went on
    assert_equal "$(ls "$BATS_TEST_TMPDIR/np$n")" model.bin
    assert_equal "$(count "epoch 1: ")" "$n"
    run "$BUILD/bin/f32_diff" "$BATS_TEST_TMPDIR/alone.bin" "$BATS_TEST_TMPDIR/np$n/model.bin"
    echo "np=$n steps=$steps: $output" >&3
    [ "$output" = bitwise ] || assert_le "${output#rel }" "$tol"
}

@test "legacy trainer, np=2: one step equals the run alone within 1e-6" { check_legacy 2 1 1e-6; }
@test "legacy trainer, np=3: one step equals the run alone within 1e-6" { check_legacy 3 1 1e-6; }
@test "legacy trainer, np=4: one step equals the run alone within 1e-6" { check_legacy 4 1 1e-6; }
@test "legacy trainer, np=2: 200 steps equal the run alone within 1e-4" { check_legacy 2 200 1e-4; }
@test "legacy trainer, np=3: 200 steps equal the run alone within 1e-4" { check_legacy 3 200 1e-4; }
@test "legacy trainer, np=4: 200 steps equal the run alone within 1e-4" { check_legacy 4 200 1e-4; }

# Each rank's training accuracy over the whole training set, from its own weights.
accuracies() { sed -n 's/.*training accuracy \([0-9.]*\)%.*/\1/p' <<<"$output" | sort -u | wc -l; }

@test "ranks given different seeds start from rank 0's weights (the broadcast hook)" {
    run mpi 2 sh -c 'exec env DPSHIM_POLICY="$1" LD_PRELOAD="$2" "$3" --steps 5 --seed $((OMPI_COMM_WORLD_RANK + 3))' \
        sh "$POLICY" "$SHIM" "$LEGACY"
    echo "$output"
    assert_success
    assert_equal "$(accuracies)" 1 # identical weights on both ranks
    # the same without the [hook init] section: the ranks drift apart
    grep -v '^after = broadcast' "$POLICY" >"$BATS_TEST_TMPDIR/nobcast.conf"
    run mpi 2 sh -c 'exec env DPSHIM_POLICY="$1" LD_PRELOAD="$2" "$3" --steps 5 --seed $((OMPI_COMM_WORLD_RANK + 3))' \
        sh "$BATS_TEST_TMPDIR/nobcast.conf" "$SHIM" "$LEGACY"
    assert_success
    assert_equal "$(accuracies)" 2
}

@test "signatures of 0 to 8 mixed arguments round-trip through the closures, from 4 threads too; libraries opened later are bound" {
    run mpi 2 env DPSHIM_DIAG_LOG=info DPSHIM_POLICY="$ROUNDTRIP" \
        LD_PRELOAD="$SHIM" "$BUILD/bin/ffi_roundtrip" "$BUILD/lib/libffi_late.so" "$BUILD/lib/libffi_dup_a.so" \
        "$BUILD/lib/libffi_dup_b.so"
    echo "$output"
    assert_success
    assert_equal "$(count 'round trip: 44 checks, 0 failed')" 2
    for h in none one two three four five six seven eight out; do
        assert_equal "$(grep -oE "INFO \[hook $h\] ft_[a-z0-9]+ bound at 1 call site\(s\)" <<<"$output" | wc -l)" 2
    done
    # ft_late is called only by libffi_late.so, opened with dlopen: rank 1 skips it (rank0_only)
    assert_equal "$(count "late_call(20) = 41")" 1
    assert_equal "$(count "late_call(20) = 101")" 1
    # two RTLD_LOCAL libraries with their own ft_dup: rank 0's calls reach each its own
    # definition through the closures, rank 1's are skipped in both (so both were bound)
    assert_equal "$(count "dup_call a(1) = 2, b(1) = 101")" 1
    assert_equal "$(count "dup_call a(1) = -5, b(1) = -5")" 1
}

@test "a library opened by a bare name is found where ld.so would look for the caller (its RUNPATH, \$ORIGIN) and bound" {
    # ffi_roundtrip's RUNPATH is $ORIGIN/../lib, which applies to its own dlopen calls only:
    # the real dlopen, called from libdpshim.so, would not find libffi_late.so there
    run mpi 2 env DPSHIM_POLICY="$ROUNDTRIP" LD_PRELOAD="$SHIM" "$BUILD/bin/ffi_roundtrip" libffi_late.so
    echo "$output"
    assert_success
    assert_equal "$(count "late_call(20) = 41")" 1
    assert_equal "$(count "late_call(20) = 101")" 1 # rank 1: bound, rank0_only skipped the call
    # a name no directory has: the real dlopen's own answer
    run mpi 2 env DPSHIM_POLICY="$ROUNDTRIP" LD_PRELOAD="$SHIM" "$BUILD/bin/ffi_roundtrip" libffi_nowhere.so
    assert_failure
    assert_equal "$(count "cannot open libffi_nowhere.so: libffi_nowhere.so: cannot open shared object file")" 2
}

@test "allreduce and barrier actions: sums, maxima and a real barrier; the trace names each collective's hook" {
    local dir=$BATS_TEST_TMPDIR/diag
    run mpi 2 env DPSHIM_DIAG_DIR="$dir" DPSHIM_POLICY="$ACTIONS" LD_PRELOAD="$SHIM" "$BUILD/bin/ffi_actions" 1
    echo "$output"
    assert_success
    assert_equal "$(count "reduce: 6 checks, 0 wrong")" 2
    # rank 1 comes to fa_meet 1 s late: rank 0 waits for it there
    assert_le 0.8 "$(sed -n 's/.*rank 0: waited \([0-9.]*\) s in fa_meet.*/\1/p' <<<"$output" | head -1)"
    # trace lines: kind begin end seq step bytes hook. The hook's name, kept by the trace until
    # exit, is the hook's own (not a stack buffer since reused), and the barrier moves no bytes.
    for r in 0 1; do
        local trace=$dir/trace.rank$r.txt
        cat "$trace"
        assert_equal "$(grep -cE '^c( [0-9]+){4} 16 \[hook reduce\] fa_reduce$' "$trace")" 3
        assert_equal "$(grep -cE '^c( [0-9]+){4} 8 \[hook total\] fa_total$' "$trace")" 3
        assert_equal "$(grep -cE '^c( [0-9]+){4} 0 \[hook meet\] fa_meet$' "$trace")" 1
        assert_equal "$(grep -c '^c ' "$trace")" 7
    done
}

@test "the guard watches a barrier action and names the hooks in its report" {
    local start=$SECONDS
    run mpi 2 env DPSHIM_GUARD_TIMEOUT=2 DPSHIM_POLICY="$ACTIONS" LD_PRELOAD="$SHIM" "$BUILD/bin/ffi_actions" 60
    echo "$output"
    assert_failure
    assert_output --regexp "rank 0 \([^)]*\): in \[hook meet\] fa_meet \(barrier [a-z0-9]+ x 0\), collective #7"
    # rank 1's last collective ended long ago, and its stack has been reused since
    assert_output --regexp "rank 1 \([^)]*\): in the program's own code for [0-9.]+ s, since \[hook total\] fa_total collective #6"
    [ $((SECONDS - start)) -lt 30 ]
}

@test "a declared function nobody defines: a warning by default, an error with missing = error" {
    printf '[hook ghost]\nsignature = void no_such_function(float *g, size_t n)\nbefore = grads g[n]\n' >"$BATS_TEST_TMPDIR/ghost.conf"
    run mpi 2 env DPSHIM_POLICY="$BATS_TEST_TMPDIR/ghost.conf" LD_PRELOAD="$SHIM" "$LEGACY" --steps 1
    assert_success
    assert_output --partial "ghost.conf:1: [hook ghost]: no_such_function is not defined by any loaded object"
    printf 'missing = error\n' >>"$BATS_TEST_TMPDIR/ghost.conf"
    run mpi 2 env DPSHIM_POLICY="$BATS_TEST_TMPDIR/ghost.conf" LD_PRELOAD="$SHIM" "$LEGACY" --steps 1
    assert_failure
    assert_output --partial "ghost.conf:1: [hook ghost]: no_such_function is not defined by any loaded object (missing = error)"
    refute_output --partial "epoch 1"
}

@test "a hook on a C library function is refused before the program starts, not left to hang" {
    # free, and write, which libdpshim.so itself defines first in the global scope
    printf '[hook free]\nsignature = void free(void *p)\nbefore = barrier\n' >"$BATS_TEST_TMPDIR/free.conf"
    printf '[hook w]\nsignature = long write(int fd, const void *p, size_t n)\nbefore = barrier\n' >"$BATS_TEST_TMPDIR/write.conf"
    local start=$SECONDS
    run mpi 2 env DPSHIM_POLICY="$BATS_TEST_TMPDIR/free.conf" LD_PRELOAD="$SHIM" "$LEGACY" --steps 1
    assert_failure 78
    assert_output --partial "free.conf:1: [hook free]: free is a function of libc.so.6, which dpshim and MPI call themselves"
    refute_output --partial "epoch 1"
    run mpi 2 env DPSHIM_POLICY="$BATS_TEST_TMPDIR/write.conf" LD_PRELOAD="$SHIM" "$LEGACY" --steps 1
    assert_failure 78
    assert_output --partial "write.conf:1: [hook w]: write is a function of libc.so.6, which dpshim and MPI call themselves"
    [ $((SECONDS - start)) -lt 30 ] # before, the job waited in the backend's start-up for [guard] timeout
}

@test "library = naming a library that is not loaded: the warning names the library" {
    printf '[hook u]\nsignature = void no_such_function(float *g, size_t n)\nlibrary = libnotthere.so\nbefore = grads g[n]\n' >"$BATS_TEST_TMPDIR/lib.conf"
    run mpi 2 env DPSHIM_POLICY="$BATS_TEST_TMPDIR/lib.conf" LD_PRELOAD="$SHIM" "$LEGACY" --steps 1
    assert_success
    assert_output --partial "lib.conf:1: [hook u]: no_such_function is to be bound in libnotthere.so (library =), which is not loaded now (check the name: the one ldd lists)"
    refute_output --partial "is not defined by any loaded object"
}

@test "hooks leave undeclared functions and programs without hooks alone" {
    run env DPSHIM_POLICY="$POLICY" LD_PRELOAD="$SHIM" "$LEGACY" --steps 3 --save "$BATS_TEST_TMPDIR/a.bin"
    assert_success
    "$LEGACY" --steps 3 --save "$BATS_TEST_TMPDIR/b.bin" >/dev/null
    run "$BUILD/bin/f32_diff" "$BATS_TEST_TMPDIR/a.bin" "$BATS_TEST_TMPDIR/b.bin"
    assert_output bitwise # world size 1: every action is a no-op
}

# [hook] declarations are the rank process's: its children (a shell from system(), a compiler)
# never load the framework, and must run as if no hook were declared, while the rank process
# itself is still held to missing = error.
@test "hooks bind in the rank process only: its children run without the function, the rank still needs it" {
    cd "$BATS_TEST_TMPDIR"
    printf '[hook one]\nsignature = int32_t ft_1(int32_t a)\nmissing = error\n' >one.conf
    run mpi 2 env DPSHIM_POLICY=one.conf LD_PRELOAD="$SHIM" "$BUILD/bin/run_children" 'sh -c true' /bin/true
    echo "$output"
    assert_success
    assert_equal "$(count "'sh -c true' exited 0")" 2
    assert_equal "$(count "'/bin/true' exited 0")" 2
    # no message from the children (rank 0 says at exit that this job shared out no work, and
    # prints its summary)
    assert_equal "$(grep -F '[dpshim' <<<"$output" | grep -v 'nothing was distributed' | grep -vc '\] SUMMARY ')" 0
    # the rank process without the function: stopped before main
    run env DPSHIM_POLICY=one.conf LD_PRELOAD="$SHIM" /bin/true
    assert_equal "$status" 78
    assert_output --partial "one.conf:1: [hook one]: ft_1 is not defined by any loaded object (missing = error)"
    # missing = warn: the rank warns once, its children never
    printf '[hook ghost]\nsignature = void no_such_function(void)\n' >ghost.conf
    run env DPSHIM_POLICY=ghost.conf LD_PRELOAD="$SHIM" "$BUILD/bin/run_children" 'sh -c true'
    echo "$output"
    assert_success
    assert_equal "$(count "no_such_function is not defined by any loaded object")" 1
}
