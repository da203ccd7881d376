#!/usr/bin/env bash
# bundle_check.sh BUNDLE OUTDIR: the ./dev.sh gpu-pack bundle as a bare GPU machine gets it,
# tried on this machine: copied with the GPU scripts into a fresh folder and run in a mount
# namespace where Open MPI's and PMIx's installed files, and the system's copy of every library
# the bundle carries, are hidden (an empty file where each was, so a missing piece fails loudly
# instead of being taken from the system). Its pre-flight and the checks that run on the CUDA/NCCL
# test double must pass; their record goes to OUTDIR/gpu-check.md.
set -euo pipefail
bundle=$(realpath "$1") out=$(realpath -m "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
mkdir -p "$fresh/src/tests" "$out"
cp -a "$root/tests/gpu" "$fresh/src/tests/"
cp -a "$root/dev.sh" "$fresh/src/"
cp -a "$bundle" "$fresh/src/build-gpu"
arch=$(gcc -print-multiarch)
hide=()
for f in "$fresh/src/build-gpu/ompi/lib"/*.so* "$fresh/src/build-gpu/carry-lib"/*; do
    [ -e "/usr/lib/$arch/$(basename "$f")" ] && hide+=("/usr/lib/$arch/$(basename "$f")")
done
unshare -m bash -s "$fresh/src" "$out" "$arch" "${hide[@]}" <<'NS'
set -uo pipefail
src=$1 out=$2 arch=$3
shift 3
for d in /usr/lib/$arch/openmpi /usr/lib/$arch/pmix2 /usr/share/openmpi /etc/openmpi; do
    [ -d "$d" ] && mount -t tmpfs none "$d"
done
for f in /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info "$@"; do
    [ -e "$f" ] && mount --bind /dev/null "$f"
done
if /usr/bin/orterun --version >/dev/null 2>&1; then echo "bundle_check: the system's Open MPI is not hidden" >&2; exit 1; fi
cd "$src"
fails=0
for part in preflight staged nccl bench; do
    BUILD_DIR=$src/build-gpu bash tests/gpu/gpu_check.sh "$part" --double --out "$out"
    fails=$((fails + $?))
done
exit $fails
NS
