#!/bin/sh
# Fails when an object of libdpshim outside shim/interpose/ (or of the policy library) refers to a
# libc name that shim/interpose/ defines: from inside the library such a call binds to the shim's
# own interposer, which is safe only by the order things happen in. The shim's own calls go
# through shim/core/sys.h (dps_sys_*); one that means to apply the file policy calls the
# interposer's code by a dps_ name.
#   usage: own_calls.sh OBJECT...   (objects named .../FOLDER/FILE.c.o, as CMake names them)
#   own_calls.sh --self-test: the check itself must find such a call, and pass the sys.h spelling
set -eu
if [ "${1:-}" = --self-test ]; then
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    src=$(cd "$(dirname "$0")/../.." && pwd)
    mkdir -p "$dir/interpose" "$dir/core"
    printf 'int open(const char *p, int f, ...) { (void)p; return f; }\nint dps_helper(void) { return 0; }\n' >"$dir/i.c"
    printf '#include <fcntl.h>\nint probe(void) { return open("/x", O_RDONLY); }\n' >"$dir/bad.c"
    printf '#include "sys.h"\nint dps_helper(void);\nint probe(void) { return dps_sys_open("/x", O_RDONLY, 0) + dps_helper(); }\n' >"$dir/good.c"
    cc -c "$dir/i.c" -o "$dir/interpose/i.c.o"
    cc -c "$dir/bad.c" -o "$dir/core/bad.c.o"
    cc -I"$src/shim/core" -c "$dir/good.c" -o "$dir/core/good.c.o"
    if sh "$0" "$dir/interpose/i.c.o" "$dir/core/bad.c.o" >"$dir/out" 2>&1 || ! grep -q "bad.c.o.*open" "$dir/out"; then
        echo "own_calls: the self-test's call of open by its libc name was not found"; cat "$dir/out"; exit 1
    fi
    sh "$0" "$dir/interpose/i.c.o" "$dir/core/good.c.o" >/dev/null ||
        { echo "own_calls: dps_sys_open or a dps_ name was taken for an interposed call"; exit 1; }
    echo "own_calls: the self-test passes"
    exit 0
fi
[ $# -gt 0 ] || { echo "usage: own_calls.sh OBJECT..."; exit 2; }
# CTest passes CMake's object lists as single arguments, their items joined by ';'
# shellcheck disable=SC2046
set -- $(printf '%s\n' "$@" | tr ';' '\n')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in "$@"; do
    case $o in */interpose/*) nm --defined-only "$o" | awk 'NF == 3 && $2 == "T" && $3 !~ /^dps_/ { print $3 }' ;; esac
done | sort -u >"$tmp/interposed"
[ -s "$tmp/interposed" ] || { echo "own_calls: no object of shim/interpose/ among the arguments"; exit 1; }
bad=0
for o in "$@"; do
    case $o in */interpose/*) continue ;; esac
    calls=$(nm -u "$o" | awk '{ print $NF }' | sed 's/@.*//' | sort -u | comm -12 - "$tmp/interposed" | tr '\n' ' ')
    if [ -n "$calls" ]; then
        echo "own_calls: $o calls $calls by the libc name, which binds to the shim's own interposer: use shim/core/sys.h"
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "own_calls: outside shim/interpose/, no object calls an interposed libc name"
exit $bad
