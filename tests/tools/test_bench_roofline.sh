#!/bin/sh
# bench_gpu_step --roofline: prints the 1B model's per-op-family roofline
# table without a device; two of its figures equal hand formulas (awk); the
# table in docs/cuda.md is its output (the measured column aside); bad
# arguments are refused.
# Usage: test_bench_roofline.sh PATH_TO_BENCH_GPU_STEP SOURCE_DIR
set -eu
bench=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bench" --roofline 1b > "$tmp/out" || fail "--roofline 1b: exit $?"
cat "$tmp/out"

# Column $3 (GFLOP) of family $1's row.
gflop() { awk -F' *[|] *' -v f="$1" '$2 == f { print $4 }' "$tmp/out"; }
# The 1B model: B 8, T 2048, d 2048, 16 layers, 16 heads of 128, 8 kv heads, ffn 5632.
# Forward products: 2 tokens (qkv d + d att + 2 ffn d + d ffn) per layer.
want=$(awk 'BEGIN { m = 8 * 2048; printf "%.1f", 2 * m * (4096 * 2048 + 2048 * 2048 + 11264 * 2048 + 2048 * 5632) * 16 / 1e9 }')
[ "$(gflop gemm_fwd)" = "$want" ] || fail "gemm_fwd GFLOP $(gflop gemm_fwd), expected $want"
# Attention forward over the full square: 2 products of 2 B heads T^2 head_dim per layer.
want=$(awk 'BEGIN { printf "%.1f", 4 * 8 * 16 * 2048 * 2048 * 128 * 16 / 1e9 }')
[ "$(gflop attn_fwd)" = "$want" ] || fail "attn_fwd GFLOP $(gflop attn_fwd), expected $want"

# docs/cuda.md holds the output between its markers, unchanged but for the
# last column of the table, "measured ms", filled in by hand after a GPU run.
but_measured() { sed -E 's/[|][^|]*[|]$/|/' "$1"; }
sed -n '/^<!-- roofline 1b begin -->$/,/^<!-- roofline 1b end -->$/p' "$src/docs/cuda.md" |
    sed '1d;$d' > "$tmp/doc"
[ -s "$tmp/doc" ] || fail "docs/cuda.md has no roofline 1b table between its markers"
but_measured "$tmp/doc" > "$tmp/doc.cut"
but_measured "$tmp/out" > "$tmp/out.cut"
diff -u "$tmp/doc.cut" "$tmp/out.cut" ||
    fail "docs/cuda.md's table differs from bench_gpu_step --roofline 1b (paste its output)"

for args in "--roofline 7b" "--roofline 1b extra"; do
    rc=0
    # shellcheck disable=SC2086
    "$bench" $args > "$tmp/std" 2> "$tmp/err" || rc=$?
    [ "$rc" = 2 ] || fail "$args: exit $rc, expected 2"
    [ ! -s "$tmp/std" ] || fail "$args: printed a table before refusing"
    grep -q 'usage: .*--roofline' "$tmp/err" || fail "$args: no usage line"
done
echo "PASS"
