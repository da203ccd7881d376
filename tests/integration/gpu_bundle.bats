#!/usr/bin/env bats
# The bundle a bare GPU machine gets (./dev.sh gpu-pack): under 64 MiB, and, unpacked into a
# fresh folder on this machine with Open MPI's and PMIx's installed files hidden, its pre-flight
# and every GPU check that runs on the test double pass with the Open MPI runtime it carries,
# the bench part printing each of its figures. And the PyTorch scripts of the bench part, run
# small on the CPU through the same harness: the script under dpshim and its DDP version.
load helpers

setup_file() {
    export PACK=$BATS_FILE_TMPDIR/build-gpu NO_PACK=
    if ! command -v nvcc >/dev/null; then
        NO_PACK="no nvcc: gpu-pack builds the CUDA programs with it"
    elif ! unshare -m true 2>/dev/null; then
        NO_PACK="no mount namespaces here (unshare -m)"
    else
        (cd "$SRC" && BUILD_DIR=$BUILD ./dev.sh gpu-pack "$PACK") >"$BATS_FILE_TMPDIR/pack.log" 2>&1 ||
            { cat "$BATS_FILE_TMPDIR/pack.log" >&3; return 1; }
    fi
}

# the bundle's tests need it made
pack() { [ -z "$NO_PACK" ] || skip "$NO_PACK"; }

@test "gpu-pack's bundle fits a 64 MiB carry and holds Open MPI's runtime" {
    pack
    local kib
    kib=$(du -sk "$PACK" | cut -f1)
    echo "bundle: $kib KiB"
    [ "$kib" -lt $((64 * 1024)) ] || fail "bundle is $kib KiB"
    [ -x "$PACK/ompi/bin/mpirun" ] && [ -f "$PACK/ompi/env.sh" ] || fail "no Open MPI runtime in the bundle"
    [ -e "$PACK/tests/gpu_double/libnccl.so.2" ] && [ -x "$PACK/bin/gpu_hooks" ] || fail "no test double in the bundle"
}

@test "the bundle runs from a fresh folder without the system's Open MPI: pre-flight and double checks" {
    pack
    run timeout --kill-after=10 900 bash "$SRC/tests/gpu/bundle_check.sh" "$PACK" "$BATS_TEST_TMPDIR/record"
    echo "$output"
    assert_success
    assert_output --partial "mpirun (Open MPI) 4.1"
    assert_output --regexp "mpirun: [^ ]*/build-gpu/ompi/bin/mpirun"
    refute_output --partial "FAIL"
    grep -q "GPU tensors go through NCCL" "$BATS_TEST_TMPDIR/record/gpu-check.md" || fail "no check went through NCCL"
    grep -q "staged" "$BATS_TEST_TMPDIR/record/gpu-check.md" || fail "no check went staged"
    # the bench part's figures, gathered under the card's name at the end of the record
    run sed -n '/^## Bench figures: the test double/,$p' "$BATS_TEST_TMPDIR/record/gpu-check.md"
    echo "$output"
    [ -n "$output" ] || fail "no bench figures in the record"
    local n='[0-9]+\.[0-9]+'
    assert_output --regexp "MiB +dpshim ms +busbw +direct ms +busbw +ratio +same"
    for mib in 1 4 16; do
        assert_output --regexp "(^|"$'\n'") +$mib +$n +$n +$n +$n +$n +yes"
    done
    for bind in "default binding:" "--bind-to none: "; do
        assert_output --regexp "16 MiB, $bind +ncclAllReduce directly: non-blocking comm, polled wait +$n ms"
        assert_output --regexp "16 MiB, $bind +the same, waited by cudaStreamSynchronize +$n ms .* ${n}x the polled wait"
        assert_output --regexp "16 MiB, $bind +blocking communicator, polled wait +$n ms"
        assert_output --regexp "16 MiB, $bind +blocking communicator, cudaStreamSynchronize +$n ms"
        assert_output --regexp "16 MiB, $bind +dp_grads on the device buffer vs by hand ${n}x, vs NCCL called directly \(non-blocking, polled: as the plugin\) ${n}x"
    done
    assert_output --regexp "16 MiB, elastic: +dp_grads on the device buffer vs by hand ${n}x, vs NCCL called directly \(non-blocking, polled: as the plugin\) ${n}x"
    assert_output --regexp "hidden behind backward: [0-9]+% of the reduction .* results bitwise equal: yes"
    assert_output --regexp "staged: +dp_grads, device buffer +$n ms"
    grep -q "cuda_train and the PyTorch runs need a real GPU: not with --double" "$BATS_TEST_TMPDIR/record/gpu-check.md" ||
        fail "the record does not say which bench runs --double leaves out"
}

@test "the bench part's PyTorch comparisons, small on the CPU: dpshim and DDP (gloo) at np=2, one rank vs alone" {
    /usr/bin/python3 -c 'import torch' 2>/dev/null || skip "no PyTorch for /usr/bin/python3"
    local n='[0-9]+\.[0-9]+'
    export SHIM DIAG=$BUILD/bin/dpshim-diag PYTHON=/usr/bin/python3 ROUNDS=1 RUN_LIMIT=$MPI_TIMEOUT
    run timeout --kill-after=10 600 bash "$SRC/tests/gpu/bench_compare.sh" torch-np2 cpu
    echo "$output"
    assert_success # every run exited 0 and printed samples_per_s, and dpshim shared the work out
    assert_output --regexp "np=2 on one machine, batch 16 per rank, global samples/s"
    assert_output --regexp "BatchNorm synchronized: dpshim \(exact, its default\) $n; DDP with SyncBatchNorm: not on the CPU"
    assert_output --regexp "BatchNorm per rank: dpshim \(\[bn\] sync = off\) $n, DDP \(its default\) $n: dpshim/DDP $n \(target >= 1.0\)"
    assert_output --regexp "dpshim exact sync vs DDP's default: $n \(exact sync costs -?$n% of dpshim's samples/s\)"
    assert_output --regexp "\[comm\] overlap on vs off \(\[bn\] sync = off\): $n vs $n ms per step \($n vs $n samples/s\): overlap saves -?$n ms per step"
    assert_output --regexp "reduction alone \(dp_grads on one buffer of the gradients $n MiB, as 1 MiB\): $n ms; hidden behind backward: [0-9]+%"
    run timeout --kill-after=10 300 bash "$SRC/tests/gpu/bench_compare.sh" torch-one-rank cpu
    echo "$output"
    assert_success
    assert_output --regexp "one rank: alone $n samples/s, under dpshim $n samples/s"
    assert_output --regexp "overhead per step under dpshim: [-+]$n% \(target <= 2%\)"
    # a run that prints no figure fails the comparison, naming the run
    run env PYTHON=false timeout 300 bash "$SRC/tests/gpu/bench_compare.sh" torch-one-rank cpu
    assert_failure
    assert_output --partial "the run alone.1 exited with status 1"
    assert_output --partial "the run alone.1 printed no samples_per_s"
}
