#!/usr/bin/env bash
# Every GPU check in one command, for a machine with a GPU (./dev.sh gpu-check): builds the tree
# there, then runs the GPU path through the real CUDA runtime and NCCL, and writes what it ran and
# what it measured to docs/gpu-check.md (the record that goes into the repository).
#
# It builds there (cmake, a C compiler, nvcc, Open MPI with its headers, PMIx and libffi headers)
# unless build-gpu/ holds what `./dev.sh gpu-pack` built elsewhere and carried over; libraries in
# build-gpu/carry-lib are used only where the machine lacks them. Each check prints PASS or
# FAIL; the exit status is the number of FAILs.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
RECORD=${GPU_RECORD:-$ROOT/docs/gpu-check.md}
fails=0
log=$(mktemp)

if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
note() { echo "$*" | tee -a "$log"; }
# check NAME CMD...: runs CMD (output kept in the record), PASS on exit 0.
check() {
    local name=$1
    shift
    note ""
    note "### $name"
    note '```'
    note "\$ $*"
    local t0=$SECONDS out rc
    out=$(timeout --kill-after=10 300 bash -c '"$@"' check "$@" 2>&1) # bash: `mpi` is a function
    rc=$?
    echo "$out" | tail -n 40 | tee -a "$log"
    note '```'
    if [ $rc -eq 0 ]; then note "PASS ($((SECONDS - t0)) s)"; else note "FAIL (exit $rc, $((SECONDS - t0)) s)"; fails=$((fails + 1)); fi
}
mpi() { mpirun --oversubscribe --allow-run-as-root -np "$@"; }
export -f mpi

note "# GPU check, $(date -u +%F)"
note ""
note "Machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores"

if [ -x "$BUILD/bin/dpshim-diag" ] && [ -x "$BUILD/bin/gpu_hooks_cuda" ] && [ -d "$BUILD/carry-lib" ]; then
    note ""
    note "Prebuilt by ./dev.sh gpu-pack: $BUILD"
else
    check "build" bash "$ROOT/dev.sh" gpu-pack "$BUILD"
fi
# the carried libraries this machine lacks, and only those (none where it built them)
lacking=$(mktemp -d)
have=$(ldconfig -p)
for lib in "$BUILD"/carry-lib/*; do
    grep -q "^[[:space:]]*$(basename "$lib") " <<<"$have" || ln -s "$lib" "$lacking/"
done
note "Carried libraries used: $(ls "$lacking" | tr '\n' ' ')"
export LD_LIBRARY_PATH=$lacking${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SHIM=$BUILD/lib/libdpshim.so
G=$BUILD/bin/gpu_hooks_cuda
check "dpshim-diag env" "$BUILD/bin/dpshim-diag" env

# Two ranks on the one GPU: NCCL refuses that, so the ranks agree on staging; then the same
# through real NCCL, each rank with its own NCCL_HOSTID so NCCL's duplicate check lets it pass.
for hook in grads ready params bn; do
    check "np=2 on one GPU, staged: gpu_hooks --hook $hook, every dtype, against the host path" \
        mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$G" --hook $hook --dtype all
done
H=$ROOT/tests/gpu/own_hostid.sh
for hook in grads ready params bn; do
    check "np=2 on one GPU, NCCL with one NCCL_HOSTID per rank: gpu_hooks --hook $hook, every dtype" \
        mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$H" "$G" --hook $hook --dtype all
done
check "np=2 NCCL, a named stream and a late producer" \
    mpi 2 env CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$SHIM" "$H" "$G" --stream --late --dtype all --steps 3
check "np=2 NCCL, split mode with uneven shares" \
    mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DATA_MODE=split LD_PRELOAD="$SHIM" "$H" "$G" --batch 7 --dtype all

# The CUDA example alone and on two ranks: the same final parameters up to float rounding.
T=$BUILD/bin/cuda_train
check "cuda_train alone vs np=2 (staged)" sh -c "'$T' --steps 50 --save /tmp/alone.bin >/tmp/alone.txt &&
    mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_FILES_RANK0_ONLY='/tmp/np2.bin' LD_PRELOAD='$SHIM' '$T' --steps 50 --save /tmp/np2.bin >/tmp/np2.txt &&
    tail -1 /tmp/alone.txt && tail -1 /tmp/np2.txt && python3 -c \"import numpy as np
a, b = (np.fromfile(f, dtype=np.uint8)[24:].view(np.float32) for f in ('/tmp/alone.bin', '/tmp/np2.bin'))
d = float(np.abs(a - b).max() / np.abs(a).max()); print('max rel diff', d); assert d < 1e-4\""

# A rank that stops calling hooks after its first step: its peer's GPU collective never completes,
# and the guard ends the job within timeout + 15 s, waiting in the hook and with a named stream.
for stream in "" --stream; do
    check "a stalled GPU collective ends the job within timeout + 15 s ${stream:-(legacy stream)}" sh -c "t0=\$(date +%s);
        mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_GUARD_TIMEOUT=5 LD_PRELOAD='$SHIM' '$H' \
            '$G' $stream --dtype f32 --steps 3 --sleep-rank 1; rc=\$?;
        echo exit \$rc after \$((\$(date +%s) - t0)) s; [ \$rc -ne 0 ] && [ \$((\$(date +%s) - t0)) -le 25 ]"
done

# PyTorch on CUDA: the adapter hands CUDA tensors to the hooks with torch's current stream.
check "PyTorch CUDA script alone vs np=2" sh -c "cd '$ROOT/tests/gpu' && python3 torch_cuda.py --out /tmp/t1.pt &&
    mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_FILES_RANK0_ONLY='/tmp/t2.pt' LD_PRELOAD='$SHIM' python3 torch_cuda.py --out /tmp/t2.pt &&
    python3 -c \"import torch; a=torch.load('/tmp/t1.pt'); b=torch.load('/tmp/t2.pt'); d=max(((a[k]-b[k]).abs().max()/a[k].abs().max().clamp(min=1e-30)).item() for k in a if a[k].is_floating_point()); print('max rel diff', d); assert d < 1e-4\""

# Benchmarks (figures, never pass/fail on a timing): copies through pinned vs pageable memory,
# and dp_grads on a device buffer against the host path, staging by hand and NCCL directly.
check "benchmark: staged (backend = mpi), 64 MiB on np=2" \
    mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_COMM_BACKEND=mpi LD_PRELOAD="$SHIM" "$H" "$BUILD/bin/dpshim-diag" bench gpu
check "benchmark: NCCL (one NCCL_HOSTID per rank), 64 MiB on np=2" \
    mpi 2 env CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$SHIM" "$H" "$BUILD/bin/dpshim-diag" bench gpu

note ""
note "$fails check(s) failed."
mkdir -p "$(dirname "$RECORD")"
cp "$log" "$RECORD"
exit $fails
