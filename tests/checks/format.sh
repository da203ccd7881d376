#!/bin/sh
# Fails when a C/C++ file changed since the commit that last changed .clang-format is not formatted
# as .clang-format says (clang-format --dry-run -Werror): every file a change touches is formatted
# whole, and files no change touched since are left as they are. Committed, staged, unstaged and
# new (untracked, not ignored) files count. Where git is not installed every file is checked; a
# tree without .git (a release tarball) is skipped.
#   usage: format.sh SOURCE_DIR [CLANG_FORMAT]    exit 77: skipped
#   format.sh --self-test [CLANG_FORMAT]: the check flags a misformatted file and passes the rest
set -eu
if [ "${1:-}" = --self-test ]; then
    cf=${2:-clang-format}
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    src=$(cd "$(dirname "$0")/../.." && pwd)
    cp "$src/.clang-format" "$dir/"
    printf 'int old(void)\n{\n  return 1 ;\n}\n' >"$dir/old.c"
    (cd "$dir" && git init -q && git add . && git -c user.name=t -c user.email=t@t commit -qm base) ||
        { echo "format: the self-test needs git"; exit 1; }
    printf 'int bad(int x) {  return x+1 ; }\n' >"$dir/bad.c"
    if sh "$0" "$dir" "$cf" >"$dir/out" 2>&1 || ! grep -q "bad.c" "$dir/out"; then
        echo "format: the self-test's misformatted new file was not flagged"; cat "$dir/out"; exit 1
    fi
    grep -q "old.c" "$dir/out" && { echo "format: a file unchanged since .clang-format was flagged"; exit 1; }
    "$cf" -i "$dir/bad.c"
    sh "$0" "$dir" "$cf" >"$dir/out" 2>&1 || { echo "format: a formatted file was flagged"; cat "$dir/out"; exit 1; }
    echo "x" >>"$dir/old.c"
    if sh "$0" "$dir" "$cf" >"$dir/out" 2>&1 || ! grep -q "old.c" "$dir/out"; then
        echo "format: a misformatted file changed since .clang-format was not flagged"; cat "$dir/out"; exit 1
    fi
    rm -rf "$dir/.git"
    rc=0
    sh "$0" "$dir" "$cf" >"$dir/out" 2>&1 || rc=$?
    [ $rc -eq 77 ] || { echo "format: a tree without .git was not skipped (exit $rc)"; cat "$dir/out"; exit 1; }
    echo "format: the self-test passes"
    exit 0
fi
src=${1:?usage: format.sh SOURCE_DIR [CLANG_FORMAT]}
cf=${2:-clang-format}
cd "$src"
list=$(mktemp)
trap 'rm -f "$list"' EXIT
if ! command -v git >/dev/null 2>&1; then
    echo "format: git is not installed: checking every C/C++ file"
    find . -path ./build -prune -o -path './build-*' -prune -o -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' \) -print >"$list"
elif [ ! -e .git ]; then
    echo "format: $src is not a git checkout: nothing to compare with .clang-format's commit; skipped"
    exit 77
else
    base=$(git log -1 --format=%H -- .clang-format)
    {
        if [ -n "$base" ]; then
            git diff --name-only --diff-filter=d "$base" -- '*.c' '*.h' '*.cpp' '*.hpp'
        else
            git ls-files -- '*.c' '*.h' '*.cpp' '*.hpp'
        fi
        git ls-files --others --exclude-standard -- '*.c' '*.h' '*.cpp' '*.hpp'
    } | sort -u >"$list"
fi
if [ ! -s "$list" ]; then
    echo "format: no C/C++ file changed since .clang-format's commit"
    exit 0
fi
n=$(wc -l <"$list")
# shellcheck disable=SC2046
if xargs "$cf" --style=file --dry-run -Werror <"$list" 2>&1; then
    echo "format: the $n C/C++ files changed since .clang-format's commit are formatted"
    exit 0
fi
echo "format: the files above are not formatted as .clang-format says: run clang-format -i on them" \
    "(a change formats every file it touches, whole)"
exit 1
