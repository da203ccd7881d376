#!/usr/bin/env bats
# The installed tree (cmake --install into a staging prefix), used as users use it: the library
# preloaded by its bare name through the loader's search path, the plugins and the Python adapter
# found relative to it, dpshim-diag with its helpers, and the hook ABI built against from outside
# with pkg-config and with CMake's find_package.
load helpers

setup_file() {
    export STAGE=$BATS_FILE_TMPDIR/stage
    cmake --install "$BUILD" --prefix "$STAGE" >/dev/null
}

libdir() { sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$BUILD/CMakeCache.txt"; }

@test "the install tree: library, plugins and adapter under libdir, tools, helpers, header, package files, docs" {
    local lib=$STAGE/$(libdir) f
    for f in "$lib/libdpshim.so" "$lib/dpshim/libdpshim-mpi.so" "$lib/dpshim/libdpshim-nccl.so" \
        "$lib/dpshim/python/dpshim_pytorch/__init__.py" "$lib/dpshim/python/sitecustomize.py" "$STAGE/bin/dpshim-diag" \
        "$STAGE/bin/dpshim-run" \
        "$STAGE/libexec/dpshim/dpshim-bench" "$STAGE/libexec/dpshim/libdpshim-bench.so" \
        "$STAGE/libexec/dpshim/bench_torch.py" "$STAGE/include/dpshim/hooks.h" "$lib/pkgconfig/dpshim.pc" \
        "$lib/cmake/dpshim/dpshimConfig.cmake" "$lib/cmake/dpshim/dpshimConfigVersion.cmake" \
        "$STAGE/share/doc/dpshim/dpshim.conf" "$STAGE/share/doc/dpshim/README.md" "$STAGE/share/doc/dpshim/CHANGELOG.md" \
        "$STAGE/share/man/man5/dpshim.conf.5"; do
        [ -e "$f" ] || fail "missing: $f"
    done
    [ ! -e "$BUILD/lib/dpshim/libdpshim-libtorch.so" ] ||
        { [ -e "$lib/dpshim/libdpshim-libtorch.so" ] && [ -e "$lib/dpshim/libdpshim-libtorch.needs" ]; } ||
        fail "missing: the libtorch adapter"
    # nothing installed points back into the build tree: no run path, no package file (debug
    # information names the sources, as any build's does)
    while read -r f; do
        if [ "$(head -c 4 "$f")" = $'\x7fELF' ]; then
            ! readelf -d "$f" | grep -F "$BUILD" || fail "$f: a run path into the build tree"
        else
            ! grep -F "$BUILD" "$f" || fail "$f names the build tree"
        fi
    done < <(find "$STAGE" -type f)
}

@test "man pages: dpshim(7), dpshim-diag(1), dpshim-run(1), and dpshim.conf(5) with every key and variable" {
    local man=$STAGE/share/man f
    for f in man7/dpshim.7 man1/dpshim-diag.1 man1/dpshim-run.1 man5/dpshim.conf.5; do
        [ -s "$man/$f" ] || fail "missing: $man/$f"
        if command -v groff >/dev/null; then
            run groff -man -Tutf8 -ww -z "$man/$f"
            assert_output ""
        fi
    done
    # every key and every other variable of the reference is in the page
    "$BUILD/bin/dpshim-diag" keys | grep -oE '`(\[[a-z]+\] [a-z_]+|DPSHIM_[A-Z_]+)`' | tr -d '`' | sort -u >"$BATS_TEST_TMPDIR/names"
    while read -r name; do
        case $name in
        \[*) grep -qF "\\fB${name#* }\\fR = " "$man/man5/dpshim.conf.5" || fail "dpshim.conf(5) lacks $name" ;;
        *) grep -qF "$name" "$man/man5/dpshim.conf.5" || fail "dpshim.conf(5) lacks $name" ;;
        esac
    done <"$BATS_TEST_TMPDIR/names"
}

@test "dpshim-diag: --help on stdout with status 0, --version, and env from its own installed library" {
    run "$STAGE/bin/dpshim-diag" --help
    assert_success
    assert_output --partial "usage: dpshim-diag"
    run "$STAGE/bin/dpshim-diag" --version
    assert_success
    assert_output --regexp "^dpshim-diag [0-9]+\.[0-9]+\.[0-9]+ \(dpshim [0-9.]+, hook ABI version [0-9]+\)$"
    run "$STAGE/bin/dpshim-diag" nonsense
    assert_equal "$status" 2
    run "$STAGE/bin/dpshim-diag" env
    assert_success
    assert_output --partial "library    $STAGE/$(libdir)/libdpshim.so"
}

@test "LD_PRELOAD=libdpshim.so by its name: a 2-rank job on the installed library and its plugin" {
    run mpi 2 env LD_LIBRARY_PATH="$STAGE/$(libdir)" LD_PRELOAD=libdpshim.so "$BUILD/bin/fork_workers"
    echo "$output"
    assert_success
    assert_equal "$(grep -oE 'fork_workers rank [01]: ok' <<<"$output" | wc -l)" 2
    # the plugin that ran is the installed one
    run mpi 2 env LD_LIBRARY_PATH="$STAGE/$(libdir)" LD_PRELOAD=libdpshim.so DPSHIM_DIAG_LOG=debug "$BUILD/bin/fork_workers"
    refute_output --partial "$BUILD/lib"
}

@test "a PyTorch script through the installed adapter: each rank its share" {
    [ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
    cd "$BATS_TEST_TMPDIR"
    cat >share.py <<'PY'
import sys, torch
import dpshim_pytorch
data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
model, n = torch.nn.Linear(3, 1), 0
for x, y in torch.utils.data.DataLoader(data, batch_size=8):
    torch.nn.functional.mse_loss(model(x), y).backward()
    n += len(x)
print("trained on %d samples of 40 with the adapter in %s" % (n, dpshim_pytorch.__file__))
PY
    run mpi 2 env LD_LIBRARY_PATH="$STAGE/$(libdir)" LD_PRELOAD=libdpshim.so /usr/bin/python3 share.py
    echo "$output"
    assert_success
    assert_equal "$(count "trained on 20 samples of 40 with the adapter in $STAGE/$(libdir)/dpshim/python/")" 2
}

@test "a framework builds against the installed hook ABI with pkg-config and with find_package" {
    cd "$BATS_TEST_TMPDIR"
    cat >framework.c <<'C'
#include <stdio.h>
#include <dpshim/hooks.h>
int main(void)
{
    double one = 1; /* the hooks are weak: without the shim there are none, and the program runs alone */
    if (dp_metric) dp_metric(&one, 1, DP_SUM);
    printf("ranks %g, hook ABI %d\n", one, dp_abi_version ? dp_abi_version() : 0);
    return 0;
}
C
    cc $(PKG_CONFIG_PATH="$STAGE/$(libdir)/pkgconfig" pkg-config --cflags dpshim) framework.c -o with_pc
    run ./with_pc
    assert_output "ranks 1, hook ABI 0"
    cat >CMakeLists.txt <<'CM'
cmake_minimum_required(VERSION 3.20)
project(framework C)
find_package(dpshim 0.1 REQUIRED)
add_executable(with_cmake framework.c)
target_link_libraries(with_cmake PRIVATE dpshim::hooks)
CM
    cmake -S . -B out -DCMAKE_PREFIX_PATH="$STAGE" >/dev/null
    cmake --build out >/dev/null
    run mpi 2 env LD_LIBRARY_PATH="$STAGE/$(libdir)" LD_PRELOAD=libdpshim.so ./out/with_cmake
    assert_success
    local abi=$(sed -n 's/^#define DPSHIM_HOOK_ABI_VERSION //p' "$STAGE/include/dpshim/hooks.h")
    assert_equal "$(count "ranks 2, hook ABI $abi")" 2
    run mpi 2 env LD_LIBRARY_PATH="$STAGE/$(libdir)" LD_PRELOAD=libdpshim.so ./with_pc
    assert_equal "$(count "ranks 2, hook ABI $abi")" 2
}

# The .deb packages; installed for real (dpkg, then removed again) only in CI as root, where the
# machine is the test's own.
@test "the Debian packages: dpshim and dpshim-dev; installed, LD_PRELOAD=libdpshim.so works by its name" {
    command -v dpkg-deb >/dev/null || skip "no dpkg-deb"
    local out=$BATS_TEST_TMPDIR/deb
    cpack -G DEB -B "$out" --config "$BUILD/CPackConfig.cmake" >/dev/null
    local deb=("$out"/dpshim_*_*.deb) dev=("$out"/dpshim-dev_*_*.deb)
    [ -f "${deb[0]}" ] && [ -f "${dev[0]}" ] || fail "cpack made no dpshim and dpshim-dev packages"
    # what dlopen opens is declared by hand, what the plugin links is found by dpkg-shlibdeps
    run dpkg-deb -f "${deb[0]}" Depends
    assert_output --regexp "libpmix2.*libffi8.*libopenmpi3"
    refute_output --partial libtorch
    # the libtorch adapter apart, where it is built: only its package needs libtorch
    if [ -e "$BUILD/lib/dpshim/libdpshim-libtorch.so" ]; then
        local torch=("$out"/dpshim-libtorch_*_*.deb)
        run dpkg-deb -f "${torch[0]}" Depends
        assert_output --regexp "dpshim \(= [0-9.]+\)"
        assert_output --regexp "libtorch1\.13"
        run dpkg-deb -c "${torch[0]}"
        assert_output --partial " ./usr/lib/dpshim/libdpshim-libtorch.so"
        assert_output --partial " ./usr/lib/dpshim/libdpshim-libtorch.needs"
    fi
    run dpkg-deb -c "${deb[0]}"
    for f in ./usr/lib/libdpshim.so ./usr/lib/dpshim/libdpshim-mpi.so ./usr/lib/dpshim/python/dpshim_pytorch/__init__.py \
        ./usr/bin/dpshim-diag ./usr/bin/dpshim-run ./usr/libexec/dpshim/dpshim-bench; do
        assert_output --partial " $f"
    done
    run dpkg-deb -c "${dev[0]}"
    assert_output --partial " ./usr/include/dpshim/hooks.h"
    assert_output --partial " ./usr/lib/pkgconfig/dpshim.pc"
    run dpkg-deb -I "${deb[0]}" triggers
    assert_output "activate-noawait ldconfig"
    if [ "${CI:-}" != true ] || [ "$(id -u)" != 0 ] || dpkg -s dpshim >/dev/null 2>&1; then
        echo "# not installed here: only in CI, as root, where no dpshim package is installed" >&3
        return
    fi
    dpkg -i "${deb[0]}" "${dev[0]}" >/dev/null
    run mpi 2 env LD_PRELOAD=libdpshim.so "$BUILD/bin/fork_workers"
    local bare=$output bare_status=$status
    # the launcher, by its name on PATH, with the installed library by its full path
    run timeout --kill-after=10 "$MPI_TIMEOUT" dpshim-run -np 2 --oversubscribe "$BUILD/bin/fork_workers"
    local launched=$output launched_status=$status
    dpkg -r dpshim-dev dpshim >/dev/null
    echo "$bare"
    echo "$launched"
    [ "$bare_status" = 0 ] || fail "LD_PRELOAD=libdpshim.so failed"
    assert_equal "$(grep -oE 'fork_workers rank [01]: ok' <<<"$bare" | wc -l)" 2
    [ "$launched_status" = 0 ] || fail "dpshim-run failed"
    grep -q "^dpshim-run: .*mpirun --bind-to none -np 2 --oversubscribe env LD_PRELOAD=/usr/lib/libdpshim.so " <<<"$launched" ||
        fail "dpshim-run did not preload /usr/lib/libdpshim.so"
    assert_equal "$(grep -oE 'fork_workers rank [01]: ok' <<<"$launched" | wc -l)" 2
    [ ! -e /usr/lib/libdpshim.so ] || fail "dpkg -r left /usr/lib/libdpshim.so"
}
