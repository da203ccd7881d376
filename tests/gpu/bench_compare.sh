#!/usr/bin/env bash
# bench_compare.sh WHAT [cuda|cpu]: the side-by-side runs of `./dev.sh gpu-check bench` that need
# a program on the GPU, each printed as a ratio (figures, never a pass/fail on a timing). Every
# run is launched the same way (mpirun --bind-to none, the rank's core mask left whole), the kinds
# alternate in each of ROUNDS rounds (default 2), and a figure is the median over the rounds.
#   cuda-train       examples/cuda's trainer alone against one rank under the shim: the shim's
#                    cost per step (cuda_train --time; alone = the same mpirun line without the
#                    preload)
#   torch-one-rank   tests/gpu/torch_resnet.py (ResNet-18-like) the same way
#   torch-np2        two ranks on the one GPU (each with its own NCCL_HOSTID, so that NCCL takes
#                    them for two hosts and runs between them): torch_resnet.py unmodified under
#                    dpshim (scale mode: the script's batch per rank, [comm] overlap on) against
#                    torch_resnet_ddp.py (NCCL, the same bucket size and per-rank batch), like for
#                    like: BatchNorm synchronized exactly (dpshim's default) against DDP with
#                    nn.SyncBatchNorm (GPU only), and [bn] sync = off against DDP's default (each
#                    rank its own statistics); then [bn] sync = off with [comm] overlap off: the
#                    share of the reduction hidden behind backward is (step off - step on) / the
#                    reduction alone, the reduction alone being dp_grads on one device buffer of
#                    the gradients' size on the same two ranks (dpshim-diag bench gpu-sweep:MiB)
# cpu (the CI test of the scripts and of this harness): the same on the CPU, small, DDP on gloo
# and dpshim's host path; the reduction alone from `dpshim-diag bench MiB`.
# Needs SHIM (libdpshim.so) and DIAG (dpshim-diag); BIN (cuda_train's folder) for cuda-train.
# Exit status: 1 when a run failed or printed no figure (its output is shown), else 0.
set -uo pipefail
what=${1:?WHAT: cuda-train, torch-one-rank or torch-np2} device=${2:-cuda}
here=$(cd "$(dirname "$0")" && pwd)
: "${SHIM:?SHIM: the path of libdpshim.so}" "${DIAG:=$(dirname "$SHIM")/../bin/dpshim-diag}"
rounds=${ROUNDS:-2} run_limit=${RUN_LIMIT:-90}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case $device in
cuda) batch=128 size=(--width 64 --image 32 --samples 4096) steps=(--warmup 5 --steps 30) one=(--warmup 10 --steps 100)
      gpu_env=(CUDA_VISIBLE_DEVICES=0) hostid=$here/own_hostid.sh ;;
cpu) batch=16 size=(--device cpu --width 8 --image 16 --samples 512) steps=(--warmup 1 --steps 4) one=("${steps[@]}")
     gpu_env=(OMP_NUM_THREADS=1) hostid= ;;
*) echo "bench_compare: device '$device': say cuda or cpu" >&2; exit 2 ;;
esac
size+=(--batch-size "$batch")
python=${PYTHON:-python3} # the one with torch (the GPU machine's PATH has it first)
logs=$(mktemp -d)
[ -n "${KEEP_LOGS:-}" ] || trap 'rm -rf "$logs"' EXIT
failed=0

# launch NAME NP CMD...: CMD on NP ranks under mpirun, bounded; its output kept as $logs/NAME.
launch() {
    local name=$1 np=$2
    shift 2
    timeout --kill-after=10 "$run_limit" mpirun --oversubscribe --bind-to none -np "$np" "$@" >"$logs/$name" 2>&1 </dev/null
}
# value NAME KEY: the number after KEY in NAME's output, else nothing (the run is shown, and the
# comparison fails: value runs in a subshell, so a file says so).
value() {
    local v
    v=$(awk -v k="$2" '$1 == k { print $2; exit }' "$logs/$1")
    if [ -z "$v" ]; then
        echo "bench_compare: the run $1 printed no $2; its output:" >&2
        tail -n 30 "$logs/$1" >&2
        touch "$logs/failed"
    fi
    echo "$v"
}
# ran NAME STATUS: a run that failed is shown, and fails the comparison (its figures still print).
ran() {
    [ "$2" -eq 0 ] && return 0
    echo "bench_compare: the run $1 exited with status $2; its output:" >&2
    tail -n 30 "$logs/$1" >&2
    failed=1
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

case $what in
cuda-train)
    : "${BIN:?BIN: the folder of cuda_train}"
    args=(--steps 400 --features 256 --hidden 1024 --batch 2048 --samples 8192 --print-every 0 --time)
    alone=() shim=()
    for r in $(seq "$rounds"); do
        launch alone.$r 1 env "${gpu_env[@]}" "$BIN/cuda_train" "${args[@]}"; ran alone.$r $?
        launch shim.$r 1 env "${gpu_env[@]}" LD_PRELOAD="$SHIM" "$BIN/cuda_train" "${args[@]}"; ran shim.$r $?
        alone+=("$(sed -n 's/.* steps timed .*, \([0-9.]*\) ms per step/\1/p' "$logs/alone.$r")")
        shim+=("$(sed -n 's/.* steps timed .*, \([0-9.]*\) ms per step/\1/p' "$logs/shim.$r")")
    done
    a=$(printf '%s\n' "${alone[@]}" | grep . | median) s=$(printf '%s\n' "${shim[@]}" | grep . | median)
    [ -n "$a" ] && [ -n "$s" ] || { echo "bench_compare: cuda_train printed no time per step" >&2; cat "$logs"/alone.1 >&2; exit 1; }
    awk -v a="$a" -v s="$s" -v n="$rounds" 'BEGIN {
        printf "cuda_train (MLP 256-1024-10, batch 2048), one rank: alone %.4f ms per step, under dpshim %.4f ms (medians of %d alternating rounds)\n", a, s, n
        printf "  overhead per step under dpshim: %+.2f%% (target <= 2%%)\n", 100 * (s / a - 1) }'
    ;;
torch-one-rank)
    alone=() shim=()
    for r in $(seq "$rounds"); do
        launch alone.$r 1 env "${gpu_env[@]}" "$python" "$here/torch_resnet.py" "${size[@]}" "${one[@]}"; ran alone.$r $?
        launch shim.$r 1 env "${gpu_env[@]}" LD_PRELOAD="$SHIM" "$python" "$here/torch_resnet.py" "${size[@]}" "${one[@]}"
        ran shim.$r $?
        alone+=("$(value alone.$r samples_per_s)") shim+=("$(value shim.$r samples_per_s)")
    done
    a=$(printf '%s\n' "${alone[@]}" | grep . | median) s=$(printf '%s\n' "${shim[@]}" | grep . | median)
    [ -n "$a" ] && [ -n "$s" ] || exit 1
    awk -v a="$a" -v s="$s" -v n="$rounds" -v d="$device" -v b="$batch" 'BEGIN {
        printf "PyTorch ResNet-18-like (%s, batch %d), one rank: alone %.1f samples/s, under dpshim %.1f samples/s (medians of %d alternating rounds)\n", d, b, a, s, n
        printf "  overhead per step under dpshim: %+.2f%% (target <= 2%%)\n", 100 * (a / s - 1) }'
    ;;
torch-np2)
    # the kinds of run, each a line of the table below: DDP's, then dpshim's (bn sync, overlap)
    kinds=(ddp nosync_on exact_on nosync_off)
    [ "$device" = cuda ] && kinds=(ddp ddp_sync "${kinds[@]:1}")
    declare -A sps=() ms=()
    grad=
    for r in $(seq "$rounds"); do
        for k in "${kinds[@]}"; do
            case $k in
            ddp*)
                sync=(); [ $k = ddp_sync ] && sync=(--sync-bn)
                launch $k.$r 2 env "${gpu_env[@]}" MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" $hostid \
                    "$python" "$here/torch_resnet_ddp.py" "${size[@]}" "${steps[@]}" --bucket-mb 25 "${sync[@]}" ;;
            *)
                bn=on; [ "${k%_*}" = nosync ] && bn=off
                launch $k.$r 2 env "${gpu_env[@]}" DPSHIM_DATA_MODE=scale DPSHIM_BN_SYNC=$bn DPSHIM_COMM_OVERLAP=${k##*_} \
                    DPSHIM_COMM_BUCKET_MB=25 DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_DIAG_LOG=info LD_PRELOAD="$SHIM" $hostid \
                    "$python" "$here/torch_resnet.py" "${size[@]}" "${steps[@]}" ;;
            esac
            ran $k.$r $?
            sps[$k]+=" $(value $k.$r samples_per_s)" ms[$k]+=" $(value $k.$r step_ms)"
        done
        grad=$(value exact_on.$r grad_mib)
    done
    # a job whose ranks each ran the whole program is no comparison
    if grep -l "no work was shared out\|nothing was distributed" "$logs"/exact_* "$logs"/nosync_* >&2; then
        echo "bench_compare: a dpshim run above shared no work out" >&2
        failed=1
    fi
    path=$(grep -ohE "GPU tensors go through (NCCL|host memory and MPI \(staged\))" "$logs"/exact_on.* | sort -u | paste -sd';' -)
    [ "$device" = cpu ] && path="host tensors: the host path"
    for k in "${kinds[@]}"; do
        sps[$k]=$(xargs -n1 <<<"${sps[$k]}" | median) ms[$k]=$(xargs -n1 <<<"${ms[$k]}" | median)
        [ -n "${sps[$k]}" ] && [ -n "${ms[$k]}" ] || exit 1
    done
    [ -n "$grad" ] || exit 1
    # the reduction alone: the gradients' size (whole MiB, rounded up) on the same two ranks
    mib=$(awk -v g="$grad" 'BEGIN { m = int(g); if (m < g) m++; print m < 1 ? 1 : m }')
    if [ "$device" = cuda ]; then
        launch reduce 2 env "${gpu_env[@]}" LD_PRELOAD="$SHIM" $hostid "$DIAG" bench gpu-sweep:$mib; ran reduce $?
        t_red=$(awk -v m="$mib" '$1 == m && NF == 7 { print $2; exit }' "$logs/reduce")
    else
        launch reduce 2 env "${gpu_env[@]}" LD_PRELOAD="$SHIM" "$DIAG" bench "$mib"; ran reduce $?
        t_red=$(awk '/dpshim dp_grads/ { for (i = 1; i < NF; i++) if ($(i + 1) == "ms") { print $i; exit } }' "$logs/reduce")
    fi
    [ -n "$t_red" ] || { echo "bench_compare: no time for the reduction alone:" >&2; cat "$logs/reduce" >&2; failed=1; t_red=0; }
    awk -v d="${sps[ddp]}" -v ds="${sps[ddp_sync]:-}" -v e="${sps[exact_on]}" -v s="${sps[nosync_on]}" \
        -v so="${sps[nosync_off]}" -v on="${ms[nosync_on]}" -v off="${ms[nosync_off]}" -v g="$grad" -v m="$mib" -v t="$t_red" \
        -v n="$rounds" -v dev="$device" -v b="$batch" -v path="${path:-no path named in its log}" 'BEGIN {
        printf "PyTorch ResNet-18-like (%s), np=2 on one %s, batch %d per rank, global samples/s, medians of %d alternating rounds (dpshim: scale mode, [comm] overlap on, %s):\n", dev, dev == "cuda" ? "GPU" : "machine", b, n, path
        if (ds != "")
            printf "  BatchNorm synchronized: dpshim (exact, its default) %.1f, DDP with SyncBatchNorm %.1f: dpshim/DDP %.2f (target >= 1.0)\n", 2 * e, 2 * ds, e / ds
        else
            printf "  BatchNorm synchronized: dpshim (exact, its default) %.1f; DDP with SyncBatchNorm: not on the CPU (PyTorch has it for GPUs only)\n", 2 * e
        printf "  BatchNorm per rank: dpshim ([bn] sync = off) %.1f, DDP (its default) %.1f: dpshim/DDP %.2f (target >= 1.0)\n", 2 * s, 2 * d, s / d
        printf "  dpshim exact sync vs DDP'"'"'s default: %.2f (exact sync costs %.1f%% of dpshim'"'"'s samples/s)\n", e / d, 100 * (1 - e / s)
        printf "  [comm] overlap on vs off ([bn] sync = off): %.2f vs %.2f ms per step (%.1f vs %.1f samples/s): overlap saves %.2f ms per step\n", on, off, 2 * s, 2 * so, off - on
        if (t > 0) {
            h = (off - on) / t; if (h < 0) h = 0; if (h > 1) h = 1
            printf "  reduction alone (dp_grads on one buffer of the gradients %.1f MiB, as %d MiB): %.2f ms; hidden behind backward: %.0f%% ((off - on) / reduction alone)\n", g, m, t, 100 * h
        } }'
    ;;
*)
    echo "bench_compare: '$what': say cuda-train, torch-one-rank or torch-np2" >&2
    exit 2
    ;;
esac
[ -e "$logs/failed" ] && failed=1
exit $failed
