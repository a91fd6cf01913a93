#!/bin/sh
# Configuring against a oneDNN other than 2.x (whose C API the GEMMs use) fails
# at once, naming the version found: here headers that say 3.1.
# Usage: check_onednn_version.sh SOURCE_DIR
set -eu
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

mkdir -p "$tmp/include/oneapi/dnnl"
: > "$tmp/include/oneapi/dnnl/dnnl.h"
printf '#define DNNL_VERSION_MAJOR 3\n#define DNNL_VERSION_MINOR 1\n' \
    > "$tmp/include/oneapi/dnnl/dnnl_version.h"
if cmake -S "$src" -B "$tmp/build" -DLLMT_CUDA=OFF -DLLMT_BUILD_TESTS=OFF \
        -DLLMT_BUILD_EXAMPLES=OFF -DLLMT_ONEDNN_INCLUDE_DIR="$tmp/include" > "$tmp/log" 2>&1; then
    fail "configured against oneDNN 3.1 headers"
fi
grep -q "oneDNN 3.1 found" "$tmp/log" || { cat "$tmp/log" >&2; fail "no message naming oneDNN 3.1"; }
grep -q "needs oneDNN 2.x" "$tmp/log" || { cat "$tmp/log" >&2; fail "no message naming 2.x"; }
echo "ok: oneDNN 3.1 refused at configure time"
