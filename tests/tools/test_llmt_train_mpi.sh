#!/bin/sh
# llmt-train under a launcher (examples/train_cli/launch.c), on a tiny model
# and a hand-made shard. With MPI: `mpiexec -n 2` prints one progress
# stream whose header says "2 ranks", with the same weights and optimizer
# state, byte for byte (the per-rank optimizer files of a sharded checkpoint
# decoded by tests/tools/shards_equal_v1.py), as `-n 3` (the four
# micro-batches of a step split unevenly; deterministic mode) and as one
# process summing micro-batches in order (`mpiexec -n 1 ...
# batch.accumulation=ordered`), and `-n 2` with the optimizer's state of a
# prefix offloaded (or all of it with the gradients) writes the files of
# `-n 2` without, a resume of `-n 2`
# with --optimizer-settings config the model of `-n 1`'s, and only
# rank 0 writes --out (a second lock holder would fail the run); a fast
# tier local to each node (two working directories) keeps each node's
# files, resumes to the same bytes, and --start-over does not set them
# aside; a
# torchrun-style WORLD_SIZE=2 (or Slurm's or PMI's variables) without an
# MPI launch is refused with how to launch; errors are tagged with their rank;
# SIGTERM reaching rank 1 alone stops both ranks after the same step with a
# checkpoint; killing rank 1 ends the job within 60 s, naming the rank;
# `--data-parallel` under `mpiexec -n 1` saves a sharded checkpoint of one
# rank with the bytes of the ordered single process; train.backend cuda
# with 2 ranks and no GPU (CUDA_VISIBLE_DEVICES=-1) fails on every rank
# within 30 s with the CUDA backend's reason (LLMT_ECUDA where the plugin
# is built, else the build's lack of it), each rank on its own device.
# Either way: a launcher's variables that are not whole numbers in range
# are refused (exit 2) and its own variables win over torchrun-style ones.
# Built without MPI: a multi-rank environment, and --data-parallel on the
# cpu backend, are refused (exit 2).
# Usage: test_llmt_train_mpi.sh LLMT_TRAIN HAVE_MPI(ON|OFF) HAVE_CUDA(ON|OFF) [MPIEXEC]
# (run in the environment CMake gives MPI tests: LLMT_MPI_TEST_ENV).
set -eu
train=$1
have_mpi=$2
have_cuda=$3
mpiexec=${4:-}
tmp=$(mktemp -d)
job=
trap '[ -z "$job" ] || kill -9 "$job" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Expects the last command's exit status $1 to be $2 and its stderr to hold $3.
refused() { # status want-status want-message what
    [ "$1" -eq "$2" ] || fail "$4: exit $1, not $2: $(cat "$tmp/err")"
    grep -qF -- "$3" "$tmp/err" || fail "$4: no '$3' in: $(cat "$tmp/err")"
}

# ---- The launch's variables: whole numbers in range, a rank with its size,
# a launcher's own variables before torchrun-style ones (a world of one:
# --help runs).
launch_refused() { # want-message VAR=VALUE...
    want=$1
    shift
    rc=0
    env "$@" "$train" --help > /dev/null 2> "$tmp/err" || rc=$?
    refused $rc 2 "$want" "$*"
}
launch_refused "RANK=2 is not an integer in [0, 1]" WORLD_SIZE=2 RANK=2
launch_refused "WORLD_SIZE=two is not an integer in [1, " WORLD_SIZE=two RANK=0
launch_refused "SLURM_LOCALID=-1 is not an integer in [0, 3]" SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=0 SLURM_LOCALID=-1
launch_refused "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not" OMPI_COMM_WORLD_SIZE=2
OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 WORLD_SIZE=2 RANK=1 "$train" --help > "$tmp/out" ||
    fail "Open MPI's world of one under WORLD_SIZE=2: exit $?"

if [ "$have_mpi" != ON ]; then
    rc=0
    OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$train" --out "$tmp/no" > /dev/null 2> "$tmp/err" || rc=$?
    refused $rc 2 "this llmt-train was built without MPI" "mpirun-style launch, no MPI"
    rc=0
    WORLD_SIZE=2 RANK=1 "$train" --out "$tmp/no" > /dev/null 2> "$tmp/err" || rc=$?
    refused $rc 2 "says 2 ranks, but this llmt-train was built without MPI" "WORLD_SIZE=2, no MPI"
    rc=0
    "$train" --out "$tmp/no" --data-parallel > /dev/null 2> "$tmp/err" || rc=$?
    refused $rc 2 "--data-parallel on the cpu backend trains over MPI, but this llmt-train was built without it" \
        "--data-parallel, no MPI"
    [ ! -e "$tmp/no" ] || fail "a refused launch created --out"
    echo "llmt-train without MPI refuses a multi-rank launch and --data-parallel"
    exit 0
fi

. "$(dirname "$0")/shard_v1.sh"
write_text_shard "$tmp/d"
# Four sequences a step, one per micro-batch: with two ranks each runs two.
cat > "$tmp/tiny.yaml" <<EOF
model: {vocab_size: 110, hidden_size: 16, num_layers: 2, num_heads: 2, num_kv_heads: 1,
        ffn_size: 32, max_seq_len: 8}
batch: {batch_size: 4, micro_batch: 1, seq_len: 8}
data: {train: "$tmp/d/t_*.bin", val: "$tmp/d/t_*.bin"}
train: {steps: 3, eval_batches: 1, log_every: 1, seed: 7, threads: 1}
checkpoint: {every: 0, fast_every: 0}
EOF

# ---- One, two and three ranks: one progress stream, the same training.
for n in 1 2 3; do
    ordered=
    [ $n -gt 1 ] || ordered=batch.accumulation=ordered
    "$mpiexec" -n $n "$train" --config "$tmp/tiny.yaml" --out "$tmp/np$n" $ordered \
        > "$tmp/np$n.log" 2> "$tmp/np$n.err" || fail "-n $n: $(cat "$tmp/np$n.log" "$tmp/np$n.err")"
done
[ "$(grep -c "tiny.yaml, 2 ranks; starting at step 0 of 3" "$tmp/np2.log")" -eq 1 ] ||
    fail "-n 2: not one header naming 2 ranks: $(cat "$tmp/np2.log")"
! grep -q "ranks;" "$tmp/np1.log" || fail "-n 1 names ranks: $(cat "$tmp/np1.log")"
[ "$(grep -c '^step ' "$tmp/np2.log")" -eq 3 ] || fail "-n 2: not one stream of 3 steps: $(cat "$tmp/np2.log")"
[ "$(grep -c '^final held-out loss' "$tmp/np2.log")" -eq 1 ] || fail "-n 2: final loss lines"
[ ! -s "$tmp/np2.err" ] || fail "-n 2 wrote to stderr: $(cat "$tmp/np2.err")"
# The loss columns of each step and the final held-out loss, then the bytes.
losses() { sed -n 's/^\(step .*loss [0-9.]*\) .*/\1/p; s/^\(final held-out loss .*\)/\1/p' "$1"; }
[ "$(losses "$tmp/np1.log")" = "$(losses "$tmp/np2.log")" ] ||
    fail "losses differ: -n 1: $(losses "$tmp/np1.log"); -n 2: $(losses "$tmp/np2.log")"
for n in 1 3; do
    cmp "$tmp/np2/checkpoints/step-00000003/model.safetensors" \
        "$tmp/np$n/checkpoints/step-00000003/model.safetensors" ||
        fail "model.safetensors differs between -n 2 and -n $n (deterministic mode must give the same bytes)"
done
# -n 2 and 3 save one optimizer file per rank: laid end to end, the same
# bytes as one process's optimizer.safetensors (decoded by hand).
for n in 2 3; do
    python3 "$(dirname "$0")/shards_equal_v1.py" "$tmp/np$n/checkpoints/step-00000003" \
        "$tmp/np1/checkpoints/step-00000003" > "$tmp/eq.log" 2>&1 ||
        fail "-n $n: optimizer state differs from -n 1: $(cat "$tmp/eq.log")"
done
# Two ranks with the optimizer's state of the embedding and layer 0
# offloaded (rank 0's range straddles that prefix, rank 1's lies past it),
# then with all of it and the gradients too (8192 of the 8208 on the host
# on both ranks): the same files as without offload, the shard files
# included.
for offload in optimizer:1 optimizer+grads:all; do
    "$mpiexec" -n 2 "$train" --config "$tmp/tiny.yaml" --out "$tmp/off2-${offload%%:*}" \
        optimizer.offload=${offload%%:*} optimizer.offload_layers=${offload#*:} \
        > "$tmp/off2.log" 2>&1 || fail "-n 2, offload $offload: $(cat "$tmp/off2.log")"
    for f in model.safetensors optimizer-00001-of-00002.safetensors \
        optimizer-00002-of-00002.safetensors; do
        cmp "$tmp/np2/checkpoints/step-00000003/$f" \
            "$tmp/off2-${offload%%:*}/checkpoints/step-00000003/$f" ||
            fail "-n 2: $f differs with offload $offload"
    done
done
# --data-parallel as one rank: MPI's communicator of one, a sharded
# checkpoint (one optimizer file) with the bytes of the ordered process.
"$mpiexec" -n 1 "$train" --config "$tmp/tiny.yaml" --out "$tmp/dp1" --data-parallel \
    > "$tmp/dp1.log" 2>&1 || fail "--data-parallel -n 1: $(cat "$tmp/dp1.log")"
grep -q "tiny.yaml, 1 rank; starting at step 0 of 3" "$tmp/dp1.log" ||
    fail "--data-parallel -n 1: the header names no rank: $(cat "$tmp/dp1.log")"
[ "$(ls "$tmp/dp1/checkpoints/step-00000003" | tr '\n' ' ')" = \
    "MANIFEST model.safetensors optimizer-00001-of-00001.safetensors user.bin " ] ||
    fail "--data-parallel -n 1: not a sharded checkpoint: $(ls "$tmp/dp1/checkpoints/step-00000003")"
cmp "$tmp/dp1/checkpoints/step-00000003/model.safetensors" "$tmp/np1/checkpoints/step-00000003/model.safetensors" ||
    fail "--data-parallel -n 1: model.safetensors differs from the ordered process's"
python3 "$(dirname "$0")/shards_equal_v1.py" "$tmp/dp1/checkpoints/step-00000003" \
    "$tmp/np1/checkpoints/step-00000003" > "$tmp/eq.log" 2>&1 ||
    fail "--data-parallel -n 1: optimizer state differs from -n 1: $(cat "$tmp/eq.log")"

# Rank 0 alone wrote the metrics: three steps, not six.
[ "$(grep -c '"step":' "$tmp/np2/metrics.jsonl")" -eq "$(grep -c '"step":' "$tmp/np1/metrics.jsonl")" ] ||
    fail "metrics of -n 2 differ in length from -n 1"
# --optimizer-settings config: every rank takes the configured lr after the
# resume (one that did not would update its range with the checkpoint's),
# so one step more at 2 ranks still gives the ordered process's bytes.
for n in 1 2; do
    ordered=
    [ $n -gt 1 ] || ordered=batch.accumulation=ordered
    "$mpiexec" -n $n "$train" --config "$tmp/tiny.yaml" --out "$tmp/np$n" $ordered --steps 4 \
        optimizer.lr=0.01 --optimizer-settings config > "$tmp/set$n.log" 2>&1 ||
        fail "-n $n, configured settings: $(cat "$tmp/set$n.log")"
    grep -q "replace the configured ones: lr 0.0003 (configured 0.01)" "$tmp/set$n.log" &&
        grep -q "settings are used (--optimizer-settings config)" "$tmp/set$n.log" ||
        fail "-n $n: the configured lr is not used: $(cat "$tmp/set$n.log")"
done
cmp "$tmp/np2/checkpoints/step-00000004/model.safetensors" \
    "$tmp/np1/checkpoints/step-00000004/model.safetensors" ||
    fail "--optimizer-settings config: -n 2's model differs from -n 1's after the resumed step"

# ---- A fast tier local to each node: one job of two app contexts, each in
# a working directory of its own ("nodes" A and B), the fast tier's path
# relative. Each node keeps its own rank's optimizer file (node A the
# weights besides); with the durable step 3 removed, a rerun resumes from
# the fast step 3 and trains to step 5, to the bytes of an uninterrupted
# 5-step run of two ranks.
mkdir "$tmp/A" "$tmp/B"
per_node() { # out-dir extra-args...
    o=$1
    shift
    "$mpiexec" -n 1 -wdir "$tmp/A" "$train" --config "$tmp/tiny.yaml" --out "$o" \
        checkpoint.fast_every=1 checkpoint.fast_dir=fast "$@" : \
        -n 1 -wdir "$tmp/B" "$train" --config "$tmp/tiny.yaml" --out "$o" \
        checkpoint.fast_every=1 checkpoint.fast_dir=fast "$@"
}
per_node "$tmp/pn" > "$tmp/pn.log" 2>&1 || fail "per-node fast tier: $(cat "$tmp/pn.log")"
grep -q "fast checkpoint directory fast is local to each node (2 directories)" "$tmp/pn.log" ||
    fail "per-node fast tier: not logged: $(cat "$tmp/pn.log")"
[ "$(ls "$tmp/A/fast/step-00000003" | tr '\n' ' ')" = \
    "MANIFEST model.safetensors optimizer-00001-of-00002.safetensors user.bin " ] ||
    fail "node A's fast step 3: $(ls "$tmp/A/fast/step-00000003")"
[ "$(ls "$tmp/B/fast/step-00000003" | tr '\n' ' ')" = "MANIFEST optimizer-00002-of-00002.safetensors " ] ||
    fail "node B's fast step 3: $(ls "$tmp/B/fast/step-00000003")"
cmp -s "$tmp/A/fast/step-00000003/MANIFEST" "$tmp/B/fast/step-00000003/MANIFEST" ||
    fail "the nodes' MANIFESTs differ"
rm -r "$tmp/pn/checkpoints/step-00000003"
# --start-over does not set aside node A's copies: a resume may load them.
rc=0
per_node "$tmp/pn" --start-over > "$tmp/pn.log" 2>&1 || rc=$?
[ $rc -ne 0 ] && grep -q "one node's copy of a checkpoint saved with a fast tier local to each node" \
    "$tmp/pn.log" || fail "per-node --start-over: exit $rc: $(cat "$tmp/pn.log")"
[ -d "$tmp/A/fast/step-00000003" ] || fail "per-node --start-over set aside node A's step 3"
per_node "$tmp/pn" train.steps=5 > "$tmp/pn.log" 2>&1 || fail "per-node resume: $(cat "$tmp/pn.log")"
grep -q "resumed from step 3 (fast tier)" "$tmp/pn.log" || fail "per-node resume: $(cat "$tmp/pn.log")"
"$mpiexec" -n 2 "$train" --config "$tmp/tiny.yaml" --out "$tmp/np2x5" train.steps=5 \
    > "$tmp/np2x5.log" 2>&1 || fail "-n 2, 5 steps: $(cat "$tmp/np2x5.log")"
for f in model.safetensors optimizer-00001-of-00002.safetensors optimizer-00002-of-00002.safetensors; do
    cmp "$tmp/pn/checkpoints/step-00000005/$f" "$tmp/np2x5/checkpoints/step-00000005/$f" ||
        fail "resumed from a per-node fast tier: $f differs from an uninterrupted run's"
done

# ---- A torchrun-style environment without an MPI launch is refused.
rc=0
WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
    "$train" --config "$tmp/tiny.yaml" --out "$tmp/torchrun" > /dev/null 2> "$tmp/err" || rc=$?
refused $rc 2 "MPI started this process alone" "WORLD_SIZE=2 without mpiexec"
refused $rc 2 "mpirun -n 2 llmt-train" "WORLD_SIZE=2 without mpiexec"
refused $rc 2 "torchrun cannot start it" "WORLD_SIZE=2 without mpiexec"
[ ! -e "$tmp/torchrun" ] || fail "the refused launch created --out"
# So are Slurm's and PMI's variables, read as such.
launch_refused "the environment (Slurm SLURM_STEP_NUM_TASKS=2, SLURM_PROCID=1) says 2 ranks, but MPI started this process alone" \
    SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=4 SLURM_PROCID=1 SLURM_LOCALID=1
launch_refused "the environment (Slurm SLURM_NTASKS=3, SLURM_PROCID=0) says 3 ranks" SLURM_NTASKS=3 SLURM_PROCID=0
launch_refused "the environment (MPICH/PMI PMI_SIZE=2, PMI_RANK=0) says 2 ranks" PMI_SIZE=2 PMI_RANK=0

# ---- Errors reach the user tagged with their rank.
: > "$tmp/file"
rc=0
"$mpiexec" -n 2 "$train" --config "$tmp/tiny.yaml" --out "$tmp/file/run" > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -ne 0 ] || fail "--out under a file: exit 0"
grep -q "^rank 0: llmt-train: cannot create $tmp/file: it exists and is not a directory" "$tmp/err" ||
    fail "rank 0's error: $(cat "$tmp/err")"
grep -q "^rank 1: llmt-train: preparing the run directory failed on another rank" "$tmp/err" ||
    fail "rank 1's error: $(cat "$tmp/err")"

# ---- Data-parallel on CUDA without a GPU (none visible): every rank opens
# its own device (its node-local rank, which the message names where the
# build has no plugin), fails with the backend's reason,
# and the job ends promptly.
rc=0
start=$(date +%s)
CUDA_VISIBLE_DEVICES=-1 timeout 60 "$mpiexec" -n 2 "$train" --config "$tmp/tiny.yaml" \
    --out "$tmp/cudadp" train.backend=cuda > /dev/null 2> "$tmp/err" || rc=$?
took=$(($(date +%s) - start))
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "CUDA under mpiexec -n 2, no GPU: exit $rc: $(cat "$tmp/err")"; fi
[ $took -le 30 ] || fail "CUDA under mpiexec -n 2, no GPU: took $took s"
for r in 0 1; do
    if [ "$have_cuda" = ON ]; then
        want="rank $r: llmt-train: context: CUDA error: llmt_context_create: CUDA backend: no usable device: "
    else
        want="rank $r: llmt-train: context: not supported: llmt_context_create: cfg->backend = CUDA (device $r), but this build of libllmt has no CUDA backend"
    fi
    grep -qF -- "$want" "$tmp/err" || fail "CUDA under mpiexec -n 2, no GPU: no '$want' in: $(cat "$tmp/err")"
done

# The pid of rank 1 of the job writing into --out $1.
rank1_pid() {
    for p in /proc/[0-9]*; do
        { tr '\0' '\n' < "$p/cmdline"; } 2>/dev/null | grep -qxF "$1" || continue
        { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qxE 'OMPI_COMM_WORLD_RANK=1|PMI_RANK=1' &&
            { echo "${p#/proc/}"; return; }
    done
}

# Starts a long two-rank job on --out $1 and waits for its first step.
start_long_job() {
    "$mpiexec" -n 2 "$train" --config "$tmp/tiny.yaml" --out "$1" --steps 1000000 \
        > "$1.log" 2> "$1.err" &
    job=$!
    n=0
    until grep -q '^step ' "$1.log" 2>/dev/null; do
        sleep 0.1
        n=$((n + 1))
        [ $n -lt 300 ] || fail "the two-rank job did not start: $(cat "$1.log" "$1.err")"
    done
    victim=$(rank1_pid "$1")
    [ -n "$victim" ] || fail "rank 1 of the job not found"
}

# Waits at most 60 s for the job; its exit status in $rc.
wait_job() {
    n=0
    while kill -0 "$job" 2>/dev/null; do
        sleep 0.1
        n=$((n + 1))
        [ $n -lt 600 ] || fail "the job still runs 60 s after $1"
    done
    rc=0
    wait "$job" || rc=$?
    job=
}

# ---- SIGTERM to rank 1 alone: the ranks agree to stop after one step,
# and rank 0 saves that step.
start_long_job "$tmp/term"
kill -TERM "$victim"
wait_job "SIGTERM"
[ $rc -eq 143 ] || fail "SIGTERM to rank 1: exit $rc, not 143: $(cat "$tmp/term.err")"
stopped=$(sed -n 's/^interrupted at step \([0-9]*\): checkpoint saved.*/\1/p' "$tmp/term.log")
[ -n "$stopped" ] || fail "no 'interrupted at step': $(tail -3 "$tmp/term.log")"
[ -d "$tmp/term/checkpoints/step-$(printf %08d "$stopped")" ] ||
    fail "no checkpoint of step $stopped: $(ls "$tmp/term/checkpoints")"

# ---- kill -9 of rank 1 mid-run: the job ends, naming the dead rank.
start_long_job "$tmp/kill"
kill -KILL "$victim"
wait_job "kill -9 of rank 1"
[ $rc -ne 0 ] || fail "kill -9 of rank 1: exit 0"
grep -q "process rank 1 with PID .* exited on signal 9" "$tmp/kill.err" ||
    fail "kill -9 of rank 1: the dead rank is not named: $(cat "$tmp/kill.err")"
echo "llmt-train under mpiexec: one stream, the losses of one rank, the same bytes at 2 and 3, agreed stop, dead rank named"
