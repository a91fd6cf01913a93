#!/bin/sh
# llmt-train's NCCL join at 2 ranks (examples/train_cli/nccl_comm.c), without
# a GPU: tests/tools/nccl_join_shim.c, preloaded into each rank, opens CPU
# contexts and stands in for the NCCL calls. Checks that
#   - rank 1 is given rank 0's unique id (broadcast over MPI);
#   - rank 0's id failing: every rank exits 1, rank 1 naming rank 0;
#   - rank 1 failing to create its communicator: every rank exits 1, rank 0
#     naming rank 1, promptly;
#   - rank 0 failing while rank 1 never returns from the join: the job ends
#     by MPI_Abort with status 1 after llmt-train's wait (--fail-wait 4).
# The data is never read (every case fails before it is opened).
# Usage: test_llmt_train_nccl_join.sh LLMT_TRAIN SHIM MPIEXEC
set -eu
train=$1
shim=$2
mpiexec=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cat > "$tmp/tiny.yaml" <<EOT
model: {vocab_size: 110, hidden_size: 16, num_layers: 2, num_heads: 2, num_kv_heads: 1,
        ffn_size: 32, max_seq_len: 8}
batch: {batch_size: 4, micro_batch: 1, seq_len: 8}
data: {train: "$tmp/absent/t_*.bin"}
train: {steps: 3, log_every: 1, seed: 7, threads: 1, backend: cuda}
checkpoint: {every: 0, fast_every: 0}
EOT

# run MODE FAILING-RANK [ARGS...]: the job's exit status in $rc, its seconds
# in $took, its stderr in $tmp/err.
run() {
    mode=$1 rank=$2
    shift 2
    rc=0
    start=$(date +%s)
    timeout 120 "$mpiexec" -n 2 env LD_PRELOAD="$shim" SHIM_MODE="$mode" SHIM_RANK="$rank" \
        "$train" --config "$tmp/tiny.yaml" --out "$tmp/out-$mode" "$@" > /dev/null 2> "$tmp/err" ||
        rc=$?
    took=$(($(date +%s) - start))
}
has() { grep -qF -- "$1" "$tmp/err" || fail "$2: no '$1' in: $(cat "$tmp/err")"; }

run id_fails ""
[ $rc -eq 1 ] || fail "id_fails: exit $rc: $(cat "$tmp/err")"
has "rank 0: llmt-train: the NCCL communicator: CUDA error: shim: no unique id here" id_fails
has "rank 1: llmt-train: making the NCCL unique id failed on rank 0" id_fails
[ $took -le 20 ] || fail "id_fails: took $took s"

run create_fails 1
[ $rc -eq 1 ] || fail "create_fails: exit $rc: $(cat "$tmp/err")"
id0=$(sed -n 's/^.*shim: rank 0 of 2 was given //p' "$tmp/err")
id1=$(sed -n 's/^.*shim: rank 1 of 2 was given //p' "$tmp/err")
case $id0 in id-of-pid-[0-9]*) ;; *) fail "create_fails: rank 0's id '$id0': $(cat "$tmp/err")" ;; esac
[ "$id0" = "$id1" ] || fail "rank 1 was given '$id1', rank 0 '$id0'"
has "rank 1: llmt-train: the NCCL communicator (rank 1 of 2" create_fails
has "shim: ncclCommInitRank failed on this rank" create_fails
has "rank 0: llmt-train: creating the NCCL communicator failed on rank 1" create_fails
[ $took -le 20 ] || fail "create_fails: took $took s"

run stuck 0 --fail-wait 4
[ $rc -eq 1 ] || fail "stuck: exit $rc (want MPI_Abort's 1): $(cat "$tmp/err")"
has "did not answer within 4 s of this rank's failure: ending the job" stuck
[ $took -ge 4 ] && [ $took -le 60 ] || fail "stuck: took $took s"
echo "PASS"
