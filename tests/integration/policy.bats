#!/usr/bin/env bats
# Bad policy input stops every rank before main() with file, line and key; good input is used.
load helpers

# run_bad_policy TEXT: 2 ranks with ./dpshim.conf holding TEXT; the trainer must never start.
run_bad_policy() {
    cd "$BATS_TEST_TMPDIR"
    printf '%b' "$1" >dpshim.conf
    # sh is not preloaded: it reports each rank's own exit status
    run mpi 2 sh -c 'env LD_PRELOAD="$0" "$1" --steps 1 --no-eval; echo "rank exit $?"' "$SHIM" "$TRAINER"
    echo "$output"
    refute_output --partial "fmnist_train:" # main() never ran
    # both ranks report it, each exiting with EX_CONFIG
    assert_output --partial "[dpshim r0/2] ERROR"
    assert_output --partial "[dpshim r1/2] ERROR"
    assert_equal "$(grep -c '^rank exit 78$' <<<"$output")" 2
}

@test "unknown key: every rank exits before main, naming file, line, key and a suggestion" {
    run_bad_policy "[comm]\nbackend = mpi\nbuckt_mb = 8\n"
    assert_output --partial "dpshim.conf:3: unknown key 'buckt_mb' in [comm]; did you mean 'bucket_mb'?"
}

@test "bad value: names file, line, key and the allowed values" {
    run_bad_policy "# comment\n[data]\nmode = splitt\n"
    assert_output --partial "dpshim.conf:3: [data] mode: bad value 'splitt'; expected one of split|scale; did you mean 'split'?"
}

@test "duplicate key: names both lines" {
    run_bad_policy "[guard]\ntimeout = 10\n\ntimeout = 20\n"
    assert_output --partial "dpshim.conf:4: duplicate key 'timeout' in [guard] (first set on line 2)"
}

@test "unknown section and out-of-range number" {
    run_bad_policy "[comms]\nbackend = mpi\n"
    assert_output --partial "dpshim.conf:1: unknown section [comms]; did you mean 'comm'?"
    run_bad_policy "[comm]\nbucket_mb = 0\n"
    assert_output --partial "dpshim.conf:2: [comm] bucket_mb: value 0 out of range"
}

@test "misspelt DPSHIM_ environment variable is an error with a suggestion" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_BN_SYN=off LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_failure
    refute_output --partial "fmnist_train:"
    assert_output --partial "unknown environment variable DPSHIM_BN_SYN; did you mean 'DPSHIM_BN_SYNC'?"
}

@test "DPSHIM_POLICY naming a missing file is an error" {
    run env DPSHIM_POLICY=/nonexistent/dpshim.conf LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_equal "$status" 78
    assert_output --partial "cannot read policy file /nonexistent/dpshim.conf"
}

@test "a valid policy file is used, and the environment overrides it" {
    cd "$BATS_TEST_TMPDIR"
    printf '[diag]\nlog = info\n[comm]\nbucket_mb = 4\n' >dpshim.conf
    run env LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_success
    assert_output --partial "policy dpshim.conf"
    run env DPSHIM_DIAG_LOG=error LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_success
    refute_output --partial "[dpshim"
}

@test "dpshim-diag check and config explain a policy" {
    cd "$BATS_TEST_TMPDIR"
    printf '[comm]\nbucket_mb = 4\n' >good.conf
    printf '[comm]\nbucket = 4\n' >bad.conf
    run "$BUILD/bin/dpshim-diag" check good.conf
    assert_success
    run "$BUILD/bin/dpshim-diag" check bad.conf
    assert_failure
    assert_output --partial "bad.conf:2: unknown key 'bucket' in [comm]"
    # a value the table names but this version refuses at start-up: check refuses it too
    printf '[data]\nmode = scale\nuneven = join\n' >join.conf
    run "$BUILD/bin/dpshim-diag" check join.conf
    assert_failure 1
    assert_output --partial "join.conf:3: [data] uneven = join is not available in this version; use pad or drop"
    refute_output --partial valid
    # so is a hook on a function of the C library
    printf '[hook free]\nsignature = void free(void *p)\nbefore = barrier\n' >free.conf
    run "$BUILD/bin/dpshim-diag" check free.conf
    assert_failure 1
    assert_output --partial "free.conf:1: [hook free]: free is a function of libc.so.6, which dpshim and MPI call themselves"
    DPSHIM_POLICY=good.conf DPSHIM_DATA_MODE=scale run "$BUILD/bin/dpshim-diag" config
    assert_success
    assert_line --regexp '^bucket_mb += 4 +# good.conf:2$'
    assert_line --regexp '^mode += scale +# env DPSHIM_DATA_MODE$'
    assert_line --regexp '^sync += on +# default$'
}

@test "the example policy file in the tree is valid" {
    run "$BUILD/bin/dpshim-diag" check "$SRC/policy/dpshim.conf"
    assert_success
}

@test "the malformed-policy corpus: each file stops every rank before main with file:line" {
    local dir=$SRC/tests/integration/policies/bad n=0
    while IFS=$'\t' read -r file frag; do
        [[ $file == \#* || -z $file ]] && continue
        cd "$dir"
        run mpi 2 env DPSHIM_POLICY="$file" LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
        [ "$status" -ne 0 ] || fail "$file: the job succeeded"
        [[ $output != *"fmnist_train:"* ]] || fail "$file: main() ran"
        for r in 0 1; do
            # exactly one message per rank, naming the file and line
            got=$(grep -F "[dpshim r$r/2] ERROR" <<<"$output")
            [ "$(wc -l <<<"$got")" = 1 ] || fail "$file: rank $r printed: $got"
            [[ $got == *"$file$frag"* ]] || fail "$file: rank $r said '$got', expected '$file$frag'"
        done
        n=$((n + 1))
    done <"$SRC/tests/integration/policies/bad.tsv"
    echo "$n malformed policies rejected" >&3
    [ "$n" -ge 20 ]
}

@test "a policy path that is a directory is rejected on every rank" {
    run mpi 2 env DPSHIM_POLICY="$BATS_TEST_TMPDIR" LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    assert_failure
    refute_output --partial "fmnist_train:"
    assert_output --partial "[dpshim r0/2] ERROR policy file $BATS_TEST_TMPDIR is not a regular file"
    assert_output --partial "[dpshim r1/2] ERROR policy file $BATS_TEST_TMPDIR is not a regular file"
}

@test "a UTF-8 byte order mark at the start of a policy is accepted" {
    printf '\xef\xbb\xbf[comm]\nbucket_mb = 4\n' >"$BATS_TEST_TMPDIR/bom.conf"
    run "$BUILD/bin/dpshim-diag" check "$BATS_TEST_TMPDIR/bom.conf"
    assert_success
}

# A relative DPSHIM_POLICY names a file in the directory the rank started in: its children get
# the absolute path, so one that changed directory (system("cd sub && ...")), or a child of a
# rank that did, still finds the policy.
@test "a relative DPSHIM_POLICY reaches children that changed directory, as an absolute path" {
    cd "$BATS_TEST_TMPDIR"
    mkdir sub
    printf '[comm]\nbucket_mb = 4\n' >rel.conf
    run env DPSHIM_POLICY=rel.conf LD_PRELOAD="$SHIM" "$BUILD/bin/run_children" 'cd sub && /bin/true' \
        'cd sub && printenv DPSHIM_POLICY'
    echo "$output"
    assert_success
    assert_line "$(realpath rel.conf)"
    run mpi 2 env DPSHIM_POLICY=rel.conf LD_PRELOAD="$SHIM" "$BUILD/bin/run_children" -C sub /bin/true
    echo "$output"
    assert_success
    assert_equal "$(count "'/bin/true' exited 0")" 2
}

# A FIFO as the policy would block every rank in open() before main, forever; a device may act
# on being opened. Neither is opened: every rank stops with a message saying what the path is.
@test "a policy path that is a FIFO or a device is refused at once, naming what it is" {
    cd "$BATS_TEST_TMPDIR"
    mkfifo p.fifo
    run mpi 2 env DPSHIM_POLICY="$BATS_TEST_TMPDIR/p.fifo" LD_PRELOAD="$SHIM" "$TRAINER" --steps 1 --no-eval
    echo "$output"
    assert_failure
    refute_output --partial "fmnist_train:"
    for r in 0 1; do
        assert_output --partial "[dpshim r$r/2] ERROR policy file $BATS_TEST_TMPDIR/p.fifo is not a regular file but a FIFO"
    done
    run timeout 20 env DPSHIM_POLICY=/dev/null LD_PRELOAD="$SHIM" /bin/true
    assert_equal "$status" 78
    assert_output --partial "policy file /dev/null is not a regular file but a character device"
    mkdir fifo && mkfifo fifo/dpshim.conf
    run timeout 20 sh -c 'cd fifo && exec env LD_PRELOAD="$0" /bin/true' "$SHIM"
    assert_equal "$status" 78
    assert_output --partial "policy file dpshim.conf is not a regular file but a FIFO"
    run timeout 20 "$BUILD/bin/dpshim-diag" check p.fifo
    assert_failure
    assert_output --partial "policy file p.fifo is not a regular file but a FIFO"
}
