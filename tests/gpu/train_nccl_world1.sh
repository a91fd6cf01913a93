#!/bin/sh
# The nccl-train stage of tests/gpu/run.sh (GPU only): llmt-train with
# train.backend cuda and --data-parallel, one rank, so through the path a
# multi-GPU launch takes (examples/train_cli/nccl_comm.c: the NCCL unique
# id, a communicator of one rank on the run's context, the sharded
# optimizer and sharded checkpoints over it): 10 steps of a tiny model on a
# hand-made shard whose loss falls (step 10 below step 1), a sharded
# checkpoint with one optimizer file, then a rerun to 14 steps that resumes
# from step 10 and ends with the bytes of an uninterrupted 14-step run; and
# 14 steps with the optimizer state and gradients of every layer offloaded
# (on CUDA each offloaded bucket sent from its slot of the gradient bucket
# by the overlapped exchange) end with those bytes too. Heads of 32
# elements, as the CUDA kernels take.
# One rank: NCCL refuses two ranks on one GPU, and the kit carries no MPI
# (the ranks' joining is checked on the CPU: tests/tools/test_llmt_train_mpi.sh).
#
#   tests/gpu/train_nccl_world1.sh LLMT_TRAIN [BACKEND]
#
# BACKEND is cuda; cpu runs the same checks without a GPU (over MPI's
# communicator of one: llmt-train built with MPI), to try this script.
set -eu
train=$1
backend=${2:-cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

. "$(dirname "$0")/../tools/shard_v1.sh"
write_text_shard "$tmp/d"
cat > "$tmp/tiny.yaml" <<EOF
model: {vocab_size: 110, hidden_size: 64, num_layers: 2, num_heads: 2, num_kv_heads: 1,
        ffn_size: 128, max_seq_len: 8}
optimizer: {lr: 1.0e-2}
batch: {batch_size: 4, micro_batch: 1, seq_len: 8}
data: {train: "$tmp/d/t_*.bin", val: "$tmp/d/t_*.bin"}
train: {steps: 10, eval_batches: 1, log_every: 1, seed: 7, threads: 1, backend: $backend}
checkpoint: {every: 5, fast_every: 0}
EOF
run() { # out-dir log extra-args...
    o=$1 log=$2
    shift 2
    "$train" --config "$tmp/tiny.yaml" --out "$o" --data-parallel "$@" > "$log" 2>&1 ||
        fail "llmt-train --out $o $*: exit $?: $(cat "$log")"
    cat "$log"
}

run "$tmp/r" "$tmp/r.log"
engine=" over NCCL"
[ "$backend" = cuda ] || engine=
grep -q "tiny.yaml, 1 rank$engine; starting at step 0 of 10" "$tmp/r.log" ||
    fail "the header does not name 1 rank$engine"
loss() { sed -n "s|^step *$2/[0-9]*  loss \\([0-9.]*\\) .*|\\1|p" "$1"; }
first=$(loss "$tmp/r.log" 1)
last=$(loss "$tmp/r.log" 10)
if [ -z "$first" ] || [ -z "$last" ]; then fail "no loss at step 1 or 10"; fi
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' ||
    fail "the loss did not fall: $first at step 1, $last at step 10"
ckpt=$tmp/r/checkpoints/step-00000010
[ "$(ls "$ckpt" | tr '\n' ' ')" = "MANIFEST model.safetensors optimizer-00001-of-00001.safetensors user.bin " ] ||
    fail "step 10 is not a sharded checkpoint of one rank: $(ls "$ckpt")"

run "$tmp/r" "$tmp/resume.log" --resume --steps 14
grep -q "resuming at step 10 of 14" "$tmp/resume.log" || fail "the rerun did not resume from step 10"
run "$tmp/u" "$tmp/u.log" --steps 14
run "$tmp/o" "$tmp/o.log" --steps 14 optimizer.offload=optimizer+grads
for f in model.safetensors optimizer-00001-of-00001.safetensors; do
    cmp "$tmp/r/checkpoints/step-00000014/$f" "$tmp/u/checkpoints/step-00000014/$f" ||
        fail "resumed at step 10: $f of step 14 differs from an uninterrupted run's"
    cmp "$tmp/o/checkpoints/step-00000014/$f" "$tmp/u/checkpoints/step-00000014/$f" ||
        fail "with optimizer+grads offloaded: $f of step 14 differs from the run without"
done
echo "llmt-train --data-parallel on $backend, one rank: the loss fell ($first to $last), step 10 resumed to the uninterrupted run's bytes, and 14 steps with optimizer+grads offloaded gave the same bytes"
