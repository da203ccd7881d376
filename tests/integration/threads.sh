#!/bin/sh
# The threaded cases of one bats file under ThreadSanitizer (ctest -L threads in the build of
# -DDPSHIM_SANITIZE=thread): its runtime is preloaded before the shim (helpers.bash), so that its
# interceptors come first in every rank; each rank writes its reports to a file of its own
# (progs/tsan_warmup.c), and any report fails the test, also where the case itself expects the
# job to fail.
#   usage: threads.sh PRELOAD_FIRST SUPPRESSIONS BATS FILE.bats FILTER
# PRELOAD_FIRST: TSan's runtime and tsan_warmup (progs/tsan_warmup.c), separated by a colon.
set -u
rt=$1 supp=$2 bats=$3 file=$4 filter=$5
reports=$(mktemp -d "${TMPDIR:-/tmp}/dpshim-tsan.XXXXXX") || exit 1
trap 'rm -rf "$reports"' EXIT
# history_size=4: the stacks of both accesses of a report in a program that runs for seconds
export DPS_PRELOAD_FIRST="$rt"
export TSAN_OPTIONS="suppressions=$supp history_size=4 ${TSAN_OPTIONS:-}" DPS_TSAN_REPORT="$reports/report"
"$bats" --timing --filter "$filter" "$file"
rc=$?
for r in "$reports"/report.*; do
    [ -e "$r" ] || break
    echo "threads.sh: ThreadSanitizer reported in process ${r##*.}:"
    cat "$r"
    rc=1
done
[ $rc -eq 0 ] && echo "threads.sh: no ThreadSanitizer report"
exit $rc
