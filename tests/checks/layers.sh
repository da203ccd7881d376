#!/bin/sh
# Fails when a file of libdpshim includes from a layer above its own. The layers, bottom up
# (CONTRIBUTING.md: How it works): a folder may include from its own folder and from lower layers only.
#   usage: layers.sh SHIM_DIR
set -eu
shim=${1:?usage: layers.sh SHIM_DIR}
layer_of() {
    case $1 in
    plugin_abi) echo -1 ;; # below every layer: what the library and its plugins agree on
    core) echo 0 ;;
    diag | backends | gpu | output) echo 1 ;;
    guard | files) echo 2 ;;
    engine) echo 3 ;;
    interpose | ffi) echo 4 ;;
    start) echo 5 ;;
    *) echo unknown ;;
    esac
}
bad=0
for f in $(cd "$shim" && find . -name '*.[ch]' | sed 's|^\./||' | sort); do
    from=${f%%/*}
    lf=$(layer_of "$from")
    if [ "$lf" = unknown ]; then
        echo "layers: $shim/$f: folder '$from' is in no layer; add it to tests/checks/layers.sh and CONTRIBUTING.md"
        bad=1
        continue
    fi
    # includes that name a folder of the shim: #include "engine/engine.h"
    for to in $(sed -n 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_]*\)/.*|\1|p' "$shim/$f"); do
        [ -d "$shim/$to" ] || continue
        lt=$(layer_of "$to")
        if [ "$to" != "$from" ] && { [ "$lt" = unknown ] || [ "$lt" -ge "$lf" ]; }; then
            echo "layers: $shim/$f (layer $lf, $from) includes from $to (layer $lt): only lower layers may be used"
            bad=1
        fi
    done
done
[ $bad -eq 0 ] && echo "layers: every include points down"
exit $bad
