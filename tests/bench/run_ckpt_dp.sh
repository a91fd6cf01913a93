#!/bin/sh
# Sharded checkpoints of a data-parallel run against plain file I/O: runs
# bench_ckpt_dp as `mpiexec -n 2`, one OpenMP thread per rank, on SCRATCH_DIR
# (the disk to measure, default /tmp). Prints the machine, the load average
# before and after, every round and the min / median summaries
# (docs/PERFORMANCE.md). Usage: run_ckpt_dp.sh BUILD_DIR [ROUNDS] [SCRATCH_DIR]
set -eu
bench=$1/tests/bench/bench_ckpt_dp
rounds=${2:-6}
scratch=${3:-/tmp}
# Open MPI: shared memory only, and root allowed (CI and containers).
export OMPI_MCA_btl=self,vader OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== $(date -u), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "== before: $(uptime)"
OMP_NUM_THREADS=1 mpiexec -n 2 "$bench" "$scratch" "$rounds"
echo "== after: $(uptime)"
