#!/bin/sh
# Fails when the object files of one folder of libdpshim use each other in a circle (a uses what
# b defines and b, directly or around, what a defines), for the folders named in FOLDERS: such a
# folder's files stand in layers of their own, each calling only those below it.
#   usage: circles.sh "FOLDER..." OBJECT...     (objects named .../FOLDER/FILE.c.o, as CMake names them)
#   circles.sh --self-test: the check itself must find a circle of two files and pass a line
set -eu
if [ "${1:-}" = --self-test ]; then
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    mkdir -p "$dir/engine"
    printf 'int b(void);\nint a(void) { return b(); }\n' >"$dir/a.c"
    printf 'int a(void);\nint b(void) { return a(); }\n' >"$dir/b.c"
    printf 'int c(void) { return 1; }\n' >"$dir/c.c"
    for f in a b c; do cc -c "$dir/$f.c" -o "$dir/engine/$f.c.o"; done
    if sh "$0" engine "$dir/engine/a.c.o" "$dir/engine/b.c.o" "$dir/engine/c.c.o" >"$dir/out" 2>&1; then
        echo "circles: the self-test's circle of a.c and b.c was not found"; cat "$dir/out"; exit 1
    fi
    if ! grep -q "a.c" "$dir/out" || ! grep -q "b.c" "$dir/out"; then
        echo "circles: the report does not name both files"; cat "$dir/out"; exit 1
    fi
    # a line is no circle: a uses b, b nothing of a
    printf 'int b(void) { return 2; }\n' >"$dir/b.c"
    cc -c "$dir/b.c" -o "$dir/engine/b.c.o"
    sh "$0" engine "$dir/engine/a.c.o" "$dir/engine/b.c.o" >/dev/null || { echo "circles: a line was taken for a circle"; exit 1; }
    echo "circles: the self-test passes"
    exit 0
fi
folders=${1:?usage: circles.sh \"FOLDER...\" OBJECT...}
shift
# CTest passes CMake's object list as one argument, its items joined by ';' (no path has a space)
# shellcheck disable=SC2046
set -- $(printf '%s\n' "$@" | tr ';' '\n')
bad=0
for folder in $folders; do
    objs=
    for o in "$@"; do
        case $o in */"$folder"/*.o) objs="$objs $o" ;; esac
    done
    [ -n "$objs" ] || { echo "circles: no object of $folder among the arguments"; bad=1; continue; }
    tmp=$(mktemp -d)
    # the edges: file -> file whose symbols it uses (each file also -> itself, so tsort lists all)
    for o in $objs; do
        f=$(basename "$o" .o)
        nm "$o" | awk '$1 == "U" { print $2 }' | sort -u >"$tmp/$f.uses"
        nm --defined-only "$o" | awk 'NF == 3 && $2 ~ /[TDBRV]/ { print $3 }' | sort -u >"$tmp/$f.defines"
    done
    for o in $objs; do
        a=$(basename "$o" .o)
        echo "$a $a"
        for p in $objs; do
            b=$(basename "$p" .o)
            [ "$a" = "$b" ] || [ -z "$(comm -12 "$tmp/$a.uses" "$tmp/$b.defines")" ] || echo "$a $b"
        done
    done >"$tmp/edges"
    if ! tsort "$tmp/edges" >/dev/null 2>"$tmp/loops"; then
        echo "circles: the files of $folder use each other around a circle: $(grep -v 'input contains a loop' "$tmp/loops" | sed 's/^tsort: //' | tr '\n' ' ')(what a file uses: nm -u FILE.o; what it defines: nm --defined-only FILE.o)"
        bad=1
    fi
    rm -rf "$tmp"
done
[ $bad -eq 0 ] && echo "circles: the files of each of $folders call one way"
exit $bad
