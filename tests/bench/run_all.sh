#!/bin/sh
# Runs every benchmark whose figures docs/PERFORMANCE.md records, one after
# the other, on an otherwise idle machine. Usage: run_all.sh BUILD_DIR [SCRATCH_DIR]
# (BUILD_DIR: a Release build with tests and examples; SCRATCH_DIR: a
# directory on the disk to measure checkpoints on, default /tmp).
set -eu
build=$1
scratch=${2:-/tmp}
bench=$build/tests/bench
echo "== $(date -u), $(nproc) CPUs, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo "== bench_gemm"; "$bench/bench_gemm" 2
echo "== bench_step small, every precision"; "$bench/bench_step" small 5 2 all
echo "== bench_step 134m fp32"; "$bench/bench_step" 134m 3 2 fp32
echo "== bench_recompute"; "$bench/bench_recompute" 5 2
echo "== bench_ckpt"; "$bench/bench_ckpt" "$scratch"
echo "== llmt-train, default configuration, from scratch"
out=$(mktemp -d "$scratch/llmt-train-XXXXXX")
start=$(date +%s)
"$build/examples/llmt-train" --out "$out" > "$out.log"
end=$(date +%s)
grep -E "tokenized|parameters|held-out|^final|^sample" "$out.log"
echo "wall time: $((end - start)) s"
rm -rf "$out" "$out.log"
