#!/usr/bin/env bash
# dev.sh: set up, build, and run dpshim on a Debian machine.
#   ./dev.sh demo [NP]   install what is missing, build, train Fashion-MNIST on NP ranks (default 4)
#   ./dev.sh test        install what is missing, build, run every test (CTest: unit + bats)
#   ./dev.sh test-libtorch2  as root: the libtorch tests against Debian 13's libtorch 2.6 (and its
#                        GCC 14, Open MPI 5), built in a chroot that debootstrap makes in
#                        $TRIXIE_ROOT (default /var/tmp/dpshim-trixie) from the Debian mirror this
#                        machine's apt uses (DEBIAN_MIRROR=URI to name another), through its proxy
#   ./dev.sh libtorch2-packages  as root: that chroot and its packages only (no build, no tests)
#   ./dev.sh bench       benchmarks, each printed as a ratio measured side by side in one run
#   ./dev.sh bench-compare REV [PART...]  the library built from commit REV (OLD..NEW: from NEW
#                        instead of this tree) against this tree's, PARTs (exec, files, allreduce,
#                        single; default all) in BENCH_ROUNDS alternating rounds (3): new/old per part
#   ./dev.sh gpu-check [PART] [--out DIR]  on a machine with a GPU: run the GPU checks (PART:
#                        preflight, staged, nccl, torch, libtorch, bench or all) building there unless
#                        gpu-pack built it here), write docs/gpu-check.md
#   ./dev.sh gpu-pack [DIR]  build what gpu-check runs and copy it into DIR (build-gpu/), to carry
#                        to a GPU machine that cannot build it (no PMIx or libffi headers there)
#   ./dev.sh setup | build
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(build-essential cmake pkg-config openmpi-bin libopenmpi-dev libpmix-dev libffi-dev
          zlib1g-dev bats bats-assert bats-support dataset-fashion-mnist python3 clang iproute2
          libclang-rt-14-dev python3-torch python3-torchvision libtorch-dev munge slurmctld slurmd slurm-client
          time librsvg2-bin clang-format)
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
    # --bind-to none: Open MPI's default binds each rank to one core at np <= 2 (docs/performance.md)
    timeout 1800 mpirun --oversubscribe --bind-to none -np "$np" env DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_FILES_RANK0_ONLY='*.ckpt' \
        LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/fmnist_train" --epochs 3 --save "$BUILD_DIR/fmnist.ckpt"
}

# took WHAT START: how long since START ($SECONDS), said, so that a slow part is seen.
took() { echo "dev.sh: $1 took $((SECONDS - $2)) s"; }

run_tests() {
    mpirun_env
    local start=$SECONDS
    # the unit tests again under AddressSanitizer and UBSan, in a build of their own
    cmake -S . -B "$BUILD_DIR-sanitize" -DDPSHIM_SANITIZE=ON -DDPSHIM_WERROR=ON >/dev/null
    cmake --build "$BUILD_DIR-sanitize" -j"$(nproc)" --target unit_tests >/dev/null
    ctest --test-dir "$BUILD_DIR-sanitize" -L unit --output-on-failure
    took "building and running the unit tests under AddressSanitizer" $start && start=$SECONDS
    # the unit tests and the threaded integration cases (ctest -L threads) under ThreadSanitizer
    cmake -S . -B "$BUILD_DIR-tsan" -DDPSHIM_SANITIZE=thread -DDPSHIM_WERROR=ON >/dev/null
    cmake --build "$BUILD_DIR-tsan" -j"$(nproc)" --target unit_tests threads_tests >/dev/null
    ctest --test-dir "$BUILD_DIR-tsan" -L 'unit|threads' --output-on-failure
    took "building and running the ThreadSanitizer tests" $start && start=$SECONDS
    # one file at a time: two side by side slow each other's ranks past the guard's timeouts
    # (multinode.bats' 5 s agreement failed so beside guard.bats)
    ctest --test-dir "$BUILD_DIR" --output-on-failure
    took "every test" $start
}

# debian_mirror: the URI of the Debian archive (not its security archive) this machine's apt
# installs from, the first in apt's order (sources.list, then sources.list.d's *.list and deb822
# *.sources by name); DEBIAN_MIRROR, where set, instead. apt-config names the files, so
# APT_CONFIG can point it at others (tests/integration/dev_sh.bats does).
debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local list="" parts="" codename f uri=""
    eval "$(apt-config shell list Dir::Etc::sourcelist/f parts Dir::Etc::sourceparts/d)"
    # Debian's suite names; the host's own codename covers releases named after this was written
    codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null || true)
    for f in "$list" "${parts%/}"/*; do
        case $f in *.list | *.sources) ;; *) continue ;; esac
        [ -r "$f" ] || continue
        uri=$(awk -v deb822="$([[ $f == *.sources ]] && echo 1 || echo 0)" -v host="$codename" '
            function debian(suite, uri) {
                if (suite ~ /-security$|\/updates$/ || uri ~ /debian-security/ || uri !~ /^(https?|ftp|file):/) return 0
                sub(/-(updates|backports|backports-sloppy|proposed-updates)$/, "", suite)
                return suite ~ /^(buster|bullseye|bookworm|trixie|forky|duke|sid|experimental|(old)*stable|testing|unstable)$/ ||
                    (host != "" && suite == host)
            }
            # one-line format: deb [options] URI SUITE COMPONENTS...
            !deb822 { sub(/#.*/, ""); gsub(/\[[^]]*\]/, "") }
            !deb822 && $1 == "deb" && debian($3, $2) { print $2; exit }
            # deb822: paragraphs of fields; a line that starts with a blank continues the field
            function paragraph(   n, m, i, j, u, s) {
                if (tolower(f["enabled"]) != "no" && (" " f["types"] " ") ~ / deb /) {
                    n = split(f["uris"], u, " "); m = split(f["suites"], s, " ")
                    for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) if (debian(s[j], u[i])) { print u[i]; return 1 }
                }
                delete f
                return 0
            }
            deb822 && /^[ \t]*#/ { next }
            deb822 && /^[ \t]*$/ { if (paragraph()) exit; next }
            deb822 && /^[ \t]/ { f[key] = f[key] " " $0; next }
            deb822 && /:/ { key = tolower(substr($0, 1, index($0, ":") - 1)); f[key] = substr($0, index($0, ":") + 1)
                            gsub(/^[ \t]+|[ \t]+$/, "", f[key]) }
            END { if (deb822) paragraph() }' "$f" | head -1)
        if [ -n "$uri" ]; then
            echo "$uri"
            return
        fi
    done
    echo "dev.sh: no Debian archive in this machine's apt sources ($list, ${parts%/}/*.list, *.sources):" \
        "set DEBIAN_MIRROR to the URI of a Debian mirror (the directory that holds dists/trixie)" >&2
    return 1
}

# apt_proxy_conf: this machine's apt proxy settings as apt.conf lines, nothing where none is set.
apt_proxy_conf() {
    local http="" https=""
    eval "$(apt-config shell http Acquire::http::Proxy https Acquire::https::Proxy)"
    [ -z "$http" ] || printf 'Acquire::http::Proxy "%s";\n' "$http"
    [ -z "$https" ] || printf 'Acquire::https::Proxy "%s";\n' "$https"
}

# The libtorch adapter against a libtorch 2.x: Debian 13 (trixie) in a chroot, the source tree
# bound at /src, built there into /build. The chroot stays for the next run; its apt takes the
# mirror and the proxy that the host's apt has at each run.
TRIXIE_PACKAGES=(build-essential cmake pkg-config openmpi-bin libopenmpi-dev libpmix-dev libffi-dev zlib1g-dev
                 bats bats-assert bats-support python3 libtorch-dev binutils dataset-fashion-mnist)
# trixie_chroot WHAT: the chroot made and its packages installed; WHAT=tests then builds and runs
# the libtorch tests there, WHAT=packages stops after the packages (mostly downloads: CI makes them
# while the host's tests run)
trixie_chroot() {
    local what=$1 root=${TRIXIE_ROOT:-/var/tmp/dpshim-trixie}
    local mirror proxy
    mirror=$(debian_mirror) || exit 1
    proxy=$(apt_proxy_conf)
    # debootstrap fetches with wget, which takes its proxy from the environment
    local http_proxy=${http_proxy:-$(sed -n 's/^Acquire::http::Proxy "\(.*\)";$/\1/p' <<<"$proxy")}
    local https_proxy=${https_proxy:-$(sed -n 's/^Acquire::https::Proxy "\(.*\)";$/\1/p' <<<"$proxy")}
    [ -z "$http_proxy" ] || export http_proxy
    [ -z "$https_proxy" ] || export https_proxy
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
    if [ ! -x "$root/usr/bin/apt-get" ]; then
        if [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
            echo "dev.sh test-libtorch2: $root is not empty and holds no Debian system (an interrupted debootstrap?):" \
                "remove it, or set TRIXIE_ROOT to another directory" >&2
            exit 1
        fi
        echo "dev.sh: debootstrap of trixie from $mirror${http_proxy:+ through $http_proxy}"
        debootstrap --variant=minbase trixie "$root" "$mirror" >/dev/null
    fi
    echo "deb $mirror trixie main" >"$root/etc/apt/sources.list"
    if [ -n "$proxy" ]; then
        echo "$proxy" >"$root/etc/apt/apt.conf.d/01dpshim-proxy"
    else
        rm -f "$root/etc/apt/apt.conf.d/01dpshim-proxy"
    fi
    mkdir -p "$root/src"
    # in a mount namespace of its own: the mounts go with it, however it ends, and none reaches
    # the host's (a tmpfs on the chroot's /dev/shm is not one on the host's)
    local inside
    inside=$(cat <<'EOF'
root=$1 src=$2 packages=$3 what=$4
mount -t proc proc "$root/proc"
mount --bind /sys "$root/sys"
mount --bind /dev "$root/dev"
mount -t tmpfs shm "$root/dev/shm" # Open MPI's shared memory
mount --bind "$src" "$root/src"
chroot "$root" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends $packages >/dev/null"
[ "$what" = tests ] || exit 0
chroot "$root" bash -c 'set -e; cd /src
    cmake -S . -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPSHIM_WERROR=ON >/dev/null
    cmake --build /build -j"$(nproc)" >/dev/null
    [ -e /build/lib/dpshim/libdpshim-libtorch.so ] || { echo "dev.sh: the libtorch adapter was not built" >&2; exit 1; }
    echo "dev.sh: the libtorch tests with $(dpkg-query -W -f="libtorch \${Version}" libtorch-dev), $(mpirun --version | head -1), $(gcc --version | head -1)"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DPS_BUILD=/build timeout 1800 bats --timing tests/integration/libtorch.bats'
EOF
    )
    unshare --mount --propagation private bash -euo pipefail -c "$inside" inside "$root" "$PWD" "${TRIXIE_PACKAGES[*]}" "$what" </dev/null
}

test_libtorch2() {
    local what=$1 command
    command=$([ "$what" = tests ] && echo test-libtorch2 || echo libtorch2-packages)
    if [ "$(id -u)" -ne 0 ]; then # debootstrap, mount and chroot need root
        exec sudo ${TRIXIE_ROOT:+TRIXIE_ROOT="$TRIXIE_ROOT"} ${DEBIAN_MIRROR:+DEBIAN_MIRROR="$DEBIAN_MIRROR"} \
            "$PWD/dev.sh" "$command"
    fi
    trixie_chroot "$what"
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

# bench_guard_at NP: the guard's settings against every guard off, NP ranks
bench_guard_at() {
    local np=$1 rounds=11 steps=600 mode t off
    local -A env times to_off
    local modes="off on step1 full"
    env[off]="DPSHIM_GUARD_TIMEOUT=0 DPSHIM_GUARD_EXIT_BARRIER=off DPSHIM_GUARD_DESYNC=off DPSHIM_GUARD_DRIFT_EVERY=0"
    env[on]="DPSHIM_GUARD_DESYNC=step DPSHIM_GUARD_DRIFT_EVERY=100"
    env[step1]="DPSHIM_GUARD_DESYNC=step DPSHIM_GUARD_DRIFT_EVERY=1"
    env[full]="DPSHIM_GUARD_DESYNC=full DPSHIM_GUARD_DRIFT_EVERY=1"
    echo "example trainer, $np ranks, $steps steps (batch 100), $rounds alternating rounds: median times, and the"
    echo "median of the rounds' ratios to every guard off (what the machine's drift between rounds spares):"
    for _ in $(seq "$rounds"); do
        for mode in $modes; do
            # shellcheck disable=SC2086 # the settings are words
            t=$(timeout 600 mpirun --oversubscribe -np "$np" env DPSHIM_OUTPUT_STDOUT=rank0 ${env[$mode]} \
                LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/fmnist_train" --steps $steps --no-eval \
                2>/dev/null | epoch_seconds)
            [ "$mode" = off ] && off=$t
            times[$mode]+="$t " to_off[$mode]+="$(ratio "$t" "$off") "
        done
    done
    local -A what=([off]="every guard off:" [on]="watchdog, exit barrier, desync = step, drift every 100:"
        [step1]="the same with the drift check at every step:"
        [full]="every check at its most (desync = full, drift every step):")
    for mode in $modes; do
        printf '  %-60s %.3f s' "${what[$mode]}" "$(xargs -n1 <<<"${times[$mode]}" | median)"
        [ "$mode" = off ] && echo || printf '   ratio to off: %.3f\n' "$(xargs -n1 <<<"${to_off[$mode]}" | median)"
    done
}

# The C++ trainer on libtorch (tests/integration/libtorch/torch_trainer.cpp) alone and at np=2 in
# scale mode: training samples per second of its second epoch (the job's: every rank's samples
# over the slowest rank's time).
bench_torch_cpp() {
    local t="$BUILD_DIR/bin/torch_trainer" rounds=5 alone=() job=() a j
    local args=(--float --samples 20000 --batch 64 --hidden 512 --epochs 2)
    if [ ! -x "$t" ]; then
        echo "C++ trainer on libtorch: not built (install libtorch-dev and build again)"
        return 0
    fi
    echo "C++ trainer on libtorch (${args[*]}), samples/s of epoch 2, median of $rounds alternating rounds:"
    for _ in $(seq "$rounds"); do
        alone+=("$("$t" "${args[@]}" 2>&1 >/dev/null | awk '/^epoch 2 trained/ { print $5 / $(NF - 1) }')")
        job+=("$(timeout 600 mpirun --oversubscribe -np 2 env LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" \
            DPSHIM_DATA_MODE=scale "$t" "${args[@]}" 2>&1 >/dev/null |
            awk '/^epoch 2 trained/ { n += $5; if ($(NF - 1) > s) s = $(NF - 1) } END { print n / s }')")
    done
    a=$(printf '%s\n' "${alone[@]}" | median) j=$(printf '%s\n' "${job[@]}" | median)
    printf '  alone %.0f samples/s   np=2 scale mode %.0f samples/s   %.2fx\n' "$a" "$j" "$(ratio "$j" "$a")"
}

bench_single() {
    local rounds=7 plain=() shim=() np1=()
    echo "example trainer, 600 steps, median of $rounds alternating rounds:"
    for _ in $(seq "$rounds"); do
        plain+=("$("$BUILD_DIR/bin/fmnist_train" --steps 600 --no-eval | epoch_seconds)")
        shim+=("$(LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/fmnist_train" --steps 600 --no-eval | epoch_seconds)")
        np1+=("$(timeout 600 mpirun -np 1 env LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/fmnist_train" \
            --steps 600 --no-eval | epoch_seconds)")
    done
    local a b c
    a=$(printf '%s\n' "${shim[@]}" | median)
    b=$(printf '%s\n' "${plain[@]}" | median)
    c=$(printf '%s\n' "${np1[@]}" | median)
    printf '  without the shim %.3f s; with it, no launcher %.3f s (ratio %.3f), under mpirun -np 1 %.3f s (ratio %.3f)\n' \
        "$b" "$a" "$(awk -v x="$a" -v y="$b" 'BEGIN { print x / y }')" "$c" "$(awk -v x="$c" -v y="$b" 'BEGIN { print x / y }')"
}

# exec_row LABEL [VAR=VALUE...]: /bin/true plain, with the shim preloaded and with an empty library
# preloaded, started from an environment with VARs (tests/bench/bench_exec.c).
exec_row() {
    local label=$1 out
    shift
    out=$(env "$@" "$BUILD_DIR/bin/bench_exec" 100 "$BUILD_DIR/lib/libdpshim.so" \
        "$BUILD_DIR/bench/libbench_empty_preload.so" -- /bin/true) || return 1
    awk -v label="$label" '$1 == "plain" { p = $2 } NR == 2 { s = $2; sr = $3; slo = $4; shi = $5 }
        NR == 3 { e = $2; er = $3; elo = $4; ehi = $5 }
        END { printf "  %s:\n    plain %6.1f us   shim %6.1f us  %.3fx (%.3f-%.3f)   empty library %6.1f us  %.3fx (%.3f-%.3f)\n",
                  label, p, s, sr, slo, shi, e, er, elo, ehi }' <<<"$out"
}

bench_exec() {
    echo "/bin/true started plainly, with the shim preloaded, and with an empty library preloaded (the floor: the"
    echo "loader mapping one more library); 100 rounds of a block of 50 starts each: the medians of the blocks'"
    echo "time per start, and the median of the rounds' ratios to plain (10th-90th percentile):"
    # what a rank's children see: the marker of a rank process that is not their own pid
    exec_row "a child of a rank (a shell command, a compiler, an exec)" DPSHIM_RANK_PID=1:0:1:0:1:0
    exec_row "a process started alone (a rank of its own)"
}

bench_ffi() {
    echo "declarative hook ([hook] section, libffi closure) on a 2-argument function:"
    printf '  '
    DPSHIM_POLICY=tests/bench/bench_ffi.conf LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" \
        "$BUILD_DIR/bin/bench_ffi"
}

# scale_run NP STEPS OVERLAP: seconds of the example trainer's first epoch in scale mode.
scale_run() {
    timeout 600 mpirun -np "$1" env DPSHIM_DATA_MODE=scale DPSHIM_COMM_OVERLAP="$3" DPSHIM_OUTPUT_STDOUT=rank0 \
        LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/fmnist_train" --steps "$2" --no-eval 2>/dev/null |
        epoch_seconds
}

bench_scale() {
    local rounds=5 one=() on=() off=()
    echo "example trainer, scale mode, one thread per rank, 60 000 samples (batch 100 per rank), median of $rounds alternating rounds:"
    for _ in $(seq "$rounds"); do
        one+=("$(scale_run 1 600 off)")
        off+=("$(scale_run 2 300 off)")
        on+=("$(scale_run 2 300 on)")
    done
    local a b c
    a=$(printf '%s\n' "${one[@]}" | median)
    b=$(printf '%s\n' "${off[@]}" | median)
    c=$(printf '%s\n' "${on[@]}" | median)
    awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN {
        printf "  np=1 %.0f samples/s; np=2 %.0f samples/s with [comm] overlap off (what auto picks here), %.0f with on\n", 60000 / a, 60000 / b, 60000 / c
        printf "  np=2 vs np=1: %.2fx (overlap off), %.2fx (on); overlap on vs off: %.3fx\n", a / b, a / c, b / c }'
}

# ddp_run MODEL KIND BATCH STEPS [NP]: "samples/s peak_rss_mb optim_state_mb" of one run of
# tests/bench/ on NP ranks (2; rank 0's memory): KIND scale or split runs the plain script under
# dpshim in that mode (BATCH: the script's batch), nosync scale mode with [bn] sync = off
# (per-rank BatchNorm, as DDP's), unsharded scale mode with [optim] shard = off, ddp runs
# torch_ddp.py (BATCH per rank). Debian's interpreter: python3-torch is installed for it, and a
# python3 first on PATH (a virtual environment) may lack torch.
ddp_run() {
    local model=$1 kind=$2 batch=$3 steps=$4 np=${5:-2} global out port
    local args=(--model "$model" --steps "$steps" --warmup 3 --batch-size "$batch")
    if [ "$kind" = ddp ]; then
        port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        out=$(timeout 300 mpirun --oversubscribe -np "$np" env OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
            /usr/bin/python3 tests/bench/torch_ddp.py "${args[@]}" 2>/dev/null) || true
        global=$((np * batch))
    else
        local mode=scale sync=on shard=auto
        case $kind in
        split) mode=split ;;
        nosync) sync=off ;;
        unsharded) shard=off ;;
        esac
        out=$(timeout 300 mpirun --oversubscribe -np "$np" env OMP_NUM_THREADS=1 DPSHIM_DATA_MODE="$mode" \
            DPSHIM_BN_SYNC="$sync" DPSHIM_OPTIM_SHARD="$shard" DPSHIM_OUTPUT_STDOUT=rank0 \
            LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" /usr/bin/python3 tests/bench/torch_plain.py "${args[@]}" 2>/dev/null) || true
        global=$([ "$mode" = scale ] && echo $((np * batch)) || echo "$batch")
    fi
    awk -v b="$global" '/^steps_per_s / { s = $2 * b } /^peak_rss_mb / { r = $2 } /^optim_state_mb / { m = $2 }
        END { if (s) print s, r, m }' <<<"$out"
}

# ratio_stats "A..." "B...": two lists of the same rounds' figures: "median(A) median(B) m lo hi",
# m, lo and hi the median, lowest and highest of the rounds' ratios A/B.
ratio_stats() {
    local ratios
    ratios=$(paste -d' ' <(xargs -n1 <<<"$1") <(xargs -n1 <<<"$2") | awk '{ print $1 / $2 }' | sort -g)
    echo "$(xargs -n1 <<<"$1" | median) $(xargs -n1 <<<"$2" | median) $(median <<<"$ratios")" \
        "$(head -1 <<<"$ratios") $(tail -1 <<<"$ratios")"
}

# The plain script under dpshim against the same model converted to DDP, at np=2 with the same
# global batch: scale mode against DDP at the script's batch per rank, split mode against DDP at
# half of it. DDP's BatchNorm keeps per-rank statistics (SyncBatchNorm needs CUDA in PyTorch
# 1.13); dpshim's are the global batch's, and with [bn] sync = off per rank as DDP's.
bench_ddp() {
    local rounds=5 row
    echo "PyTorch: the plain script under dpshim vs DistributedDataParallel (gloo), np=2, one thread per rank,"
    echo "global samples/s, median of $rounds alternating rounds, and the median and range of the rounds' ratios:"
    for row in "cnn|64|40|small CNN with BatchNorm, 0.3M parameters, SGD with momentum|split" \
               "embed|128|20|dense EmbeddingBag 100 000 x 80, 8.0M parameters, Adam|scale split" \
               "embed_sgd|128|20|the same with SGD and momentum|scale split"; do
        local model batch steps label kinds kind v
        IFS='|' read -r model batch steps label kinds <<<"$row"
        local -A got=()
        for _ in $(seq "$rounds"); do
            for kind in ddp-scale $kinds ddp-split; do
                case $kind in
                ddp-scale) v=$(ddp_run "$model" ddp "$batch" "$steps") ;;
                ddp-split) v=$(ddp_run "$model" ddp $((batch / 2)) "$steps") ;;
                *) v=$(ddp_run "$model" "$kind" "$batch" "$steps") ;;
                esac
                v=${v%% *}
                [ -n "$v" ] || { echo "bench_ddp: $model $kind printed no steps_per_s" >&2; return 1; }
                got[$kind]+="$v "
            done
        done
        echo "  $model ($label), script batch $batch, $steps steps timed:"
        for kind in $kinds; do
            local shim ddp m lo hi
            read -r shim ddp m lo hi <<<"$(ratio_stats "${got[$kind]}" "${got[ddp-${kind/nosync/scale}]}")"
            awk -v k="$kind" -v b="$batch" -v s="$shim" -v d="$ddp" -v m="$m" -v lo="$lo" -v hi="$hi" 'BEGIN {
                what = (k == "scale") ? sprintf("scale (%d per rank, global %d; DDP %d per rank)", b, 2 * b, b) \
                     : (k == "nosync") ? sprintf("scale, [bn] sync = off (BatchNorm per rank, as DDP)") \
                                       : sprintf("split (global %d, %d per rank; DDP %d per rank)", b, b / 2, b / 2)
                printf "    %-51s dpshim %7.0f  DDP %7.0f  dpshim/DDP %.2f (%.2f-%.2f)\n", what, s, d, m, lo, hi }'
        done
    done
}

# The BatchNorm models in scale mode against DDP at the same batch per rank, np=2 and 4:
# dpshim's exact statistics of the global batch, and [bn] sync = off (per rank, as DDP's, whose
# SyncBatchNorm needs CUDA in PyTorch 1.13).
bench_bn() {
    local rounds=3 np row
    echo "PyTorch BatchNorm models: the plain script under dpshim (scale mode) vs DDP (gloo) at the same batch per rank,"
    echo "one thread per rank, global samples/s, median of $rounds alternating rounds, and the median and range of the rounds' ratios:"
    for row in "cnn|128|30|small CNN, 2 BatchNorm layers, 0.3M parameters" \
               "resnet|64|20|ResNet-18 layout at a quarter width, 20 BatchNorm layers, 0.7M parameters"; do
        local model batch steps label kind v
        IFS='|' read -r model batch steps label <<<"$row"
        echo "  $model ($label), SGD with momentum, $batch per rank, $steps steps timed:"
        for np in 2 4; do
            local -A got=()
            for _ in $(seq "$rounds"); do
                for kind in ddp scale nosync; do
                    v=$(ddp_run "$model" "$kind" "$batch" "$steps" "$np")
                    v=${v%% *}
                    [ -n "$v" ] || { echo "bench_bn: $model np=$np $kind printed no steps_per_s" >&2; return 1; }
                    got[$kind]+="$v "
                done
            done
            for kind in scale nosync; do
                local shim ddp m lo hi
                read -r shim ddp m lo hi <<<"$(ratio_stats "${got[$kind]}" "${got[ddp]}")"
                awk -v np="$np" -v k="$kind" -v s="$shim" -v d="$ddp" -v m="$m" -v lo="$lo" -v hi="$hi" 'BEGIN {
                    printf "    np=%d %-27s dpshim %6.0f  DDP %6.0f  dpshim/DDP %.2f (%.2f-%.2f)\n", np,
                        (k == "scale") ? "global-batch statistics" : "[bn] sync = off (as DDP)", s, d, m, lo, hi }'
            done
        done
    done
}

# Where a step's time goes, per rank, at np=2: each part of the loop on the clock and in CPU
# time (--phases) for DDP and for the plain script under dpshim with [bn] sync on and off, and
# dpshim's collectives per hook from its traces (tests/bench/trace_phases.py).
bench_bn_phases() {
    local model batch steps kind dir port
    for model in cnn resnet; do
        batch=$([ $model = cnn ] && echo 128 || echo 64) steps=20
        echo "where a step goes, $model, $batch per rank, np=2, $steps steps (ms per step; wall, then CPU time of the main thread):"
        for kind in ddp on off; do
            if [ $kind = ddp ]; then
                port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
                timeout 300 mpirun -np 2 env OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" /usr/bin/python3 \
                    tests/bench/torch_ddp.py --model $model --batch-size $batch --steps $steps --warmup 3 --phases 2>/dev/null |
                    sed -n 's/^rank \([0-9]\) phases, ms per step /    DDP            r\1 /p' | sort
            else
                dir=$(mktemp -d)
                timeout 300 mpirun -np 2 env OMP_NUM_THREADS=1 DPSHIM_DATA_MODE=scale DPSHIM_BN_SYNC=$kind DPSHIM_DIAG_DIR="$dir" \
                    DPSHIM_OUTPUT_STDOUT=prefix LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" /usr/bin/python3 tests/bench/torch_plain.py \
                    --model $model --batch-size $batch --steps $steps --warmup 3 --phases 2>/dev/null |
                    sed -n "s/^\[r\([0-9]\)\] this process phases, ms per step /    dpshim sync $kind r\1 /p" | sort
                /usr/bin/python3 tests/bench/trace_phases.py "$dir" --warmup 3 | sed 's/^/      /'
                rm -rf "$dir"
            fi
        done
    done
}

# One BatchNorm layer in training mode, alone (PyTorch's kernel) and at np=2 under dpshim (exact
# statistics of the global batch), CPU time per forward and backward (tests/bench/bn_layer.py).
bench_bn_layer() {
    local program=(/usr/bin/python3 tests/bench/bn_layer.py) label=PyTorch
    echo "one BatchNorm layer, forward and backward, ms of CPU time (the best of 15): alone vs dpshim's exact statistics at np=2:"
    while :; do
        echo " $label:"
        paste -d' ' <(OMP_NUM_THREADS=1 "${program[@]}") \
            <(timeout 300 mpirun -np 2 env OMP_NUM_THREADS=1 DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_DIAG_SUMMARY=off \
                LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "${program[@]}" 2>/dev/null) |
            awk '{ printf "  %-15s forward %6.2f vs %6.2f (%.2fx)  backward %6.2f vs %6.2f (%.2fx)\n", $1, $2, $5, $5 / $2, $3, $6, $6 / $3 }'
        [ "$label" = PyTorch ] && [ -x "$BUILD_DIR/bin/bench_bn_layer_torch" ] || break
        program=("$BUILD_DIR/bin/bench_bn_layer_torch") label="libtorch (the C++ adapter)"
    done
}

# [optim] shard: the Adam embedding model in scale mode at np=2 and 4, sharded (auto, the
# default) against unsharded and against DDP, with rank 0's peak memory and optimizer state.
bench_shard() {
    local rounds=3 np kind v s r m
    echo "PyTorch, [optim] shard: dense EmbeddingBag 100 000 x 80 (8.0M parameters), Adam, scale mode, script batch 128,"
    echo "one thread per rank, global samples/s (median of $rounds alternating rounds) and rank 0's memory:"
    for np in 2 4; do
        local -A got=() rss=() state=()
        for _ in $(seq "$rounds"); do
            for kind in scale unsharded ddp; do
                v=$(ddp_run embed "$kind" 128 20 "$np")
                [ -n "$v" ] || { echo "bench_shard: np=$np $kind printed no steps_per_s" >&2; return 1; }
                read -r s r m <<<"$v"
                got[$kind]+="$s " rss[$kind]=$r state[$kind]=$m
            done
        done
        local a b c
        a=$(xargs -n1 <<<"${got[scale]}" | median)
        b=$(xargs -n1 <<<"${got[unsharded]}" | median)
        c=$(xargs -n1 <<<"${got[ddp]}" | median)
        awk -v np="$np" -v a="$a" -v b="$b" -v c="$c" -v ra="${rss[scale]}" -v rb="${rss[unsharded]}" -v rc="${rss[ddp]}" \
            -v ma="${state[scale]}" -v mb="${state[unsharded]}" -v mc="${state[ddp]}" 'BEGIN {
            printf "  np=%d  sharded %7.0f  unsharded %7.0f  DDP %7.0f samples/s;  sharded/unsharded %.2f  sharded/DDP %.2f\n", np, a, b, c, a / b, a / c
            printf "        peak RSS sharded %s MiB, unsharded %s MiB, DDP %s MiB; optimizer state %s, %s, %s MiB\n", ra, rb, rc, ma, mb, mc }'
    done
}

# What gpu-check runs, built here with nvcc for Hopper and Ampere in the usual build folder (a
# no-op where ./dev.sh build or test made it) and copied into DIR: the shim, its plugins and
# adapters, the tools, the CUDA programs, the test double and the program that runs on it (the
# same checks without a GPU), the shared libraries a GPU machine may lack (DIR/carry-lib, used
# there only for what it lacks), and Open MPI's runtime (DIR/ompi): everything a bare GPU machine
# needs, under 64 MiB.
gpu_pack() {
    local out
    out=$(realpath -m "${1:-build-gpu}")
    if [ "$out" = "$BUILD_DIR" ]; then
        echo "dev.sh: gpu-pack copies the build in $BUILD_DIR into another folder: name one (default build-gpu)" >&2
        return 1
    fi
    # DIR's folders are replaced: only in a folder gpu-pack made (its mark) or an empty one
    if [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/.dpshim-gpu-pack" ]; then
        echo "dev.sh: $out is not empty and not a bundle gpu-pack made: name a new folder (default build-gpu), or remove it" >&2
        return 1
    fi
    # a build folder already configured keeps its settings (a GPU machine's compiler may warn
    # where this one does not: warnings are errors only where build or test configured them)
    [ -f "$BUILD_DIR/CMakeCache.txt" ] || cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target dpshim dpshim-mpi dpshim-nccl python_adapter dpshim-diag dpshim-bench \
        gpu_hooks_cuda cuda_train gpu_hooks dpshim_gpu_double
    rm -rf "$out"/{bin,lib,libexec,tests,carry-lib}
    mkdir -p "$out"/{bin,lib,libexec,tests/gpu_double,carry-lib}
    echo "made by ./dev.sh gpu-pack: its folders are replaced by the next one" >"$out/.dpshim-gpu-pack"
    cp -a "$BUILD_DIR"/bin/{cuda_train,dpshim-diag,dpshim-run,gpu_hooks,gpu_hooks_cuda} "$out/bin/"
    cp -a "$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/lib/dpshim" "$out/lib/"
    cp -a "$BUILD_DIR/libexec/dpshim" "$out/libexec/"
    cp -a "$BUILD_DIR"/tests/gpu_double/*.so* "$out/tests/gpu_double/"
    local lib
    for lib in libffi.so.8; do
        cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')" "$out/carry-lib/" 2>/dev/null || true
    done
    pack_openmpi "$out/ompi" "$out/lib/dpshim/libdpshim-mpi.so"
    du -sh "$out"
    echo "dev.sh: carry $(basename "$out") (run's carry list) and start ./dev.sh gpu-check there"
}

# pack_openmpi DIR LIB...: Debian's Open MPI runtime relocated into DIR: mpirun, orted and
# ompi_info, the components whose libraries a GPU machine has (none for UCX, libfabric, verbs or
# PSM), PMIx's components, the help and parameter files, and every library these and LIB need
# that is not glibc's or the compiler runtime's; DIR/env.sh points Open MPI and PMIx there.
pack_openmpi() {
    local dst=$1 arch
    shift
    arch=$(gcc -print-multiarch)
    local ompi=/usr/lib/$arch/openmpi/lib pmix=/usr/lib/$arch/pmix2
    rm -rf "$dst"
    mkdir -p "$dst"/{bin,lib/openmpi3,lib/pmix,share/openmpi,share/pmix,etc}
    cp -L /usr/bin/orterun "$dst/bin/mpirun"
    cp -L /usr/bin/orted /usr/bin/ompi_info "$dst/bin/"
    cp -L /etc/openmpi/openmpi-mca-params.conf /etc/openmpi/openmpi-default-hostfile "$dst/etc/"
    cp -rL /usr/share/openmpi/. "$dst/share/openmpi/"
    cp -rL "$pmix/share/pmix/." "$dst/share/pmix/"
    local c
    for c in "$ompi"/openmpi3/*.so; do
        ldd "$c" | grep -Eq 'not found|libuc[pst]|libfabric|libibverbs|librdmacm|libpsm|libhcoll' || cp -L "$c" "$dst/lib/openmpi3/"
    done
    cp -L "$pmix"/lib/pmix/*.so "$dst/lib/pmix/"
    for c in "$dst"/bin/* "$dst"/lib/openmpi3/*.so "$dst"/lib/pmix/*.so "$@"; do ldd "$c"; done |
        awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
            case $(basename "$lib") in
            libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libgcc_s.so.* | libstdc++.so.* | libz.so.*) ;;
            *) cp -L "$lib" "$dst/lib/" ;;
            esac
        done
    cat >"$dst/env.sh" <<'ENV'
# Open MPI's runtime from this folder, wherever it was copied: source it before mpirun.
ompi_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$ompi_here OPAL_EXEC_PREFIX=$ompi_here OPAL_BINDIR=$ompi_here/bin OPAL_SBINDIR=$ompi_here/bin \
    OPAL_LIBDIR=$ompi_here/lib OPAL_PKGLIBDIR=$ompi_here/lib/openmpi3 OPAL_DATAROOTDIR=$ompi_here/share \
    OPAL_DATADIR=$ompi_here/share OPAL_PKGDATADIR=$ompi_here/share/openmpi OPAL_SYSCONFDIR=$ompi_here/etc \
    OPAL_INCLUDEDIR=$ompi_here/include OPAL_LOCALSTATEDIR=/var \
    PMIX_PREFIX=$ompi_here PMIX_PKGDATADIR=$ompi_here/share/pmix PMIX_MCA_mca_base_component_path=$ompi_here/lib/pmix \
    PMIX_MCA_pcompress_base_silence_warning=1
export PATH=$ompi_here/bin:$PATH LD_LIBRARY_PATH=$ompi_here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ENV
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

# A lost rank ([elastic] lost_rank = continue under mpirun --enable-recovery): what elastic mode
# costs a healthy job's dp_grads (with against without --enable-recovery, alternating), and what
# a rank SIGKILLed at step 10 of 40 costs the job (its wall time against a healthy run's, both
# under --enable-recovery; elastic_train's steps are little more than their 1.2 MB gradient sum).
bench_elastic() {
    local set rec rounds=3 np=3 opt args t0
    echo "elastic mode: dp_grads time at np=2 under mpirun --enable-recovery against without (median of $rounds alternating runs, each a median of 7 rounds):"
    for set in 64 small; do
        local -A ms=()
        for _ in $(seq "$rounds"); do
            for rec in on off; do
                opt=--enable-recovery
                [ "$rec" = on ] || opt=--disable-recovery
                ms[$rec]+="$(timeout 600 mpirun -np 2 $opt env LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" \
                    "$BUILD_DIR/bin/dpshim-diag" bench "$set" 2>/dev/null | awk '/dpshim dp_grads/ { print $4 }') "
            done
        done
        read -r on off mid low high <<<"$(ratio_stats "${ms[on]}" "${ms[off]}")"
        printf "  %-6s elastic %8.2f ms  plain %8.2f ms  elastic/plain %.2f (%.2f-%.2f)\n" "$set" "$on" "$off" "$mid" "$low" "$high"
    done
    echo "a rank of $np lost at step 10 of 40 under --enable-recovery, [guard] timeout = 5 s: the job's wall time against a healthy run's ($rounds alternating rounds; stalled: the rank sleeps in its own code):"
    local -A took=()
    for _ in $(seq "$rounds"); do
        for rec in healthy killed stalled; do
            case $rec in
            healthy) args=40 ;;
            killed) args="40 2 10" ;;
            stalled) args="40 2 10 stall" ;;
            esac
            t0=$(date +%s.%N)
            timeout 600 mpirun -np $np --oversubscribe --enable-recovery env DPSHIM_GUARD_TIMEOUT=5 \
                LD_PRELOAD="$BUILD_DIR/lib/libdpshim.so" "$BUILD_DIR/bin/elastic_train" $args >/dev/null 2>&1
            took[$rec]+="$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }') "
        done
    done
    paste <(xargs -n1 <<<"${took[healthy]}") <(xargs -n1 <<<"${took[killed]}") <(xargs -n1 <<<"${took[stalled]}") |
        awk '{ printf "  round %d: healthy %.2f s; killed %.2f s, the loss cost %.2f s; stalled %.2f s, the loss cost %.2f s\n", NR, $1, $2, $2 - $1, $3, $3 - $1 }'
}

# bench-compare's parts, "NAME|what its figure is": each a cost, lower is better.
BENCH_PARTS=("exec|/bin/true's start as a rank's child, x of plain (bench_exec, 100 rounds)"
    "files|open+write+close of an unmatched path with [files] globs set, ns (bench_files, median of 5)"
    "allreduce|dp_grads of ResNet-50's gradients at np=2, MPI started by the shim, x of plain MPI_Allreduce (dpshim-diag bench)"
    "single|the example trainer's 600 steps under mpirun -np 1, s")

# bench_figure PART LIB: PART's figure with LIB preloaded. The programs are $BUILD_DIR's whichever
# LIB is measured, so that only the library (with its plugins and Python adapter) differs.
bench_figure() {
    local lib=$2
    case $1 in
    exec) DPSHIM_RANK_PID=1:0:1:0:1:0 "$BUILD_DIR/bin/bench_exec" 100 "$lib" -- /bin/true | awk 'NR == 2 { print $3 }' ;;
    files)
        local dir
        dir=$(mktemp -d -p "$([ -d /dev/shm ] && echo /dev/shm || echo /tmp)")
        for _ in 1 2 3 4 5; do
            env DPSHIM_FILES_RANK0_ONLY='*.ckpt' DPSHIM_FILES_PER_RANK='*.log' LD_PRELOAD="$lib" \
                "$BUILD_DIR/bin/bench_files" 50000 "$dir/data.bin"
        done | median
        rm -rf "$dir"
        ;;
    allreduce)
        timeout 600 mpirun --oversubscribe -np 2 env LD_PRELOAD="$lib" "$BUILD_DIR/bin/dpshim-diag" bench --init shim \
            resnet50 2>/dev/null | awk '/^  plain, one MPI_Allreduce/ { p = $6 } /dpshim dp_grads/ { print $4 / p }'
        ;;
    single)
        timeout 600 mpirun -np 1 env LD_PRELOAD="$lib" "$BUILD_DIR/bin/fmnist_train" --steps 600 --no-eval 2>/dev/null |
            epoch_seconds
        ;;
    esac
}

# rev_build COMMIT: COMMIT built once, from a worktree of its own, into $BUILD_DIR-COMMIT; prints
# that directory (the build's output goes to stderr).
rev_build() {
    local dir=$BUILD_DIR-${1:0:12} src rc=0
    if [ ! -e "$dir/.built" ]; then
        rm -rf "$dir" # a build that failed, whose CMake cache names a worktree gone since
        src=$(mktemp -d)
        git worktree add -q --detach "$src/tree" "$1" >&2
        (cd "$src/tree" && BUILD_DIR=$dir build) >&2 || rc=$?
        git worktree remove --force "$src/tree" && rm -rf "$src"
        [ $rc -eq 0 ] || { echo "dev.sh: bench-compare: building $1 failed" >&2; return 1; }
        : >"$dir/.built"
    fi
    echo "$dir"
}

# bench_compare REV [PART...]: see the usage at the top.
bench_compare() {
    local rev=${1:-} part row names=() sha_old sha_new='' old new rounds=${BENCH_ROUNDS:-3}
    for row in "${BENCH_PARTS[@]}"; do names+=("${row%%|*}"); done
    [ -n "$rev" ] || { echo "dev.sh: bench-compare REV [PART...]: name the commit to compare against; the parts: ${names[*]}" >&2; return 2; }
    shift
    [ $# -gt 0 ] || set -- "${names[@]}"
    for part in "$@"; do
        [[ " ${names[*]} " == *" $part "* ]] || { echo "dev.sh: bench-compare: no part '$part'; the parts: ${names[*]}" >&2; return 2; }
    done
    sha_old=$(git rev-parse -q --verify "${rev%%..*}^{commit}") || sha_old=''
    [[ $rev != *..* ]] || sha_new=$(git rev-parse -q --verify "${rev#*..}^{commit}") || sha_new=-
    if [ -z "$sha_old" ] || [ "$sha_new" = - ]; then
        echo "dev.sh: bench-compare: '$rev' names no commit of this repository (REV, or OLD..NEW)" >&2
        return 2
    fi
    setup && build >&2 && mpirun_env
    old=$(rev_build "$sha_old") && new=$BUILD_DIR && { [ -z "$sha_new" ] || new=$(rev_build "$sha_new"); } || return 1
    echo "old $sha_old ($rev), new ${sha_new:-this tree, $(git describe --always --dirty)}, the programs of $BUILD_DIR;"
    echo "$rounds rounds, each old then new: medians, and new/old: the median, range and each round's:"
    for part in "$@"; do
        local figs=() f lib med_new med_old m lo hi
        for _ in $(seq "$rounds"); do
            for lib in "$old" "$new"; do
                f=$(bench_figure "$part" "$lib/lib/libdpshim.so") || f=''
                [ -n "$f" ] || { echo "dev.sh: bench-compare: $part printed no figure with $lib" >&2; return 1; }
                figs+=("$f")
            done
        done
        # figs: old new old new ...
        read -r med_new med_old m lo hi <<<"$(ratio_stats "$(printf '%s\n' "${figs[@]}" | sed -n 'n;p')" \
            "$(printf '%s\n' "${figs[@]}" | sed -n 'p;n')")"
        for row in "${BENCH_PARTS[@]}"; do [ "${row%%|*}" != "$part" ] || echo "  $part: ${row#*|}"; done
        printf '    old %g  new %g  new/old %.3f (%.3f-%.3f), rounds:%s\n' "$med_old" "$med_new" "$m" "$lo" "$hi" \
            "$(printf '%s %s\n' "${figs[@]}" | awk '{ printf " %.3f", $2 / $1 }')"
    done
}

# sourced (tests/integration/dev_sh.bats), dev.sh defines its functions and runs nothing
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-}" in
setup) setup ;;
build) setup && build ;;
demo) setup && build && demo "${2:-4}" ;;
test) start=$SECONDS && setup && took "setting up" $start && start=$SECONDS && build && took "building" $start && run_tests ;;
test-libtorch2) test_libtorch2 tests ;;
libtorch2-packages) test_libtorch2 packages ;;
gpu-check) exec bash tests/gpu/gpu_check.sh "${@:2}" ;;
gpu-pack) gpu_pack "${2:-}" ;;
bench-compare) bench_compare "${@:2}" ;;
bench) setup && build && mpirun_env && bench_exec && bench_files && bench_files_gated && bench_ffi && bench_torch_cpp && bench_single && bench_allreduce && bench_scale && bench_guard && bench_placement && bench_ddp && bench_bn && bench_bn_phases && bench_bn_layer && bench_shard && bench_elastic ;;
*)
    sed -n '2,/dev\.sh setup/p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
