#!/usr/bin/env bash
# Every GPU check in one command, for a machine with a GPU (./dev.sh gpu-check [PART] [--out DIR]):
# runs the GPU path through the real CUDA runtime and NCCL and appends each check's command,
# output and result to DIR/gpu-check.md as it goes (default docs/), so a run cut short still
# leaves what it did.
#
# PART: preflight | staged | nccl | torch | libtorch | bench | all (default). Every part starts with the
# pre-flight: what was found where (driver, GPU, torch, NCCL and cudart, mpirun). It builds there
# (cmake, a C compiler, nvcc, Open MPI with its headers, PMIx and libffi headers) unless
# build-gpu/ holds what `./dev.sh gpu-pack` built elsewhere; libraries in build-gpu/carry-lib are
# used only where the machine lacks them. NCCL and the CUDA runtime are taken where PyTorch keeps
# them when the library path has none. A check meant for NCCL that ran staged FAILS. Each check is
# bounded (120 s unless its LIMIT says otherwise); the exit status is the number of FAILs. Open
# MPI's runtime comes from build-gpu/ompi where gpu-pack put it there. --double runs the parts
# that need no real GPU (staged, nccl, and bench's runs that need no program on the GPU) against
# the CUDA/NCCL test double carried in build-gpu, as a check of the bundle itself on a machine
# without a GPU.
#
# bench: the GPU comparison, side by side in one run on the one GPU, each figure a ratio (never a
# pass/fail on a timing), bounded to under 5 minutes in all, the figures gathered at the end under
# the card's name: the NCCL plugin's all-reduce (dp_grads) against ncclAllReduce called directly,
# 1-256 MiB, both waited for the same way, and one 64 MiB buffer four ways (the waits, the kinds
# of communicator, Open MPI's default binding and --bind-to none); the share of the reduction
# that dp_grad_ready hides behind a simulated backward; one rank under the shim against the
# program alone (cuda_train, and the PyTorch ResNet-18-like script); two ranks, the unmodified
# script under dpshim against the same converted to DDP (NCCL), and [comm] overlap on vs off
# (tests/gpu/bench_compare.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
part=all out_dir=$ROOT/docs double=0
while [ $# -gt 0 ]; do
    case $1 in
    --out) out_dir=$2; shift 2 ;;
    --double) double=1; shift ;;
    preflight | staged | nccl | torch | libtorch | bench | all) part=$1; shift ;;
    *) echo "gpu_check: unknown argument '$1' (PART: preflight|staged|nccl|torch|libtorch|bench|all; --out DIR; --double)" >&2; exit 2 ;;
    esac
done
mkdir -p "$out_dir" || exit 2
RECORD=$out_dir/gpu-check.md
fails=0

if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# an NCCL error code alone ("invalid argument") does not say which argument: NCCL's warnings do
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
note() { echo "$*" | tee -a "$RECORD"; }
# check NAME EXPECT CMD...: runs CMD (LIMIT seconds at most, 120 unless set; output kept in the
# record); PASS on exit 0 with EXPECT (a regular expression, or "" for none) in its output: the
# path the check took.
check() {
    local name=$1 expect=$2
    shift 2
    note ""
    note "### $name"
    note '```'
    note "\$ $*"
    local t0=$SECONDS out rc
    out=$(timeout --kill-after=10 "${LIMIT:-120}" bash -c '"$@"' check "$@" 2>&1) # bash: `mpi` is a function
    rc=$?
    LAST_OUT=$out
    echo "$out" | tail -n 40 | tee -a "$RECORD"
    note '```'
    if [ $rc -eq 0 ] && { [ -z "$expect" ] || grep -Eq -- "$expect" <<<"$out"; }; then
        note "PASS ($((SECONDS - t0)) s)"
    else
        [ $rc -eq 0 ] && rc="0, but no line matching '$expect': another path than the one meant"
        note "FAIL (exit $rc, $((SECONDS - t0)) s)"
        fails=$((fails + 1))
    fi
}
mpi() { mpirun --oversubscribe --allow-run-as-root -np "$@"; }
export -f mpi
want() { { [ "$part" = all ] || [ "$part" = "$1" ]; } && { [ $double = 0 ] || [[ "$1" != *torch ]]; }; }
[ -f "$BUILD/ompi/env.sh" ] && . "$BUILD/ompi/env.sh" # the Open MPI runtime gpu-pack carried

note ""
note "# GPU check ($part), $(date -u '+%F %T') UTC, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git')"
note ""
note "## Pre-flight"
note ""
if [ $double = 1 ]; then
    note "- GPU: the test double in $BUILD/tests/gpu_double (--double), one device"
else
    note "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo none)"
fi
note "- cores: $(nproc)"
torch_info=$(python3 -c 'import torch, os; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), os.path.dirname(torch.__file__))' 2>/dev/null)
note "- torch: ${torch_info:-not importable}"
# NCCL and cudart: the library path's, else where PyTorch's wheels keep them
site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
find_lib() {
    local name=$1 f
    f=$(ldconfig -p | awk -v l="$name" '$1 == l { print $NF; exit }')
    [ -n "$f" ] || for d in $site /usr/local/cuda/lib64 /usr/local/cuda/lib; do
        f=$(find "$d" -name "$name" 2>/dev/null | head -1)
        [ -n "$f" ] && break
    done
    echo "$f"
}
if [ $double = 1 ]; then
    nccl=$BUILD/tests/gpu_double/libnccl.so.2 cudart=$BUILD/tests/gpu_double/libcudart.so.13
    export GPU_DOUBLE_DEVICES=1 LD_LIBRARY_PATH=$BUILD/tests/gpu_double${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    nccl=$(find_lib libnccl.so.2)
    cudart=$(find_lib libcudart.so.13)
    [ -n "$cudart" ] || cudart=$(find_lib libcudart.so.12)
fi
[ -n "$nccl" ] && export DPSHIM_NCCL_LIB=$nccl
[ -n "$cudart" ] && export DPSHIM_CUDART_LIB=$cudart
note "- NCCL: ${nccl:-none found} (DPSHIM_NCCL_LIB)"
note "- CUDA runtime: ${cudart:-none found} (DPSHIM_CUDART_LIB)"
note "- mpirun: $(command -v mpirun || echo 'none: ./dev.sh gpu-pack carries one in build-gpu/ompi') $(mpirun --version 2>/dev/null | head -1)"
if ! command -v mpirun >/dev/null; then note ""; note "No mpirun: nothing else can run."; exit 1; fi

if [ -x "$BUILD/bin/dpshim-diag" ] && [ -x "$BUILD/bin/gpu_hooks_cuda" ] && [ -d "$BUILD/carry-lib" ]; then
    note "- build: prebuilt by ./dev.sh gpu-pack, $BUILD"
else
    check "build" "" env -u BUILD_DIR bash "$ROOT/dev.sh" gpu-pack "$BUILD"
fi
# the carried libraries this machine lacks, and only those (none where it built them)
lacking=$(mktemp -d)
have=$(ldconfig -p)
for lib in "$BUILD"/carry-lib/*; do
    [ -e "$lib" ] || continue
    grep -q "^[[:space:]]*$(basename "$lib") " <<<"$have" || ln -s "$lib" "$lacking/"
done
note "- carried libraries used: $(ls "$lacking" | tr '\n' ' ')"
export LD_LIBRARY_PATH=$lacking${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SHIM=$BUILD/lib/libdpshim.so
G=$BUILD/bin/gpu_hooks_cuda
[ $double = 1 ] && G=$BUILD/bin/gpu_hooks
H=$ROOT/tests/gpu/own_hostid.sh
NCCL_PATH="GPU tensors go through NCCL"
STAGED_PATH="GPU tensors go through host memory and MPI \(staged\)"
check "dpshim-diag env" "" "$BUILD/bin/dpshim-diag" env
[ "$part" = preflight ] && { note ""; note "$fails check(s) failed."; exit $fails; }

# Two ranks on the one GPU: NCCL refuses that, so the ranks agree on staging; then the same
# through real NCCL, each rank with its own NCCL_HOSTID so NCCL's duplicate check lets it pass.
if want staged; then
    for hook in grads ready params bn; do
        check "np=2 on one GPU, staged: gpu_hooks --hook $hook, every dtype, against the host path" "$STAGED_PATH" \
            mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$G" --hook $hook --dtype all
    done
    # going on after a lost rank: three ranks on the one GPU under the launcher's recovery mode,
    # rank 2 SIGKILLed before its second step; the others finish (status 0), and in every step
    # their GPU sums equal the host path's among the same ranks
    check "elastic: 3 ranks on one GPU, rank 2 SIGKILLed before its second step, the others go on" \
        "lost rank 2 .* 2 rank\(s\) go on" env CUDA_VISIBLE_DEVICES=0 DPSHIM_GUARD_TIMEOUT=30 \
        "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery "$G" --dtype f32 --steps 4 --kill-rank 2
fi
if want nccl; then
    for hook in grads ready params bn; do
        check "np=2 on one GPU, NCCL with one NCCL_HOSTID per rank: gpu_hooks --hook $hook, every dtype" "$NCCL_PATH" \
            mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$H" "$G" --hook $hook --dtype all
    done
    check "np=2 NCCL, a named stream and a late producer" "$NCCL_PATH" \
        mpi 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$H" "$G" --stream --late --dtype all --steps 3
    check "np=3 NCCL, split mode with uneven and empty shares (one operation on every rank)" "$NCCL_PATH" \
        mpi 3 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info DPSHIM_DATA_MODE=split LD_PRELOAD="$SHIM" "$H" "$G" --batch 2 --dtype all
    # going on after a lost rank through NCCL: three ranks (one NCCL_HOSTID each) under the
    # launcher's recovery mode, rank 2 SIGKILLed before its second step while the others wait in
    # the all-reduce: they give it up, make the communicator among themselves (ncclCommShrink
    # where NCCL has it) and finish, every step equal to the host path among the same ranks
    check "elastic, NCCL: 3 ranks, rank 2 SIGKILLed while the others wait in the all-reduce; they go on through NCCL" \
        "go on through NCCL among the 2 survivors" env CUDA_VISIBLE_DEVICES=0 DPSHIM_GUARD_TIMEOUT=30 DPSHIM_DIAG_LOG=info \
        "$BUILD/bin/dpshim-run" -np 3 --oversubscribe --enable-recovery "$H" "$G" --dtype all --steps 4 --kill-rank 2
fi

# The CUDA example alone and on two ranks (staged, then NCCL): the same final parameters up to
# float rounding.
if want staged || want nccl; then
    T=$BUILD/bin/cuda_train
    for way in staged nccl; do
        want $way && [ $double = 0 ] || continue # built with nvcc against the real runtime
        wrap=; expect=$STAGED_PATH
        [ $way = nccl ] && wrap=$H expect=$NCCL_PATH
        check "cuda_train alone vs np=2 ($way)" "$expect" sh -c "'$T' --steps 50 --save /tmp/alone.bin >/tmp/alone.txt &&
            mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info DPSHIM_FILES_RANK0_ONLY='/tmp/np2.bin' LD_PRELOAD='$SHIM' $wrap '$T' --steps 50 --save /tmp/np2.bin >/tmp/np2.txt &&
            tail -1 /tmp/alone.txt && tail -1 /tmp/np2.txt && python3 -c \"import numpy as np
a, b = (np.fromfile(f, dtype=np.uint8)[24:].view(np.float32) for f in ('/tmp/alone.bin', '/tmp/np2.bin'))
d = float(np.abs(a - b).max() / np.abs(a).max()); print('max rel diff', d); assert d < 1e-4\""
    done
    # A rank that stops calling hooks after its first step: its peer's GPU collective never
    # completes, and the guard ends the job within timeout + 15 s, in the hook and queued.
    for stream in "" --stream; do
        check "a stalled GPU collective ends the job within timeout + 15 s ${stream:-(legacy stream)}" "" sh -c "t0=\$(date +%s);
            mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_GUARD_TIMEOUT=5 LD_PRELOAD='$SHIM' '$H' \
                '$G' $stream --dtype f32 --steps 3 --sleep-rank 1; rc=\$?;
            echo exit \$rc after \$((\$(date +%s) - t0)) s; [ \$rc -eq 75 ] && [ \$((\$(date +%s) - t0)) -le 25 ]"
    done
fi

# PyTorch on CUDA: the adapter hands CUDA tensors to the hooks with torch's current stream; TF32
# off, since the comparison has a tolerance.
if want torch; then
    for way in staged nccl; do
        wrap=; expect=$STAGED_PATH
        [ $way = nccl ] && wrap=$H expect=$NCCL_PATH
        check "PyTorch CUDA script alone vs np=2 ($way)" "$expect" sh -c "cd '$ROOT/tests/gpu' && python3 torch_cuda.py --out /tmp/t1.pt &&
            mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info DPSHIM_FILES_RANK0_ONLY='/tmp/t2.pt' LD_PRELOAD='$SHIM' $wrap python3 torch_cuda.py --out /tmp/t2.pt &&
            python3 -c \"import torch; a=torch.load('/tmp/t1.pt'); b=torch.load('/tmp/t2.pt'); d=max(((a[k]-b[k]).abs().max()/a[k].abs().max().clamp(min=1e-30)).item() for k in a if a[k].is_floating_point()); print('max rel diff', d); assert d < 1e-4\""
    done
    # [optim] shard on the GPU: Adam on a 6.4M-parameter model, sharded and not, through NCCL:
    # the same weights bit for bit, and each rank's peak GPU memory and optimizer state printed
    check "PyTorch CUDA Adam, [optim] shard on vs off at np=2 (nccl): bitwise, memory per rank" "$NCCL_PATH" sh -c "cd '$ROOT/tests/gpu' &&
        for s in off on; do mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info DPSHIM_OPTIM_SHARD=\$s DPSHIM_OUTPUT_STDOUT=prefix DPSHIM_FILES_RANK0_ONLY=/tmp/s\$s.pt LD_PRELOAD='$SHIM' $H python3 torch_cuda.py --opt adam --wide --out /tmp/s\$s.pt >/tmp/s\$s.txt || exit 1; sed \"s/^/shard \$s /\" /tmp/s\$s.txt; done &&
        python3 -c \"import torch; a=torch.load('/tmp/soff.pt'); b=torch.load('/tmp/son.pt'); assert all(torch.equal(a[k], b[k]) for k in a); print('bitwise equal')\""
fi

# A C++ program on libtorch with CUDA tensors: the libtorch adapter and the C++ trainer built
# here against PyTorch's own libtorch (tests/gpu/libtorch/), the adapter joining the plugins of
# the libdpshim.so above; the trainer (float64) alone and at np=2, staged and through NCCL: rank
# 0 prints what it prints alone, to 1e-9, and the hooks saw GPU tensors (on torch's stream).
if want libtorch; then
    LT=/tmp/dpshim-libtorch
    LIMIT=600 check "build the libtorch adapter and the C++ trainer against PyTorch's libtorch" "" sh -c "
        cmake -S '$ROOT/tests/gpu/libtorch' -B $LT -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_PREFIX_PATH=\$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') >/dev/null &&
        cmake --build $LT -j\$(nproc) >/dev/null && mkdir -p $LT/all && ln -sf '$BUILD'/lib/dpshim/* $LT/plugins/* $LT/all/ &&
        cat $LT/plugins/libdpshim-libtorch.needs"
    for way in staged nccl; do
        wrap=; expect=$STAGED_PATH
        [ $way = nccl ] && wrap=$H expect=$NCCL_PATH
        check "C++ trainer on CUDA (libtorch) alone vs np=2 ($way)" "$expect" sh -c "
            $LT/torch_trainer --cuda --epochs 2 --hidden 64 >/tmp/lt1.txt &&
            mpirun --allow-run-as-root -np 2 env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info DPSHIM_OUTPUT_STDOUT=rank0 \
                DPSHIM_PLUGIN_DIR=$LT/all LD_PRELOAD='$SHIM' $wrap $LT/torch_trainer --cuda --epochs 2 --hidden 64 \
                >/tmp/lt2.txt 2>/tmp/lt2.err; rc=\$?; grep -E 'GPU tensors go|libtorch|nothing was' /tmp/lt2.err | sort -u;
            [ \$rc -eq 0 ] && ! grep -q 'nothing was distributed' /tmp/lt2.err &&
            python3 '$ROOT/tests/gpu/libtorch/same_as_alone.py' /tmp/lt1.txt /tmp/lt2.txt"
    done
fi

# Benchmarks (figures, never pass/fail on a timing; a check fails only where a run failed or
# took another path than the one meant). Every multi-rank run but one is launched with
# --bind-to none, the line docs/launching.md gives: Open MPI's default binding puts a rank and
# its NCCL threads on one core at np <= 2. On an H200 the part takes about 5 minutes; each LIMIT
# leaves its runs (every one starts Python and CUDA) room to spare.
if want bench; then
    t_bench=$SECONDS
    figs=$(mktemp)
    # figure LABEL REGEX: the last check's lines that match, for the summary at the end
    figure() { grep -E -- "$2" <<<"$LAST_OUT" | grep -v '^\[dpshim' | sed "s/^/$1/" >>"$figs"; }
    D=$BUILD/bin/dpshim-diag
    # the double's "GPU" is this machine's memory and its cores, which a CI machine shares: smaller
    # buffers, and twice the time (its figures prove the harness, not the speed)
    sizes= big=64 x=1
    [ $double = 1 ] && sizes=:1,4,16 big=16 x=2
    swept=${sizes#:}
    LIMIT=$((45 * x)) check "bench: dp_grads through the NCCL plugin vs ncclAllReduce called directly, ${swept:-1,4,16,64,256} MiB, np=2" "$NCCL_PATH" \
        mpi 2 --bind-to none env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$H" "$D" bench gpu-sweep$sizes
    figure "" '^gpu-sweep|^ +(MiB|[0-9]+ )|^  ratio ='
    echo "  (target: ratio >= 0.95 at every size)" >>"$figs"
    for bind in "default binding" "--bind-to none"; do
        how=(--bind-to none); [ "$bind" = "default binding" ] && how=()
        LIMIT=$((20 * x)) check "bench: one $big MiB buffer, np=2, ${bind#--}: dp_grads vs NCCL called directly four ways" "$NCCL_PATH" \
            mpi 2 "${how[@]}" env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$H" "$D" bench gpu:$big
        figure "$(printf '%d MiB, %-16s' $big "$bind:")" 'ncclAllReduce directly|^    (the same|blocking)|dp_grads, device buffer|vs NCCL called directly'
    done
    # what going on after a loss costs a healthy job: each hook call on a kept copy
    LIMIT=$((20 * x)) check "bench: one $big MiB buffer, np=2, --bind-to none, under --enable-recovery (elastic)" "$NCCL_PATH" \
        mpi 2 --bind-to none --enable-recovery env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$H" "$D" bench gpu:$big
    figure "$(printf '%d MiB, %-16s' $big "elastic:")" 'dp_grads on the device buffer|vs NCCL called directly'
    LIMIT=$((20 * x)) check "bench: overlap on device buffers, ResNet-50's tensors, simulated backward, np=2" "$NCCL_PATH" \
        mpi 2 --bind-to none env CUDA_VISIBLE_DEVICES=0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" "$H" "$D" bench gpu-overlap
    figure "" '^gpu-overlap|hidden behind backward'
    if [ $double = 0 ]; then
        export SHIM DIAG=$D BIN=$BUILD/bin RUN_LIMIT=40
        LIMIT=25 check "bench: cuda_train alone vs one rank under the shim" "overhead per step" \
            bash "$ROOT/tests/gpu/bench_compare.sh" cuda-train cuda
        figure "" '^cuda_train|overhead'
        LIMIT=80 check "bench: PyTorch ResNet-18-like alone vs one rank under the shim" "overhead per step" \
            bash "$ROOT/tests/gpu/bench_compare.sh" torch-one-rank cuda
        figure "" '^PyTorch|overhead'
        LIMIT=200 check "bench: np=2 on one GPU, the PyTorch script under dpshim vs DDP (NCCL), BatchNorm synchronized and not; [comm] overlap on vs off" "$NCCL_PATH" \
            bash "$ROOT/tests/gpu/bench_compare.sh" torch-np2 cuda
        figure "" '^PyTorch|^  (BatchNorm|dpshim|\[comm\]|reduction)'
    else
        note ""
        note "(bench: cuda_train and the PyTorch runs need a real GPU: not with --double)"
    fi
    LIMIT=$((20 * x)) check "bench: staged (backend = mpi), $big MiB on np=2" "" \
        mpi 2 --bind-to none env CUDA_VISIBLE_DEVICES=0 DPSHIM_COMM_BACKEND=mpi LD_PRELOAD="$SHIM" "$H" "$D" bench gpu:$big
    figure "staged: " 'pinned memory|dp_grads, device buffer'
    if [ $double = 1 ]; then card="the test double (--double: the harness, not the speed)"
    else card=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1); fi
    note ""
    note "## Bench figures: ${card:-unknown GPU}, $(nproc) cores, $((SECONDS - t_bench)) s"
    note ""
    note '```'
    tee -a "$RECORD" <"$figs"
    note '```'
    rm -f "$figs"
fi

note ""
note "$fails check(s) failed."
exit $fails
