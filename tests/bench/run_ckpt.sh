#!/bin/sh
# Single-process checkpoints against plain file I/O: runs bench_ckpt on
# SCRATCH_DIR (the disk to measure, default /tmp) and prints the machine and
# the load average before and after, every round and the min / median
# summaries (docs/PERFORMANCE.md). Usage: run_ckpt.sh BUILD_DIR [ROUNDS] [SCRATCH_DIR]
set -eu
bench=$1/tests/bench/bench_ckpt
rounds=${2:-6}
scratch=${3:-/tmp}
echo "== $(date -u), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "== before: $(uptime)"
"$bench" "$scratch" "$rounds"
echo "== after: $(uptime)"
