#!/usr/bin/env bats
# The bundle a bare GPU machine gets (./dev.sh gpu-pack): under 64 MiB, and, unpacked into a
# fresh folder on this machine with Open MPI's and PMIx's installed files hidden, its pre-flight
# and every GPU check that runs on the test double pass with the Open MPI runtime it carries.
load helpers

setup_file() {
    command -v nvcc >/dev/null || skip "no nvcc: gpu-pack builds the CUDA programs with it"
    unshare -m true 2>/dev/null || skip "no mount namespaces here (unshare -m)"
    export PACK=$BATS_FILE_TMPDIR/build-gpu
    (cd "$SRC" && ./dev.sh gpu-pack "$PACK") >"$BATS_FILE_TMPDIR/pack.log" 2>&1 ||
        { cat "$BATS_FILE_TMPDIR/pack.log" >&3; return 1; }
}

@test "gpu-pack's bundle fits a 64 MiB carry and holds Open MPI's runtime" {
    local kib
    kib=$(du -sk "$PACK" | cut -f1)
    echo "bundle: $kib KiB"
    [ "$kib" -lt $((64 * 1024)) ] || fail "bundle is $kib KiB"
    [ -x "$PACK/ompi/bin/mpirun" ] && [ -f "$PACK/ompi/env.sh" ] || fail "no Open MPI runtime in the bundle"
    [ -e "$PACK/tests/gpu_double/libnccl.so.2" ] && [ -x "$PACK/bin/gpu_hooks" ] || fail "no test double in the bundle"
}

@test "the bundle runs from a fresh folder without the system's Open MPI: pre-flight and double checks" {
    run timeout --kill-after=10 900 bash "$SRC/tests/gpu/bundle_check.sh" "$PACK" "$BATS_TEST_TMPDIR/record"
    echo "$output"
    assert_success
    assert_output --partial "mpirun (Open MPI) 4.1"
    assert_output --regexp "mpirun: [^ ]*/build-gpu/ompi/bin/mpirun"
    refute_output --partial "FAIL"
    grep -q "GPU tensors go through NCCL" "$BATS_TEST_TMPDIR/record/gpu-check.md" || fail "no check went through NCCL"
    grep -q "staged" "$BATS_TEST_TMPDIR/record/gpu-check.md" || fail "no check went staged"
}
