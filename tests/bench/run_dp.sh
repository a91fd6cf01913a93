#!/bin/sh
# Data-parallel against one process on the same cores: each round runs
# bench_dp as one process of two threads, then as `mpiexec -n 2` of one
# thread each (deterministic, then fast), same model and global batch, and
# the round's ratios are taken against its own single-process run (these
# machines are noisy). With `offload` as the fifth argument the reference
# is `-n 2` deterministic without offload instead, against the same with
# the optimizer's state of every layer offloaded, then with its gradients
# too. Prints every round, then min and median of the ratios (reference
# step / other step: above 1, the other is faster).
# Usage: run_dp.sh BUILD_DIR [ROUNDS] [STEPS] [fp32|bf16] [offload]
set -eu
bench=$1/tests/bench/bench_dp
rounds=${2:-3}
steps=${3:-5}
dtype=${4:-fp32}
offload=${5:-}
# Open MPI: shared memory only, and root allowed (CI and containers).
export OMPI_MCA_btl=self,vader OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$offload" = offload ]; then
    others="optimizer optimizer+grads"
    what="-n 2 without offload / -n 2 with"
else
    others="deterministic fast"
    what="one process (2 threads) / 2 ranks (1 thread each)"
fi
reference() {
    if [ "$offload" = offload ]; then
        OMP_NUM_THREADS=1 mpiexec -n 2 "$bench" deterministic "$steps" 1 "$dtype" none
    else
        OMP_NUM_THREADS=2 "$bench" single "$steps" 2 "$dtype"
    fi
}
other() {
    if [ "$offload" = offload ]; then
        OMP_NUM_THREADS=1 mpiexec -n 2 "$bench" deterministic "$steps" 1 "$dtype" "$1"
    else
        OMP_NUM_THREADS=1 mpiexec -n 2 "$bench" "$1" "$steps" 1 "$dtype"
    fi
}
field() { echo "$1" | tr ' ' '\n' | grep -A1 -x "$2" | tail -1; }
ratios=$(mktemp)
echo "== $(date -u), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq "$rounds"); do
    ref=$(reference)
    echo "$ref"
    for o in $others; do
        run=$(other "$o")
        echo "$run"
        echo "$o $(field "$ref" step_median) $(field "$run" step_median)" >> "$ratios"
    done
done
for o in $others; do
    grep "^$o " "$ratios" | awk '{ printf "%.4f\n", $2 / $3 }' | sort -n | awk -v o="$o" -v w="$what" \
        '{ r[NR] = $1 } END { med = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2;
          printf "%s: %s, step median: min %.2f median %.2f over %d rounds\n", o, w, r[1], med, NR }'
done
rm -f "$ratios"
