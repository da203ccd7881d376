#!/usr/bin/env bash
# Every GPU check in one command, for a machine with a GPU (./dev.sh gpu-check): builds the tree
# there, then runs the GPU path through the real CUDA runtime and NCCL, and writes what it ran and
# what it measured to docs/gpu-check.md (the record that goes into the repository).
#
# The machine needs cmake, a C compiler, nvcc, Open MPI's mpirun and headers, and PyTorch with
# CUDA for the last check; headers it lacks (PMIx, libffi) can be carried unpacked in .gpu-deps/
# (see dev.sh gpu-deps). Each check prints PASS or FAIL; the exit status is the number of FAILs.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
RECORD=${GPU_RECORD:-$ROOT/docs/gpu-check.md}
fails=0
log=$(mktemp)

if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
deps=()
if [ -d .gpu-deps/usr/include ]; then deps=(-DCMAKE_C_FLAGS="-I$ROOT/.gpu-deps/usr/include -I$ROOT/.gpu-deps/usr/include/x86_64-linux-gnu"); fi

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
    out=$(timeout --kill-after=10 300 "$@" 2>&1)
    rc=$?
    echo "$out" | tail -n 40 | tee -a "$log"
    note '```'
    if [ $rc -eq 0 ]; then note "PASS ($((SECONDS - t0)) s)"; else note "FAIL (exit $rc, $((SECONDS - t0)) s)"; fails=$((fails + 1)); fi
}
mpi() { mpirun --oversubscribe --allow-run-as-root -np "$@"; }

note "# GPU check, $(date -u +%F)"
note ""
note "Machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores"

check "build" sh -c "cmake -S '$ROOT' -B '$BUILD' -DCMAKE_BUILD_TYPE=RelWithDebInfo ${deps[*]:+'${deps[*]}'} >/dev/null && cmake --build '$BUILD' -j$(nproc) --target dpshim dpshim-mpi dpshim-nccl dpshim-diag gpu_hooks_cuda cuda_train >/dev/null"
SHIM=$BUILD/lib/libdpshim.so
G=$BUILD/bin/gpu_hooks_cuda
check "dpshim-diag env" "$BUILD/bin/dpshim-diag" env

# Two ranks on the one GPU: NCCL refuses that, so the ranks agree on staging; then the same
# through real NCCL, each rank with its own NCCL_HOSTID so NCCL's duplicate check lets it pass.
for hook in grads ready params bn; do
    check "np=2 on one GPU, staged: dp_$hook, every dtype, against the host path" \
        mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$G" --hook $hook --dtype all
done
H=$ROOT/tests/gpu/own_hostid.sh
for hook in grads ready params bn; do
    check "np=2 on one GPU, NCCL with one NCCL_HOSTID per rank: dp_$hook, every dtype" \
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

# A peer that never joins a GPU collective: the guard ends the job within timeout + 15 s.
check "a stalled GPU collective ends the job within timeout + 15 s" sh -c "t0=\$(date +%s);
    mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_GUARD_TIMEOUT=5 LD_PRELOAD='$SHIM' '$H' sh -c \
        '[ \$OMPI_COMM_WORLD_RANK = 1 ] && sleep 60; exec $G --stream --steps 3'; rc=\$?;
    echo exit \$rc after \$((\$(date +%s) - t0)) s; [ \$rc -ne 0 ] && [ \$((\$(date +%s) - t0)) -le 25 ]"

# PyTorch on CUDA: the adapter hands CUDA tensors to the hooks with torch's current stream.
check "PyTorch CUDA script alone vs np=2" sh -c "cd '$ROOT/tests/gpu' && python3 torch_cuda.py --out /tmp/t1.pt &&
    mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_FILES_RANK0_ONLY='/tmp/t2.pt' LD_PRELOAD='$SHIM' python3 torch_cuda.py --out /tmp/t2.pt &&
    python3 -c \"import torch; a=torch.load('/tmp/t1.pt'); b=torch.load('/tmp/t2.pt'); d=max(((a[k]-b[k]).abs().max()/a[k].abs().max().clamp(min=1e-30)).item() for k in a if a[k].is_floating_point()); print('max rel diff', d); assert d < 1e-4\""

note ""
note "$fails check(s) failed."
mkdir -p "$(dirname "$RECORD")"
cp "$log" "$RECORD"
exit $fails
