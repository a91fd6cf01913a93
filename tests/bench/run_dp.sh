#!/bin/sh
# Data-parallel against one process on the same cores: each round runs
# bench_dp as one process of two threads, then as `mpiexec -n 2` of one
# thread each (deterministic, then fast), same model and global batch, and
# the round's ratios are taken against its own single-process run (these
# machines are noisy). Prints every round, then min and median of the
# ratios. Usage: run_dp.sh BUILD_DIR [ROUNDS] [STEPS] [fp32|bf16]
set -eu
bench=$1/tests/bench/bench_dp
rounds=${2:-3}
steps=${3:-5}
dtype=${4:-fp32}
# Open MPI: shared memory only, and root allowed (CI and containers).
export OMPI_MCA_btl=self,vader OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
field() { echo "$1" | tr ' ' '\n' | grep -A1 -x "$2" | tail -1; }
ratios=$(mktemp)
echo "== $(date -u), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq "$rounds"); do
    single=$(OMP_NUM_THREADS=2 "$bench" single "$steps" 2 "$dtype")
    echo "$single"
    for mode in deterministic fast; do
        dp=$(OMP_NUM_THREADS=1 mpiexec -n 2 "$bench" "$mode" "$steps" 1 "$dtype")
        echo "$dp"
        echo "$mode $(field "$single" step_median) $(field "$dp" step_median)" >> "$ratios"
    done
done
for mode in deterministic fast; do
    grep "^$mode " "$ratios" | awk '{ printf "%.4f\n", $2 / $3 }' | sort -n | awk -v m="$mode" \
        '{ r[NR] = $1 } END { med = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2;
          printf "%s: one process (2 threads) / 2 ranks (1 thread each), step median: min %.2f median %.2f over %d rounds\n", m, r[1], med, NR }'
done
rm -f "$ratios"
