#!/usr/bin/env bats
# [diag] dir and dpshim-diag: per-rank statistics and traces, merged into a table, a Chrome
# trace and an SVG timeline; failures the guard ended show up in the report.
load helpers

@test "a healthy 4-rank run: stats and traces per rank, a report, a valid trace and picture" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 4 env DPSHIM_DIAG_DIR=diag DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" \
        --steps 30 --no-eval --save m.ckpt
    assert_success
    for r in 0 1 2 3; do
        assert_equal "$(head -1 diag/stats.rank$r.txt)" "dpshim-stats 1"
        assert_equal "$(head -1 diag/trace.rank$r.txt)" "dpshim-trace 1"
        assert_equal "$(sed -n 's/^steps //p' diag/stats.rank$r.txt)" 30
    done
    run "$BUILD/bin/dpshim-diag" report diag --trace t.json --svg t.svg
    echo "$output"
    assert_success
    assert_line --regexp '^dpshim report of diag: 4 ranks, host .*, launcher openmpi'
    for r in 0 1 2 3; do assert_line --regexp "^ +$r +30 +[0-9]+ +[0-9.]+ "; done
    assert_output --partial "3 writes to a sink"
    assert_output --partial "1 files published whole by rank 0"
    assert_line "problems: none"
    # the trace is JSON with a lane per rank, the picture is SVG with one per rank
    run /usr/bin/python3 -c "import json; e = json.load(open('t.json'))['traceEvents']; print(len({x['tid'] for x in e}), sum(x.get('cat') == 'comm' for x in e))"
    assert_output --regexp "^4 [0-9]+$"
    run /usr/bin/python3 -c "import xml.etree.ElementTree as T; r = T.parse('t.svg').getroot(); print(sum(t.text.startswith('rank ') for t in r.iter('{http://www.w3.org/2000/svg}text')))"
    assert_output 4
}

@test "a job the guard ended: the report names the failure on every rank" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 4 env DPSHIM_DIAG_DIR=diag DPSHIM_GUARD_TIMEOUT=3 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 10 stall 1 5
    assert_failure
    run "$BUILD/bin/dpshim-diag" report diag --svg t.svg
    assert_success
    for r in 0 1 2 3; do
        assert_line --regexp "^  rank $r: guard: dp_grads collective #6 after step 4 waited longer than the timeout"
    done
}

@test "a rank without files (crashed or killed before exit) is reported as such" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 4 env DPSHIM_DIAG_DIR=diag LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 10
    assert_success
    rm diag/*.rank2.txt # what a rank killed by a signal leaves: nothing
    run "$BUILD/bin/dpshim-diag" report diag
    assert_success
    assert_line --regexp "^ +2  no files: the rank crashed, was killed, or left with _exit"
    assert_output --partial "problems: ranks without files"
}

@test "report of a directory that is not a [diag] dir: a clear error" {
    run "$BUILD/bin/dpshim-diag" report "$BATS_TEST_TMPDIR"
    assert_failure
    assert_output --partial "no stats.rank0.txt"
}

@test "dpshim-diag env: what the shim detects, on each rank" {
    run "$BUILD/bin/dpshim-diag" env
    assert_success
    assert_line --regexp '^launcher +singleton$'
    assert_line --regexp '^mpi +Open MPI v4'
    run mpi 2 "$BUILD/bin/dpshim-diag" env
    assert_success
    assert_line --regexp '^rank +1 of 2 \(local 1 of 2\), rank process$'
    assert_line --regexp '^backend +mpi \(world size 2 for collectives\)$'
}

@test "dpshim-diag bench: the shim's sums equal plain MPI's, bit for bit" {
    for set in small 1 resnet50; do
        run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench $set
        echo "$output"
        assert_success
        assert_output --partial "results bitwise equal: yes"
    done
}

@test "dpshim-diag bench overlap: announced gradients give bitwise the same sums as dp_grads alone" {
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench overlap
    echo "$output"
    assert_success
    assert_output --regexp "speedup from overlap [0-9.]+x \(at most [0-9.]+x\), results bitwise equal: yes"
}

@test "[comm] overlap in the report: background reductions on their own line and trace lane" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_DIAG_DIR=diag DPSHIM_COMM_OVERLAP=on DPSHIM_COMM_BUCKET_MB=1 LD_PRELOAD="$SHIM" "$TRAINER" --steps 20 --no-eval
    assert_success
    run "$BUILD/bin/dpshim-diag" report diag --trace t.json
    echo "$output"
    assert_success
    assert_line --regexp "^ +[01]  in the background \(\[comm\] overlap\): [0-9]+ reductions, [0-9.]+ MB"
    run /usr/bin/python3 -c "import json; e = json.load(open('t.json'))['traceEvents']; print(sum(x.get('cat') == 'background' for x in e) > 0)"
    assert_output True
}

# The scaling model on a real profile and a real sweep (the sweep's fit line is its input).
@test "dpshim-diag model: step time and efficiency at 8 .. 1024 GPUs from bench figures and a profile" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_DIAG_DIR=diag DPSHIM_DATA_MODE=scale LD_PRELOAD="$SHIM" "$TRAINER" --steps 60 --no-eval
    assert_success
    mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench >bench.txt
    grep -E "^model inputs \(ring fit of the dpshim column\): --alpha-us [0-9.]+ --bw-gbs [0-9.]+$" bench.txt
    run "$BUILD/bin/dpshim-diag" model diag --bench bench.txt
    echo "$output"
    assert_success
    assert_line --regexp "^profile of diag \(rank 0 of 2, 59 steps\): step [0-9.]+ ms = compute [0-9.]+ ms \+ collectives [0-9.]+ ms"
    assert_output --regexp "check on the profiled job \(2 ranks, one node\)"
    # one row per size; the ring and hierarchical times never beat their bound on one node,
    # hierarchical beats the flat ring across nodes, efficiencies are percentages
    for p in 8 16 32 64 128 256 512 1024; do assert_line --regexp "^ +$p +[0-9]+ "; done
    run awk '$1 ~ /^[0-9]+$/ && NF == 10 {
        if ($3 + 1e-9 < $5 || $4 + 1e-9 < ($2 == 1 ? $5 : 0)) bad = bad " bound@" $1
        if ($2 > 1 && $4 > $3) bad = bad " hier>ring@" $1
        for (i = 8; i <= 10; i++) { v = $i; sub("%", "", v); v += 0; if (v <= 0 || v > 100) bad = bad " eff@" $1 }
        rows++ } END { print rows, bad }' <<<"$output"
    assert_output "8 "
}

@test "dpshim-diag model: bad input names what is wrong" {
    run "$BUILD/bin/dpshim-diag" model
    assert_failure 2
    assert_output --partial "usage: dpshim-diag model DIR"
    run "$BUILD/bin/dpshim-diag" model "$BATS_TEST_TMPDIR" --alpha-us 1 --bw-gbs fast
    assert_failure 2
    assert_output --partial "--bw-gbs needs a number in"
    run "$BUILD/bin/dpshim-diag" model "$BATS_TEST_TMPDIR" --alpha-us 1 --bw-gbs 5
    assert_failure 1
    assert_output --partial "stats.rank0.txt: missing"
    echo "no fit here" >"$BATS_TEST_TMPDIR/b.txt"
    run "$BUILD/bin/dpshim-diag" model "$BATS_TEST_TMPDIR" --bench "$BATS_TEST_TMPDIR/b.txt"
    assert_failure 1
    assert_output --partial "has no \"model inputs\" line"
}
