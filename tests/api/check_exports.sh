#!/bin/sh
# Compares the functions marked LLMT_API in the public headers with the
# dynamic symbols the built library defines: both sets must be equal, and
# every one must be the default version of the symbol version node NODE
# (lib/llmt.map), i.e. listed by nm as name@@NODE.
# Usage: check_exports.sh INCLUDE_DIR LIBRARY NODE
set -eu
include_dir=$1
library=$2
node=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Each declaration is written "LLMT_API <type> <name>(" on one line.
grep -h '^LLMT_API ' "$include_dir"/*.h > "$tmp/decls"
sed -E 's/^LLMT_API [^(]*[^a-z0-9_](llmt_[a-z0-9_]+)\(.*/\1/' "$tmp/decls" | sort > "$tmp/names"
if grep -v '^llmt_[a-z0-9_]*$' "$tmp/names"; then
    echo "FAIL: the lines above are LLMT_API declarations this check cannot parse" >&2
    exit 1
fi
# Every LLMT_API in the headers (other than the macro's definition) must be a
# declaration of the form above.
used=$(grep -h 'LLMT_API' "$include_dir"/*.h | grep -Evc '^[[:space:]]*(#|/\*|\*)' || true)
if [ "$used" -ne "$(wc -l < "$tmp/names")" ]; then
    echo "FAIL: $used uses of LLMT_API but $(wc -l < "$tmp/names") parsed declarations" >&2
    exit 1
fi
sed "s/\$/@@$node/" "$tmp/names" > "$tmp/headers"

# The version node itself is an absolute symbol (type A), not a function.
nm -D --defined-only "$library" | awk '$2 ~ /^[TtWwDdBbRr]$/ {print $3}' | sort -u > "$tmp/exported"

if ! diff -u "$tmp/headers" "$tmp/exported" > "$tmp/diff"; then
    echo "FAIL: LLMT_API declarations (-) and exported symbols (+) differ:" >&2
    grep '^[-+]llmt\|^[-+][a-zA-Z_]' "$tmp/diff" >&2 || cat "$tmp/diff" >&2
    exit 1
fi
echo "ok: $(wc -l < "$tmp/headers") functions declared and exported as version $node"
