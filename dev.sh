#!/usr/bin/env bash
# dev.sh: set up, build, and run dpshim on a Debian machine.
#   ./dev.sh demo [NP]   install what is missing, build, train Fashion-MNIST on NP ranks (default 4)
#   ./dev.sh test        install what is missing, build, run every test (CTest: unit + bats)
#   ./dev.sh bench       benchmarks, each printed as a ratio measured side by side in one run
#   ./dev.sh gpu-check [PART] [--out DIR]  on a machine with a GPU: run the GPU checks (PART:
#                        preflight, staged, nccl, torch, bench or all) building there unless
#                        gpu-pack built it here), write docs/gpu-check.md
#   ./dev.sh gpu-pack [DIR]  build what gpu-check runs into DIR (build-gpu/), to carry to a GPU
#                        machine that cannot build it (no PMIx or libffi headers there)
#   ./dev.sh setup | build
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(build-essential cmake pkg-config openmpi-bin libopenmpi-dev libpmix-dev libffi-dev
          zlib1g-dev bats bats-assert bats-support dataset-fashion-mnist python3 clang iproute2
          libclang-rt-14-dev python3-torch python3-torchvision munge slurmctld slurmd slurm-client)
BUILD_DIR=$(realpath -m "${BUILD_DIR:-build}")

setup() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "dev.sh: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPSHIM_WERROR=ON >/dev/null
    cmake --build "$BUILD_DIR" -j"$(nproc)"
}

mpirun_env() {
    # Open MPI refuses root unless told; containers and CI run as root.
    if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
}

demo() {
    local np=${1:-4}
    mpirun_env
    echo "dev.sh: mpirun --bind-to none -np $np env DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_FILES_RANK0_ONLY='*.ckpt' LD_PRELOAD=$BUILD_DIR/lib/libdpshim.so $BUILD_DIR/bin/fmnist_train --epochs 3 --save $BUILD_DIR/fmnist.ckpt"
    # --bind-to none: Open MPI's default binds each rank to one core at np <= 2 (README, Performance)
    timeout 1800 mpirun --oversubscribe --bind-to none -np "$np" env DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_FILES_RANK0_ONLY='*.ckpt' \
        LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/fmnist_train" --epochs 3 --save "$BUILD_DIR/fmnist.ckpt"
}

run_tests() {
    mpirun_env
    # the unit tests again under AddressSanitizer and UBSan, in a build of their own
    cmake -S . -B "$BUILD_DIR-sanitize" -DDPSHIM_SANITIZE=ON -DDPSHIM_WERROR=ON >/dev/null
    cmake --build "$BUILD_DIR-sanitize" -j"$(nproc)" --target unit_tests >/dev/null
    ctest --test-dir "$BUILD_DIR-sanitize" -L unit --output-on-failure
    ctest --test-dir "$BUILD_DIR" --output-on-failure
}

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# ratio X Y: X / Y
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { print x / y }'; }

bench_files() {
    local dir n=50000 rounds=11
    # tmpfs when there is one: the disk's own noise would hide what the shim adds
    dir=$(mktemp -d -p "$([ -d /dev/shm ] && echo /dev/shm || echo /tmp)")
    echo "open+write+close of an unmatched path in $dir, $n iterations, $rounds rounds, each with and without"
    echo "the shim back to back: medians, and the median of the rounds' ratios (what the machine's drift spares):"
    printf '  %-44s %10s %10s %7s\n' "policy" "plain ns" "shim ns" "ratio"
    local -a policies=("(no [files] globs)|" "rank0_only = *.ckpt, per_rank = *.log|*.ckpt" \
                       "rank0_only = ckpts/** /scratch/**|ckpts/** /scratch/**")
    for row in "${policies[@]}"; do
        local label=${row%%|*} globs=${row#*|} plain=() shim=() ratios=() p s
        for _ in $(seq "$rounds"); do
            p=$("$BUILD_DIR/bin/bench_files" $n "$dir/data.bin")
            s=$(env DPSHIM_FILES_RANK0_ONLY="$globs" DPSHIM_FILES_PER_RANK="${globs:+*.log}" \
                LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/bench_files" $n "$dir/data.bin")
            plain+=("$p") shim+=("$s") ratios+=("$(ratio "$s" "$p")")
        done
        printf '  %-44s %10.1f %10.1f %7.3f\n' "$label" "$(printf '%s\n' "${plain[@]}" | median)" \
            "$(printf '%s\n' "${shim[@]}" | median)" "$(printf '%s\n' "${ratios[@]}" | median)"
    done
    rm -rf "$dir"
}

# A rank0_only path at np=2: rank 0 makes the call and posts its outcome, rank 1 waits for it and
# writes to a file of its own; against the same two processes without the shim, each on a path
# of its own (the disk and the cores are shared either way).
bench_files_gated() {
    local dir n=5000 rounds=5 mode
    dir=$(mktemp -d) # not under /dev, which no glob matches
    echo "a rank0_only path at np=2 in $dir, $n iterations, median of $rounds alternating rounds:"
    for mode in save load; do
        local plain=() r0=() r1=() out arg=${mode/save/}
        for _ in $(seq "$rounds"); do
            # shellcheck disable=SC2016 # expanded by each rank's shell
            out=$(timeout 300 mpirun --oversubscribe -np 2 --tag-output sh -c \
                'exec "$0" "$1" "$2.$OMPI_COMM_WORLD_RANK.ckpt" $3' "$BUILD_DIR/bin/bench_files" $n "$dir/p" "$arg")
            plain+=("$(sed -n 's/^\[1,0\]<stdout>://p' <<<"$out")")
            out=$(timeout 300 mpirun --oversubscribe -np 2 --tag-output env DPSHIM_FILES_RANK0_ONLY='*.ckpt *.tmp' \
                LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/bench_files" $n "$dir/m.ckpt" ${arg:+"$arg"})
            r0+=("$(sed -n 's/^\[1,0\]<stdout>://p' <<<"$out")")
            r1+=("$(sed -n 's/^\[1,1\]<stdout>://p' <<<"$out")")
        done
        local without on0 on1
        without=$(printf '%s\n' "${plain[@]}" | median)
        on0=$(printf '%s\n' "${r0[@]}" | median) on1=$(printf '%s\n' "${r1[@]}" | median)
        printf '  %-38s without %8.1f ns   rank 0 %8.1f ns (%.2fx)   rank 1 %8.1f ns (%.2fx)\n' \
            "$([ $mode = save ] && echo "open+write+close:" || echo "save to .tmp, rename over, read back:")" \
            "$without" "$on0" "$(ratio "$on0" "$without")" "$on1" "$(ratio "$on1" "$without")"
    done
    rm -rf "$dir"
}

# Seconds of the trainer's epoch line "(x s)".
epoch_seconds() { sed -n 's/^epoch 1: .*(\([0-9.]*\) s)$/\1/p' | head -1; }

bench_guard() {
    local np
    for np in 4 2; do bench_guard_at "$np"; done
}

# The demo's first epoch under Open MPI's default binding and under --bind-to none, alternating,
# at np=2 and 4, with [comm] overlap as decided (auto) and forced on (its progress thread needs a
# core of its own): what the placement costs the trainer.
bench_placement() {
    local np overlap rounds=3
    echo "the example trainer's first epoch (split mode, the demo's settings), median of $rounds alternating rounds:"
    for overlap in auto on; do
        for np in 2 4; do
            local bound=() free=() ratios=() b f
            for _ in $(seq "$rounds"); do
                b=$(placement_run "$np" "$overlap")
                f=$(placement_run "$np" "$overlap" --bind-to none)
                bound+=("$b") free+=("$f") ratios+=("$(ratio "$b" "$f")")
            done
            printf '  np=%d overlap %-4s  default binding %6.2f s  --bind-to none %6.2f s  default/none %.2f (rounds: %s)\n' \
                "$np" "$overlap" "$(printf '%s\n' "${bound[@]}" | median)" "$(printf '%s\n' "${free[@]}" | median)" \
                "$(printf '%s\n' "${ratios[@]}" | median)" "${ratios[*]}"
        done
    done
}

# placement_run NP OVERLAP [MPIRUN ARGS...]: seconds of the demo trainer's first epoch.
placement_run() {
    local np=$1 overlap=$2
    shift 2
    timeout 600 mpirun --oversubscribe "$@" -np "$np" env DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_COMM_OVERLAP="$overlap" \
        LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/fmnist_train" --epochs 1 --no-eval 2>/dev/null |
        epoch_seconds
}

# The shim's all-reduce against plain MPI_Allreduce calls in each kind of program: one that calls
# MPI_Init itself, one that never calls MPI (the shim initializes it), and a Python process with
# torch loaded. The sweep's ratio per size side by side, then the named sets.
bench_allreduce() {
    local np world set out
    out=$(mktemp -d)
    for np in 2 3 4; do
        for world in program shim python; do
            timeout 600 mpirun --oversubscribe -np $np env LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" \
                "$BUILD_DIR/bin/dpshim-diag" bench --init $world sweep >"$out/$world" 2>&1 ||
                { cat "$out/$world"; return 1; }
        done
        echo "all-reduce of one f32 buffer at np=$np, plain/dpshim time (median of 7 alternating rounds; above 1: dpshim faster; * where a result differed)"
        awk 'FNR == 1 { w++ } $1 ~ /^[0-9]+$/ && NF == 9 { r[$1, w] = $8 ($9 == "yes" ? " " : "*"); if (w == 1) b[++n] = $1 }
             END { printf "%12s  %-18s %-18s %-18s\n", "bytes", "MPI_Init by program", "MPI by the shim", "Python with torch"
                   for (i = 1; i <= n; i++) printf "%12s  %-18s %-18s %-18s\n", b[i], r[b[i], 1], r[b[i], 2], r[b[i], 3] }' \
            "$out/program" "$out/shim" "$out/python"
        for set in 64 resnet50 small; do
            for world in program shim python; do
                timeout 600 mpirun --oversubscribe -np $np env LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" \
                    "$BUILD_DIR/bin/dpshim-diag" bench --init $world $set 2>&1 | grep -v 'WARN guard'
            done
        done
    done
    rm -rf "$out"
    for np in 2 4; do
        timeout 600 mpirun --oversubscribe -np $np env LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" \
            "$BUILD_DIR/bin/dpshim-diag" bench overlap 2>&1 | grep -v 'WARN guard'
    done
    bench_mean_vs_sum
}

# What averaging costs against plain sums ([comm] reduce = mean vs sum), dp_grads' own time,
# alternating runs at np=2.
bench_mean_vs_sum() {
    local set reduce rounds=3
    echo "[comm] reduce = mean vs sum, dp_grads time at np=2 (median of $rounds alternating runs, each a median of 7 rounds):"
    for set in resnet50 64; do
        local -A ms=()
        for _ in $(seq "$rounds"); do
            for reduce in mean sum; do
                ms[$reduce]+="$(timeout 600 mpirun -np 2 env DPSHIM_COMM_REDUCE=$reduce LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" \
                    "$BUILD_DIR/bin/dpshim-diag" bench "$set" 2>/dev/null | awk '/dpshim dp_grads/ { print $4 }') "
            done
        done
        local mean sum
        mean=$(xargs -n1 <<<"${ms[mean]}" | median)
        sum=$(xargs -n1 <<<"${ms[sum]}" | median)
        printf "  %-9s mean %8.2f ms  sum %8.2f ms  mean/sum %.2f\n" "$set" "$mean" "$sum" "$(ratio "$mean" "$sum")"
    done
}

case "${1:-}" in
setup) setup ;;
build) setup && build ;;
demo) setup && build && demo "${2:-4}" ;;
test) setup && build && run_tests ;;
gpu-check) exec bash tests/gpu/gpu_check.sh "${@:2}" ;;
gpu-pack) gpu_pack "${2:-}" ;;
bench) setup && build && mpirun_env && bench_exec && bench_files && bench_files_gated && bench_ffi && bench_single && bench_allreduce && bench_scale && bench_guard && bench_placement && bench_ddp ;;
*)
    sed -n '2,/dev\.sh setup/p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
