#!/usr/bin/env bats
# [diag] dir and dpshim-diag: per-rank statistics and traces, merged into a table, a Chrome
# trace and an SVG timeline; failures the guard ended show up in the report.
load helpers

# synth DIR SHIFT OFFSET HOST...: the files of a job written by hand, a rank per HOST: 3 steps of
# one collective each, where rank r arrives r ms after rank 0 and every rank leaves 5 ms after rank
# 0 arrived. Rank 1's clock reads SHIFT ns ahead of rank 0's. OFFSET: the clock_offset_ns rank 1
# records (every other rank records 0, all within 0.1 ms); empty: no rank measured its clock.
synth() {
    local dir=$1 shift_ns=$2 offset=$3 t0=1700000000000000000 ms=1000000 n r k d b e
    shift 3
    n=$#
    mkdir -p "$dir"
    for ((r = 0; r < n; r++)); do
        d=$((r == 1 ? shift_ns : 0))
        {
            printf 'dpshim-stats 5\nrank %d\nsize %d\nlocal_rank 0\nhost %s\nlauncher openmpi\n' $r $n "$1"
            printf 'start_ns %d\nend_ns %d\nsteps 3\n' $((t0 + d)) $((t0 + 40 * ms + d))
            [ -z "$offset" ] || printf 'clock_measured 1\nclock_offset_ns %d\nclock_error_ns 100000\n' \
                $((r == 1 ? offset : 0))
            printf 'collectives 3\nbytes 12000\ncomm_ns %d\n' $((3 * (5 - r) * ms))
        } >"$dir/stats.rank$r.txt"
        {
            printf 'dpshim-trace 5\n# kind begin_ns end_ns seq step bytes hook\n'
            for k in 1 2 3; do
                b=$((t0 + k * 10 * ms + d))
                e=$((b + 5 * ms))
                printf 'c %d %d %d %d 4000 dp_grads\ns %d %d 0 %d 0 dp_step_end\n' $((b + r * ms)) $e $k $((k - 1)) \
                    $((e + ms)) $((e + ms)) $k
            done
        } >"$dir/trace.rank$r.txt"
        shift
    done
}

# figures DIR: the report's table rows and straggler line, what the waiting and arrived-last
# columns come to.
figures() {
    "$BUILD/bin/dpshim-diag" report "$1" | grep -E '^ +[0-9]+  |^straggler'
}

# step_marks FILE.svg: the picture as rsvg-convert (librsvg2-bin) draws it, measured in the row
# with the most step ends: "RUNS SHARE", how many separate step-end lines cross it and the share of
# the picture's width from the first to the last (the PNG decoded by Python's zlib, no imaging
# library: 8-bit RGB or RGBA, not interlaced, as rsvg-convert writes).
step_marks() {
    rsvg-convert "$1" -o "$1.png" || return 1
    /usr/bin/python3 - "$1.png" <<'PYEOF'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
at, idat = 8, b""
while at < len(data):
    n, kind = struct.unpack(">I4s", data[at:at + 8])
    body = data[at + 8:at + 8 + n]
    if kind == b"IHDR":
        w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
        assert depth == 8 and color in (2, 6) and not interlace, (depth, color, interlace)
    elif kind == b"IDAT":
        idat += body
    at += 12 + n
bpp, raw, rows, prev = 3 if color == 2 else 4, zlib.decompress(idat), [], None
stride = w * bpp
for y in range(h):
    kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    up = prev or bytearray(stride)
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = up[i], up[i - bpp] if i >= bpp else 0
        if kind == 1: line[i] = (line[i] + a) & 255
        elif kind == 2: line[i] = (line[i] + b) & 255
        elif kind == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
mark = (0x08, 0x30, 0x6b)  # the step end's colour
best = (0, 0.0)
for line in rows:
    xs = [x for x in range(w) if sum(abs(line[x * bpp + k] - mark[k]) for k in range(3)) < 60]
    runs = sum(1 for i, x in enumerate(xs) if i == 0 or xs[i - 1] != x - 1)
    if xs and runs > best[0]:
        best = (runs, (xs[-1] - xs[0] + 1) / w)
print("%d %.3f" % best)
PYEOF
}

# lanes FILE.json|FILE.svg: the names of the lanes, one a line.
lanes() {
    case $1 in
    *.json) /usr/bin/python3 -c "import json, sys; e = json.load(open(sys.argv[1]))['traceEvents']; print('\n'.join(x['args']['name'] for x in e if x['name'] == 'thread_name'))" "$1" ;;
    *.svg) /usr/bin/python3 -c "import sys, xml.etree.ElementTree as T; print('\n'.join(t.text for t in T.parse(sys.argv[1]).getroot().iter('{http://www.w3.org/2000/svg}text') if t.text.startswith('rank ')))" "$1" ;;
    esac
}

@test "a healthy 4-rank run: stats and traces per rank, a report, a valid trace and picture" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 4 env DPSHIM_DIAG_DIR=diag DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD="$SHIM" "$TRAINER" \
        --steps 30 --no-eval --save m.ckpt
    assert_success
    local host
    host=$(hostname)
    for r in 0 1 2 3; do
        assert_equal "$(head -1 diag/stats.rank$r.txt)" "dpshim-stats 5"
        assert_equal "$(head -1 diag/trace.rank$r.txt)" "dpshim-trace 5"
        assert_equal "$(sed -n 's/^dropped_events //p' diag/stats.rank$r.txt)" 0
        assert_equal "$(sed -n 's/^steps //p' diag/stats.rank$r.txt)" 30
        assert_equal "$(sed -n 's/^host //p' diag/stats.rank$r.txt)" "$host"
        grep -qxE 'clock_measured [01]' diag/stats.rank$r.txt
        grep -qxE 'clock_offset_ns -?[0-9]+' diag/stats.rank$r.txt
        grep -qxE 'clock_error_ns [0-9]+' diag/stats.rank$r.txt
    done
    run "$BUILD/bin/dpshim-diag" report diag --trace t.json --svg t.svg
    echo "$output"
    assert_success
    # every rank on this host: the header, the table, and each lane name it
    assert_line --regexp '^dpshim report of diag: 4 ranks on 1 host, launcher openmpi, [0-9.]+ s$'
    assert_line "hosts: $host (ranks 0-3)"
    assert_line "clock offsets to rank 0: none (one host, one clock)"
    assert_line --regexp '^rank  steps .* arrived last  host$'
    for r in 0 1 2 3; do assert_line --regexp "^ +$r +30 +[0-9]+ +[0-9.]+ .* $host\$"; done
    assert_output --partial "3 writes to a sink"
    # the trainer's 3 saves: each an open and a close that took rank 0's outcome
    assert_output --partial "6 calls that took rank 0's outcome"
    assert_line "problems: none"
    refute_output --partial "trace cap"
    # the trace is JSON with a lane per rank, the picture is SVG with one per rank
    run /usr/bin/python3 -c "import json; e = json.load(open('t.json'))['traceEvents']; print(len({x['tid'] for x in e}), sum(x.get('cat') == 'comm' for x in e))"
    assert_output --regexp "^4 [0-9]+$"
    run /usr/bin/python3 -c "import xml.etree.ElementTree as T; r = T.parse('t.svg').getroot(); print(sum(t.text.startswith('rank ') for t in r.iter('{http://www.w3.org/2000/svg}text')))"
    assert_output 4
    for f in t.json t.svg; do
        run lanes $f
        assert_output "$(printf 'rank %d ('"$host"')\n' 0 1 2 3)"
    done
}

# A PyTorch job whose interpreter takes seconds to start (here a pause before `import torch`, as a
# slow file system gives) and then trains 80 short steps: the timeline folds the start-up into a
# marked break and spreads the steps over the picture, and the compute column leaves it out.
@test "the timeline of a PyTorch job with a long start-up shows its 80 steps across the picture" {
    /usr/bin/python3 -c "import torch" 2>/dev/null || skip "no torch for /usr/bin/python3"
    command -v rsvg-convert >/dev/null || skip "no rsvg-convert (Debian's librsvg2-bin)"
    cd "$BATS_TEST_TMPDIR"
    mkdir -p tv/FashionMNIST/raw
    for f in /usr/share/datasets/fashion-mnist/*.gz; do gunzip -c "$f" >"tv/FashionMNIST/raw/$(basename "$f" .gz)"; done
    run mpi 2 env OMP_NUM_THREADS=1 DPSHIM_DIAG_DIR=diag LD_PRELOAD="$SHIM" /usr/bin/python3 -c '
import runpy, sys, time
time.sleep(3)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")' "$SRC/examples/pytorch/train_fmnist.py" --data tv --no-eval \
        --train-limit 1280 --batch-size 16
    assert_success
    run "$BUILD/bin/dpshim-diag" report diag --svg t.svg
    echo "$output"
    assert_success
    assert_line --regexp "^start-up, before the first step and outside collectives \(not in compute s\): [0-9.]+ s on rank 0, "
    local wall compute startup
    read -r _ _ _ _ wall compute _ <<<"$(grep -E '^ +0 +80 ' <<<"$output")"
    startup=$(sed -nE 's/^start-up, .*: ([0-9.]+) s on rank 0.*/\1/p' <<<"$output")
    echo "rank 0: wall $wall s, start-up $startup s, compute $compute s" >&3
    assert_le 3 "$startup"
    assert_le "$compute" "$(awk -v w="$wall" 'BEGIN { print w - 3 }')"
    grep -q "first step at [0-9.]* s (start-up folded), 80 steps</text>" t.svg || fail "$(grep -m1 timeline t.svg)"
    local host
    host=$(hostname)
    run lanes t.svg
    assert_output "$(printf 'rank %d ('"$host"')\n' 0 1)"
    # the picture as drawn: each of the 80 step ends a line of its own, spread over most of the width
    run step_marks t.svg
    echo "step-end lines and the share of the width from the first to the last: $output" >&3
    assert_success
    local runs share
    read -r runs share <<<"$output"
    assert_le 75 "$runs"
    assert_le 0.75 "$share"
}

# docs/diagnostics.md tells the truth: the format version the files carry, and an example picture
# drawn by this dpshim-diag (lanes named "rank N (host)", a line at each step end).
@test "docs/diagnostics.md: the files' format version, and an example timeline of today's look" {
    local v
    v=$(sed -nE 's/^#define DPS_DIAG_FORMAT_VERSION ([0-9]+)$/\1/p' "$SRC/shim/diag/diag_format.h")
    [ -n "$v" ] || fail "no DPS_DIAG_FORMAT_VERSION in diag_format.h"
    grep -qF "(\`dpshim-stats $v\`, \`dpshim-trace $v\`)" "$SRC/docs/diagnostics.md" ||
        fail "docs/diagnostics.md: $(grep -o 'dpshim-stats [0-9]*' "$SRC/docs/diagnostics.md"), the files carry $v"
    run lanes "$SRC/docs/diag-timeline.svg"
    assert_success
    assert_output --regexp '^rank 0 \([^)]+\)'$'\n''rank 1 \([^)]+\)'
    command -v rsvg-convert >/dev/null || skip "no rsvg-convert (Debian's librsvg2-bin)"
    cp "$SRC/docs/diag-timeline.svg" "$BATS_TEST_TMPDIR/example.svg"
    run step_marks "$BATS_TEST_TMPDIR/example.svg"
    local runs share
    read -r runs share <<<"$output"
    assert_le 20 "$runs"
    assert_le 0.7 "$share"
}

# The report aligns the ranks' events on rank 0's clock: each rank's recorded clock_offset_ns is
# subtracted first, so a host whose clock runs ahead (or behind) does not look late (or early).
@test "report: recorded clock offsets are subtracted before the ranks' arrivals are compared" {
    cd "$BATS_TEST_TMPDIR"
    synth same 0 "" nodeA nodeB
    run figures same
    assert_line --regexp '^ +0 +3 +3 +[0-9.]+ +0\.040 +[0-9.]+ +0\.015 +0\.003 +[0-9.]+% +0\.0% +nodeA$'
    assert_line --regexp '^ +1 +3 +3 +[0-9.]+ +0\.040 +[0-9.]+ +0\.012 +0\.000 +[0-9.]+% +100\.0% +nodeB$'
    assert_line "straggler: rank 1 arrived last at 3 collectives, keeping the others waiting 0.003 s in all (1.000 ms each)"
    local want=$output
    # rank 1's clock 50 ms ahead of rank 0's, then behind, with the offset recorded: the same figures
    synth ahead 50000000 50000000 nodeA nodeB
    synth behind -50000000 -50000000 nodeA nodeB
    for dir in ahead behind; do
        run figures $dir
        assert_equal "$output" "$want"
    done
    run "$BUILD/bin/dpshim-diag" report behind --svg t.svg
    assert_success
    assert_line "clock offsets to rank 0: up to 50.000 ms (+/- 0.100 ms), corrected"
    assert_line "waiting and arrived last are on rank 0's clock: each rank's measured offset is subtracted from its times"
    grep -q "on rank 0's clock</text>" t.svg
    # the same files without the offset: the skew reads as waiting, 51 ms a collective
    synth uncorrected 50000000 "" nodeA nodeB
    run figures uncorrected
    [ "$output" != "$want" ]
    assert_line --regexp '^ +0 +3 +3 +[0-9.]+ +0\.040 +[0-9.]+ +0\.015 +0\.153 +'
    run "$BUILD/bin/dpshim-diag" report uncorrected
    assert_line "clock offsets to rank 0: not measured; each host's clock is taken as it is"
    assert_line --partial "(offsets not measured): skew between them reads as waiting"
    # ranks of one host share its clock, whether start-up recorded offsets of 0 or nothing
    synth one 0 0 nodeA nodeA
    run "$BUILD/bin/dpshim-diag" report one
    assert_line "clock offsets to rank 0: none (one host, one clock)"
    refute_output --partial "waiting and arrived last"
}

@test "report of a job across hosts: each rank's host in the header, the table, the trace and the picture" {
    cd "$BATS_TEST_TMPDIR"
    synth two 0 "" nodeA nodeB
    run "$BUILD/bin/dpshim-diag" report two --trace t.json --svg t.svg
    echo "$output"
    assert_success
    assert_line --regexp '^dpshim report of two: 2 ranks on 2 hosts, launcher openmpi, 0\.040 s$'
    assert_line "hosts: nodeA (rank 0), nodeB (rank 1)"
    assert_line --regexp '^ +0 +3 .* nodeA$'
    assert_line --regexp '^ +1 +3 .* nodeB$'
    for f in t.json t.svg; do
        run lanes $f
        assert_output "$(printf 'rank 0 (nodeA)\nrank 1 (nodeB)')"
    done
    # ranks in blocks and dealt round robin: each host with its ranks, in runs
    synth blocks 0 "" nodeA nodeA nodeB nodeB
    run "$BUILD/bin/dpshim-diag" report blocks --trace t.json
    assert_line --regexp '^dpshim report of blocks: 4 ranks on 2 hosts, '
    assert_line "hosts: nodeA (ranks 0-1), nodeB (ranks 2-3)"
    run lanes t.json
    assert_output "$(printf 'rank 0 (nodeA)\nrank 1 (nodeA)\nrank 2 (nodeB)\nrank 3 (nodeB)')"
    synth dealt 0 "" nodeB nodeA nodeB nodeA nodeB
    run "$BUILD/bin/dpshim-diag" report dealt --svg t.svg
    assert_line "hosts: nodeB (ranks 0,2,4), nodeA (ranks 1,3)"
    for r in 0 2 4; do assert_line --regexp "^ +$r +3 .* nodeB\$"; done
    for r in 1 3; do assert_line --regexp "^ +$r +3 .* nodeA\$"; done
    run lanes t.svg
    assert_output "$(printf 'rank %d (node%s)\n' 0 B 1 A 2 B 3 A 4 B)"
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

# [diag] trace_mb caps the memory a rank's events take; at 0 it keeps the statistics alone, and
# every event is counted as dropped. The collective a failure leaves in flight is kept all the same.
@test "[diag] trace_mb: events past the cap are counted in the stats and the report names the ranks" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_DIAG_DIR=diag DPSHIM_DIAG_TRACE_MB=0 LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 10
    assert_success
    for r in 0 1; do
        stat_of() { sed -n "s/^$1 //p" diag/stats.rank$r.txt; }
        assert_equal "$(stat_of steps)" 10
        assert_equal "$(stat_of dropped_events)" \
            "$(($(stat_of steps) + $(stat_of collectives) + $(stat_of bg_collectives)))"
        assert_equal "$(wc -l <diag/trace.rank$r.txt)" 2 # its two header lines
        eval "dropped$r=$(stat_of dropped_events)"
    done
    run "$BUILD/bin/dpshim-diag" report diag
    echo "$output"
    assert_success
    assert_line "trace cap: events past [diag] trace_mb were counted but not traced: rank 0 lacks $dropped0, rank 1 lacks $dropped1"
    assert_line --partial "--trace and --svg show only the events kept; raise [diag] trace_mb"
    assert_line --regexp "^ +0 +10 +[0-9]+ " # the table still counts every step
    # a job the guard ended: rank 1 stalls outside a collective, ranks 0 and 2 wait inside #6
    rm -r diag
    run mpi 3 env DPSHIM_DIAG_DIR=diag DPSHIM_DIAG_TRACE_MB=0 DPSHIM_GUARD_TIMEOUT=3 LD_PRELOAD="$SHIM" \
        "$BUILD/bin/guard_faults" 10 stall 1 5
    assert_failure
    for r in 0 2; do
        run sed 1,2d diag/trace.rank$r.txt
        assert_output --regexp "^c [0-9]+ [0-9]+ 6 4 0 dp_grads$"
    done
    assert_equal "$(wc -l <diag/trace.rank1.txt)" 2
}

# A declarative hook is named "[hook NAME] symbol": the trace keeps the name whole (the rest of
# the line) and the name outlives the hook's own buffer.
@test "a declarative hook's name, spaces and all, in the trace and the report's trace" {
    cd "$BATS_TEST_TMPDIR"
    sed 's/^before = grads g\[n\]$/before = allreduce g[n] mean/' "$SRC/examples/legacy/legacy.conf" >avg.conf
    grep -qx 'before = allreduce g\[n\] mean' avg.conf
    run mpi 2 env DPSHIM_DIAG_DIR=diag DPSHIM_POLICY=avg.conf LD_PRELOAD="$SHIM" "$BUILD/bin/legacy_train" --steps 5
    assert_success
    for r in 0 1; do
        assert_equal "$(grep -cE '^c( [0-9]+){5} \[hook update\] legacy_sgd_update$' diag/trace.rank$r.txt)" 5
    done
    run "$BUILD/bin/dpshim-diag" report diag --trace t.json
    assert_success
    run /usr/bin/python3 -c "import json; e = json.load(open('t.json'))['traceEvents']; print(sum(x['name'] == '[hook update] legacy_sgd_update' and x.get('cat') == 'comm' for x in e))"
    assert_output 10
}

# Files of another format version are refused with a message that says so.
@test "report of files in another format version: a clear error" {
    mkdir -p "$BATS_TEST_TMPDIR/old"
    printf 'dpshim-stats 2\nrank 0\nsize 1\n' >"$BATS_TEST_TMPDIR/old/stats.rank0.txt"
    run "$BUILD/bin/dpshim-diag" report "$BATS_TEST_TMPDIR/old"
    assert_failure
    assert_output --partial "stats.rank0.txt: a dpshim stats file of format 2, but this dpshim-diag reads format 5"
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

@test "report of damaged files: a number that is none is an error, damaged trace lines are said" {
    cd "$BATS_TEST_TMPDIR"
    run mpi 2 env DPSHIM_DIAG_DIR=diag LD_PRELOAD="$SHIM" "$BUILD/bin/guard_faults" 10
    assert_success
    cp -r diag kept
    sed -i 's/^steps .*/steps banana/' diag/stats.rank1.txt
    run "$BUILD/bin/dpshim-diag" report diag
    assert_failure
    assert_output --regexp "diag/stats.rank1.txt:[0-9]+: the value of 'steps' is not a number: the file is damaged"
    cp kept/stats.rank1.txt diag/
    sed -i '4s/.*/hello, not an event/' diag/trace.rank1.txt
    head -c -5 kept/trace.rank0.txt >diag/trace.rank0.txt # a rank killed while it wrote
    run "$BUILD/bin/dpshim-diag" report diag
    assert_success
    assert_output --partial "diag/trace.rank1.txt: 1 line(s) are not events (the first at line 4): the file is damaged"
    assert_output --regexp "diag/trace.rank0.txt:[0-9]+: the last line is cut \(the rank ended while writing it\)"
    run "$BUILD/bin/dpshim-diag" report kept # the files as written: nothing said
    assert_success
    refute_output --partial "damaged"
    refute_output --partial "is cut"
}

@test "report of a directory that is not a [diag] dir: a clear error" {
    run "$BUILD/bin/dpshim-diag" report "$BATS_TEST_TMPDIR"
    assert_failure
    assert_output --partial "no stats.rank0.txt"
}

@test "dpshim-diag env: what the shim detects, on each rank" {
    run "$BUILD/bin/dpshim-diag" env
    assert_success
    assert_line --regexp "^host +$(hostname)\$"
    assert_line --regexp '^launcher +singleton$'
    assert_line --regexp '^mpi +Open MPI v4'
    run mpi 2 "$BUILD/bin/dpshim-diag" env
    assert_success
    assert_line --regexp '^rank +1 of 2 \(local 1 of 2\), rank process$'
    assert_line --regexp '^local +rank from OMPI_COMM_WORLD_LOCAL_RANK, size from OMPI_COMM_WORLD_LOCAL_SIZE$'
    assert_line --regexp '^backend +mpi \(world size 2 for collectives\)$'
    assert_equal "$(count "host       $(hostname)")" 2
}

# dpshim-diag shares out no work: run as the ranks of a job, by itself or under the preload
# (mpirun ... env LD_PRELOAD=libdpshim.so, as dpshim-run launches), it must not warn that nothing
# was distributed, nor summarize a job; config still shows the user's own policy.
@test "dpshim-diag as the ranks of a job: no \"nothing was distributed\", plain or preloaded" {
    run mpi 2 "$BUILD/bin/dpshim-diag" env
    echo "$output"
    assert_success
    assert_equal "$(count "rank process")" 2
    refute_output --partial "nothing was distributed"
    refute_output --partial "SUMMARY"
    for cmd in env config; do
        run mpi 2 env DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" $cmd
        echo "$output"
        assert_success
        refute_output --partial "nothing was distributed"
        refute_output --partial "SUMMARY"
    done
    # the last was config: the user's values, not the tool's own settings for the library it loads
    assert_equal "$(count "nothing_shared = warn")" 2
    refute_output --partial "[r1] [r1]"
    run mpi 2 env DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" env
    assert_line --regexp '^\[r1\] rank +1 of 2 \(local 1 of 2\), rank process$'
    # a job that must distribute, as the policy says, still runs the tool
    run mpi 2 env DPSHIM_GUARD_NOTHING_SHARED=error "$BUILD/bin/dpshim-diag" env
    assert_success
}

# --help lists every command with a line on what it does, the same commands as dpshim-diag(1)
# describes; a wrong command line says what was wrong, then the usage, with status 2.
@test "dpshim-diag --help: a line per command, as the man page has them; an unknown command is named" {
    run "$BUILD/bin/dpshim-diag" --help
    echo "$output"
    assert_success
    assert_line --index 0 --partial "usage: dpshim-diag COMMAND"
    local c help man
    for c in config check keys env bench report model --help --version; do
        assert_line --regexp "^  $c( [^ ]+)* +[a-z(][a-z]+ .{16,}\$"
    done
    help=$(sed -n 's/^  \([^ ]*\).*/\1/p' <<<"$output" | sort)
    man=$(awk '/^\.SH /{d = $2 == "DESCRIPTION"; next} d && prev == ".TP" {print $2} {prev = $0}' \
        "$SRC/docs/man/dpshim-diag.1" | sed 's/\\-/-/g' | sort)
    assert_equal "$help" "$man"
    run "$BUILD/bin/dpshim-diag" frob
    assert_failure 2
    assert_line --index 0 "dpshim-diag: unknown command 'frob'"
    assert_line --index 1 --partial "usage: dpshim-diag COMMAND"
    assert_line --regexp "^  report DIR "
    run "$BUILD/bin/dpshim-diag" reprot
    assert_failure 2
    assert_line --index 0 "dpshim-diag: unknown command 'reprot'; did you mean 'report'?"
    run "$BUILD/bin/dpshim-diag" check
    assert_failure 2
    assert_line --index 0 "dpshim-diag: check takes FILE"
    run "$BUILD/bin/dpshim-diag"
    assert_failure 2
    assert_line --index 0 "dpshim-diag: no command"
}

@test "dpshim-diag bench: the shim's averages equal plain MPI's sums weighted alike, bit for bit, in every kind of program" {
    # np=3: the weight 1/3 is not exact, and blocks of the ring do not divide the buffers evenly
    for world in program program-mt shim; do
        for set in small 1 resnet50; do
            run mpi 3 env LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench --init $world $set
            echo "$output"
            assert_success
            assert_output --partial "MPI initialized by the ${world%-mt}"
            assert_output --partial "dpshim dp_grads (mean)"
            assert_output --partial "results bitwise equal: yes"
        done
    done
    # the 161 KiB bucket of `small` through shared memory, and every sum through MPI
    for kb in 1024 0; do
        run mpi 3 env DPSHIM_COMM_SHM_KB=$kb LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench small
        assert_success
        assert_output --partial "results bitwise equal: yes"
    done
    run mpi 2 env DPSHIM_COMM_REDUCE=sum LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench 1
    assert_success
    assert_output --partial "dpshim dp_grads (sum)"
    assert_output --partial "results bitwise equal: yes"
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench --init nobody 1
    assert_failure
    assert_output --partial "--init nobody: say program, program-mt, shim or python"
}

@test "dpshim-diag bench --init python: the same benchmark inside a Python process with torch loaded" {
    /usr/bin/python3 -c "import torch" 2>/dev/null || skip "no torch for /usr/bin/python3"
    run mpi 2 env LD_PRELOAD="$SHIM" "$BUILD/bin/dpshim-diag" bench --init python small
    echo "$output"
    assert_success
    assert_output --partial "MPI initialized by the shim, in a Python process with torch"
    assert_output --partial "results bitwise equal: yes"
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
    run "$BUILD/bin/dpshim-diag" model diag --alpha-us 5 --bw-gbs 10 # figures typed in are said to be
    assert_success
    assert_line --regexp "^links: within a node alpha 5.00 us, B 10.00 GB/s \(given\); "
    run "$BUILD/bin/dpshim-diag" model diag --bench bench.txt
    echo "$output"
    assert_success
    assert_line --regexp "^links: within a node alpha [0-9.]+ us, B [0-9.]+ GB/s \(measured\); "
    assert_line --regexp "^profile of diag \(rank 0 of 2, 59 steps\): step [0-9.]+ ms = compute [0-9.]+ ms \+ collectives [0-9.]+ ms"
    assert_output --regexp "check on the profiled job \(2 ranks, one node\)"
    # one row per size; the ring and hierarchical times never beat their bound on one node,
    # efficiencies are percentages. (Which of ring and hierarchical wins across nodes depends on
    # the measured link against the assumed one, so it is not asserted.)
    for p in 8 16 32 64 128 256 512 1024; do assert_line --regexp "^ +$p +[0-9]+ "; done
    run awk '$1 ~ /^[0-9]+$/ && NF == 10 {
        if ($3 + 1e-9 < $5 || $4 + 1e-9 < ($2 == 1 ? $5 : 0)) bad = bad " bound@" $1
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

# A failed write of one file must not cost the other: the stats file outgrows a 200-byte file
# size limit (SIGXFSZ ignored, so the write fails with EFBIG instead of killing the program)
# while the short trace of a program without collectives fits. The warning names the file that
# failed; the C library's flush at exit would save an unclosed trace here, so unit.diag checks
# that the trace is closed when dps_diag_write returns.
@test "a stats file that cannot be written still leaves the trace whole, and the warning names it" {
    cd "$BATS_TEST_TMPDIR"
    run bash -c 'trap "" XFSZ; exec prlimit --fsize=200 env DPSHIM_DIAG_DIR=diag LD_PRELOAD="$1" /bin/true' \
        sh "$SHIM"
    echo "$output"
    assert_success
    assert_output --regexp "WARN \[diag\] dir = diag: writing diag/stats\.rank0\.txt failed \(File too large\)"
    refute_output --partial "trace.rank0.txt"
    assert_equal "$(sed -n 1p diag/trace.rank0.txt)" "dpshim-trace $(sed -n 's/^dpshim-stats //p' diag/stats.rank0.txt)"
    assert_equal "$(sed -n 2p diag/trace.rank0.txt)" "# kind begin_ns end_ns seq step bytes hook"
}

# A [diag] dir shared with other users: an entry planted where a rank's file goes is never
# written through or over. A symbolic link (to a file, or dangling) and an entry that is not a
# regular file stop that rank's files with a warning naming the path; a stale file of the user's
# own, hard links included, is replaced by a new file, never truncated in place.
@test "[diag] dir: a planted symbolic link is not followed, and the warning names it" {
    cd "$BATS_TEST_TMPDIR"
    mkdir shared
    echo precious >victim
    ln -s "$BATS_TEST_TMPDIR/victim" shared/stats.rank0.txt
    ln -s "$BATS_TEST_TMPDIR/created" shared/trace.rank0.txt
    run env DPSHIM_DIAG_DIR="$BATS_TEST_TMPDIR/shared" LD_PRELOAD="$SHIM" /bin/true
    echo "$output"
    assert_success
    assert_equal "$(cat victim)" precious
    [ ! -e created ] || fail "a dangling link's target was created"
    [ -L shared/stats.rank0.txt ] && [ -L shared/trace.rank0.txt ] || fail "the links were replaced"
    assert_output --partial "WARN [diag] dir = $BATS_TEST_TMPDIR/shared: $BATS_TEST_TMPDIR/shared/stats.rank0.txt is a symbolic link"
    assert_output --partial "$BATS_TEST_TMPDIR/shared/trace.rank0.txt is a symbolic link"
    assert_output --partial "no diagnostics written"
    # a hard link to the victim, and a stale file, of this user's own: both replaced, the victim kept
    rm shared/*.txt
    ln victim shared/stats.rank0.txt
    echo stale >shared/trace.rank0.txt
    run env DPSHIM_DIAG_DIR=shared LD_PRELOAD="$SHIM" /bin/true
    assert_success
    refute_output --partial "[dpshim"
    assert_equal "$(cat victim)" precious
    [[ $(head -1 shared/stats.rank0.txt) == "dpshim-stats "* ]] || fail "no stats file written"
    [[ $(head -1 shared/trace.rank0.txt) == "dpshim-trace "* ]] || fail "no trace file written"
    # not a regular file: left alone
    rm shared/stats.rank0.txt
    mkfifo shared/stats.rank0.txt
    run timeout 20 env DPSHIM_DIAG_DIR=shared LD_PRELOAD="$SHIM" /bin/true
    assert_success
    assert_output --partial "shared/stats.rank0.txt is not a regular file"
}

@test "[diag] dir: a file another user left there is not overwritten" {
    [ "$(id -u)" = 0 ] || skip "needs root to leave a file of another user"
    cd "$BATS_TEST_TMPDIR"
    mkdir shared
    echo theirs >shared/stats.rank0.txt
    chown 65534 shared/stats.rank0.txt
    run env DPSHIM_DIAG_DIR=shared LD_PRELOAD="$SHIM" /bin/true
    echo "$output"
    assert_success
    assert_equal "$(cat shared/stats.rank0.txt)" theirs
    assert_output --partial "WARN [diag] dir = shared: shared/stats.rank0.txt belongs to user 65534, not to this user (0)"
}

# The program changes directory after start-up; a relative [diag] dir, from the environment or a
# policy file, still means the directory the ranks started in.
@test "a relative [diag] dir is where the ranks started, whatever directory they end in" {
    cd "$BATS_TEST_TMPDIR"
    mkdir sub
    run mpi 2 env DPSHIM_DIAG_DIR=diag LD_PRELOAD="$SHIM" "$BUILD/bin/run_children" -C sub
    echo "$output"
    assert_success
    for r in 0 1; do
        [[ $(head -1 diag/stats.rank$r.txt) == "dpshim-stats "* ]] || fail "rank $r: no stats file in diag"
        [[ $(head -1 diag/trace.rank$r.txt) == "dpshim-trace "* ]] || fail "rank $r: no trace file in diag"
    done
    [ ! -e sub/diag ] || fail "written in the directory the program changed to"
    printf '[diag]\ndir = fromfile\n' >p.conf
    run env DPSHIM_POLICY=p.conf LD_PRELOAD="$SHIM" "$BUILD/bin/run_children" -C sub
    assert_success
    [ -f fromfile/stats.rank0.txt ] && [ ! -e sub/fromfile ] || fail "$(find . -name 'stats.rank0.txt')"
}
