#!/usr/bin/env bats
# dev.sh's own logic that needs no build: the Debian mirror and apt proxy that
# `./dev.sh test-libtorch2` gives its chroot, found in sample apt configurations (APT_CONFIG
# points apt-config at a directory of the test's; the addresses are documentation ones, RFC 5737),
# and the arguments `./dev.sh bench-compare` refuses before it builds anything.
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

SRC=${DPS_SRC:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}

setup() {
    command -v apt-config >/dev/null || skip "no apt-config: not a Debian machine"
    ETC=$BATS_TEST_TMPDIR/etc
    mkdir -p "$ETC/sources.list.d" "$ETC/apt.conf.d"
    printf 'Dir::Etc "%s";\n' "$ETC" >"$BATS_TEST_TMPDIR/apt.conf"
    export APT_CONFIG=$BATS_TEST_TMPDIR/apt.conf
    unset DEBIAN_MIRROR
}

# dev FUNCTION: a function of dev.sh, sourced (it runs nothing then)
dev() { bash -c '. "$0/dev.sh" && "$@"' "$SRC" "$@"; }

@test "the mirror of a deb822 debian.sources, not its security archive nor another vendor's" {
    cat >"$ETC/sources.list.d/aaa-vendor.sources" <<'EOF2'
Types: deb
URIs: https://192.0.2.7/apt
Suites: nodistro
Components: main
EOF2
    cat >"$ETC/sources.list.d/debian.sources" <<'EOF2'
# the security archive first, with a comment and a folded field
Types: deb
URIs: http://192.0.2.2/debian-security
Suites: bookworm-security
Components: main
Signed-By:
 /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src deb
URIs: http://192.0.2.1/debian
Suites: bookworm bookworm-updates
Components: main
EOF2
    run dev debian_mirror
    assert_success
    assert_output http://192.0.2.1/debian
}

@test "a disabled deb822 paragraph is skipped" {
    printf 'Types: deb\nURIs: http://192.0.2.3/debian\nSuites: trixie\nEnabled: no\n\nTypes: deb\nURIs: http://192.0.2.4/debian/\nSuites: trixie\n' \
        >"$ETC/sources.list.d/debian.sources"
    run dev debian_mirror
    assert_output http://192.0.2.4/debian/
}

@test "the mirror of a one-line sources.list, with options, before sources.list.d" {
    cat >"$ETC/sources.list" <<'EOF2'
# deb http://192.0.2.9/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://192.0.2.7/apt cloud-sdk-bookworm main
deb http://192.0.2.2/debian-security bookworm-security main
deb http://192.0.2.5/debian-security bullseye/updates main
deb [trusted=yes] http://192.0.2.1/debian bookworm main contrib
EOF2
    printf 'deb http://192.0.2.6/debian sid main\n' >"$ETC/sources.list.d/other.list"
    run dev debian_mirror
    assert_output http://192.0.2.1/debian
    rm "$ETC/sources.list"
    run dev debian_mirror
    assert_output http://192.0.2.6/debian
}

@test "DEBIAN_MIRROR overrides the sources" {
    printf 'deb http://192.0.2.1/debian bookworm main\n' >"$ETC/sources.list"
    DEBIAN_MIRROR=http://192.0.2.8/debian run dev debian_mirror
    assert_output http://192.0.2.8/debian
}

@test "no Debian archive: an error that says to set DEBIAN_MIRROR" {
    printf 'deb http://192.0.2.2/debian-security bookworm-security main\n' >"$ETC/sources.list"
    run dev debian_mirror
    assert_failure
    assert_output --partial "set DEBIAN_MIRROR"
}

@test "the apt proxy, where one is set, as apt.conf lines for the chroot" {
    run dev apt_proxy_conf
    assert_success
    assert_output ""
    printf 'Acquire::http::Proxy "http://192.0.2.10:3128";\nAcquire { https { Proxy "http://192.0.2.11:3128"; }; };\n' \
        >"$ETC/apt.conf.d/30proxy"
    run dev apt_proxy_conf
    assert_output "$(printf 'Acquire::http::Proxy "http://192.0.2.10:3128";\nAcquire::https::Proxy "http://192.0.2.11:3128";')"
}

@test "dev.sh names no mirror or other host" {
    run grep -nE '[a-z0-9-]+\.(debian|ubuntu)\.(org|net|com)|ftp\.[a-z]{2}\.' "$SRC/dev.sh"
    assert_failure
}

# dev.sh bench-compare ARGS...: with cmake and dpkg-query standing in, so that a check that let
# the arguments through would say "cmake ran" rather than build and bench
bench_compare() {
    mkdir -p "$BATS_TEST_TMPDIR/stubs"
    printf '#!/bin/sh\necho "cmake ran"; exit 1\n' >"$BATS_TEST_TMPDIR/stubs/cmake"
    printf '#!/bin/sh\necho "install ok installed"\n' >"$BATS_TEST_TMPDIR/stubs/dpkg-query"
    chmod +x "$BATS_TEST_TMPDIR/stubs/"*
    PATH=$BATS_TEST_TMPDIR/stubs:$PATH BUILD_DIR=$BATS_TEST_TMPDIR/build run "$SRC/dev.sh" bench-compare "$@"
}

@test "bench-compare: an unknown part is named with the parts there are, before any build" {
    bench_compare HEAD exec nope
    assert_failure 2
    assert_output "dev.sh: bench-compare: no part 'nope'; the parts: exec files allreduce single"
    bench_compare
    assert_failure 2
    assert_output --partial "name the commit to compare against"
}

@test "bench-compare: a REV that names no commit is an error, before any build" {
    git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1 || skip "not a git checkout"
    for rev in no-such-commit HEAD..no-such-commit 'HEAD..'; do
        bench_compare "$rev" exec
        assert_failure 2
        assert_output "dev.sh: bench-compare: '$rev' names no commit of this repository (REV, or OLD..NEW)"
    done
    # the arguments pass: the stand-in cmake is reached
    bench_compare HEAD exec
    assert_failure
    assert_output --partial "cmake ran"
}

@test "gpu-pack: a folder it did not make, or the build's own, is refused before anything is replaced" {
    mkdir "$BATS_TEST_TMPDIR/mine"
    echo keep >"$BATS_TEST_TMPDIR/mine/notes.txt"
    BUILD_DIR=$BATS_TEST_TMPDIR/build run "$SRC/dev.sh" gpu-pack "$BATS_TEST_TMPDIR/mine"
    assert_failure
    assert_output --partial "is not empty and not a bundle gpu-pack made"
    [ "$(cat "$BATS_TEST_TMPDIR/mine/notes.txt")" = keep ] || fail "the folder's file was touched"
    BUILD_DIR=$BATS_TEST_TMPDIR/build run "$SRC/dev.sh" gpu-pack "$BATS_TEST_TMPDIR/build"
    assert_failure
    assert_output --partial "into another folder"
}
