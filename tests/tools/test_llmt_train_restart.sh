#!/bin/sh
# llmt-train run again on its directory, on a tiny model (also under the
# sanitizers):
# - --optimizer-settings: a resume keeps the checkpoint's optimizer settings
#   by default (the log names each one replaced, and how to take the
#   configuration's) and takes the configuration's with `config`. The lr each step used (metrics.jsonl) is
#   checked against the linear schedule computed here, which shows the
#   step count kept; the first resumed step's loss is the same either way
#   (weights, moments, data position untouched), the next one's is not; the
#   final checkpoint's MANIFEST holds the settings the run ended with; the
#   same settings again replace nothing; an lr below the checkpoint's
#   min_lr is taken (llmt_optimizer_set_settings sets them together).
# - memory.host_budget reaches the adaptive controller: a device budget
#   that the controller meets by offloading part of the optimizer's state
#   is met with a smaller micro-batch and nothing offloaded when the host
#   budget holds none of it; with ordered accumulation, whose sum makes a
#   smaller micro-batch heavier here, the controller takes the notch
#   predicted lowest and every step runs, saying once that it stays over
#   the threshold.
# - A failed start removes the default fast tier it created under /dev/shm
#   (then holding only the store's llmt.lock) and leaves one that existed,
#   and one the configuration names.
# Usage: test_llmt_train_restart.sh LLMT_TRAIN
set -eu
train=$1
tmp=$(mktemp -d)
fast_dirs=
trap 'rm -rf "$tmp" $fast_dirs' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

. "$(dirname "$0")/shard_v1.sh"
write_text_shard "$tmp/d"
cat > "$tmp/tiny.yaml" <<EOF
model: {vocab_size: 110, hidden_size: 16, num_layers: 1, num_heads: 2, num_kv_heads: 1,
        ffn_size: 32, max_seq_len: 4}
optimizer: {lr: 0.001}
schedule: {kind: linear, total_steps: 4, min_lr: 0}
batch: {batch_size: 2, micro_batch: 2, seq_len: 4}
data: {train: "$tmp/d/t_*.bin", val: "$tmp/d/t_*.bin"}
train: {steps: 2, eval_batches: 1, seed: 7, threads: 1}
checkpoint: {every: 0, fast_every: 1}
EOF

# FIELD of metrics.jsonl's record of step STEP in run directory DIR.
metric() { # dir step field
    sed -n "s/^{\"step\":$2,.*\"$3\":\([^,}]*\).*/\1/p" "$1/metrics.jsonl"
}
# Fails unless the lr of step STEP in DIR is WANT (to a relative 1e-9).
lr_is() { # dir step want
    got=$(metric "$1" "$2" lr)
    awk -v a="$got" -v b="$3" 'BEGIN { d = (a - b) / b; exit !(a != "" && d < 1e-9 && d > -1e-9) }' ||
        fail "$1: step $2 lr '$got', not $3"
}

# ---- Two steps at lr 0.001, linear to 0 at step 4: lr(s) = 0.001 (1 - s/4)
# for optimizer step s = 0, 1. No checkpoint yet: config changes nothing.
"$train" --config "$tmp/tiny.yaml" --out "$tmp/a" --optimizer-settings config \
    > "$tmp/a0.log" 2>&1 || fail "first run: $(cat "$tmp/a0.log")"
! grep -q "optimizer settings" "$tmp/a0.log" || fail "settings line without a resume: $(cat "$tmp/a0.log")"
lr_is "$tmp/a" 1 0.001
lr_is "$tmp/a" 2 0.00075
cp -r "$tmp/a" "$tmp/b"

# ---- Resumed to step 4 with lr 0.002, total_steps 8, min_lr 0.001 configured.
changed="optimizer.lr=0.002 schedule.total_steps=8 schedule.min_lr=0.001"
"$train" --config "$tmp/tiny.yaml" --out "$tmp/a" --steps 4 $changed \
    --optimizer-settings config > "$tmp/a.log" 2>&1 || fail "config resume: $(cat "$tmp/a.log")"
"$train" --config "$tmp/tiny.yaml" --out "$tmp/b" --steps 4 $changed > "$tmp/b.log" 2>&1 ||
    fail "default resume: $(cat "$tmp/b.log")"
for run in a b; do
    grep -q "resuming at step 2 of 4" "$tmp/$run.log" || fail "$run: no resume: $(cat "$tmp/$run.log")"
done
replaced="the checkpoint's optimizer settings replace the configured ones: lr 0.001 (configured 0.002), total_steps 4 (configured 8), min_lr 0 (configured 0.001)"
for run in a b; do
    grep -qF "$replaced" "$tmp/$run.log" || fail "$run: no replaced settings line: $(cat "$tmp/$run.log")"
done
grep -qxF "  the configured optimizer settings are used (--optimizer-settings config)" \
    "$tmp/a.log" || fail "config: no settings line: $(cat "$tmp/a.log")"
hint="  (--optimizer-settings config takes the configured ones)"
grep -qxF "$hint" "$tmp/b.log" || fail "default: no hint of the flag: $(cat "$tmp/b.log")"
! grep -qF "$hint" "$tmp/a.log" || fail "config: the hint of the flag given: $(cat "$tmp/a.log")"
! grep -q "configured optimizer settings are used" "$tmp/b.log" || fail "default applied the configuration's"
# config: 0.001 + 0.001 (1 - s/8) at s = 2, 3 (the step count kept, not
# restarted at 0); the checkpoint's: 0.001 (1 - s/4).
lr_is "$tmp/a" 3 0.00175
lr_is "$tmp/a" 4 0.001625
lr_is "$tmp/b" 3 0.0005
lr_is "$tmp/b" 4 0.00025
[ "$(metric "$tmp/a" 3 loss)" = "$(metric "$tmp/b" 3 loss)" ] ||
    fail "step 3 loss differs: $(metric "$tmp/a" 3 loss) vs $(metric "$tmp/b" 3 loss)"
[ "$(metric "$tmp/a" 4 loss)" != "$(metric "$tmp/b" 4 loss)" ] || fail "step 4 loss is the same"
grep -q '"lr":0.002,.*"total_steps":8,"min_lr":0.001,' "$tmp/a/checkpoints/step-00000004/MANIFEST" ||
    fail "config: the checkpoint does not hold lr 0.002, total_steps 8, min_lr 0.001"
grep -q '"lr":0.001,.*"total_steps":4,"min_lr":0,' "$tmp/b/checkpoints/step-00000004/MANIFEST" ||
    fail "default: the checkpoint does not hold lr 0.001, total_steps 4, min_lr 0"

# ---- The same settings again: none is replaced now.
"$train" --config "$tmp/tiny.yaml" --out "$tmp/a" --steps 5 $changed \
    --optimizer-settings config > "$tmp/a5.log" 2>&1 || fail "second config resume: $(cat "$tmp/a5.log")"
! grep -q "optimizer settings replace" "$tmp/a5.log" || fail "settings replaced: $(cat "$tmp/a5.log")"
grep -q "(--optimizer-settings config)" "$tmp/a5.log" || fail "no settings line: $(cat "$tmp/a5.log")"
lr_is "$tmp/a" 5 0.0015
# ---- An lr below the checkpoint's min_lr (0.001): never min_lr > lr on the way.
"$train" --config "$tmp/tiny.yaml" --out "$tmp/a" --steps 6 optimizer.lr=0.0005 \
    schedule.total_steps=8 schedule.min_lr=0.0001 --optimizer-settings config \
    > "$tmp/a6.log" 2>&1 || fail "lr below the checkpoint's min_lr: $(cat "$tmp/a6.log")"
lr_is "$tmp/a" 6 0.00025

# ---- The host budget caps the adaptive controller's offload. A device
# budget of 120000 bytes: after step 1 (peak over the threshold) the
# controller offloads the embedding's and layer 0's optimizer state; with a
# host budget of 1 byte it passes the offload over, says so, and halves the
# micro-batch instead, nothing in host memory.
"$train" --config "$tmp/tiny.yaml" --out "$tmp/h" --steps 2 memory.budget=120000 \
    > "$tmp/h.log" 2>&1 || fail "device budget: $(cat "$tmp/h.log")"
grep -q "escalating from .* optimizer state offloaded: embedding and layers 0-0; micro-batch 2\]" \
    "$tmp/h.log" || fail "device budget: no offload: $(cat "$tmp/h.log")"
"$train" --config "$tmp/tiny.yaml" --out "$tmp/h2" --steps 2 memory.budget=120000 \
    memory.host_budget=1 > "$tmp/h2.log" 2>&1 || fail "host budget: $(cat "$tmp/h2.log")"
grep -q "step 1: the host budget holds none of the optimizer state: the offload rungs above are passed over" \
    "$tmp/h2.log" || fail "host budget: no cap: $(cat "$tmp/h2.log")"
grep -q "escalating from .* to \[recompute full on layers 0-0; micro-batch 1\]" "$tmp/h2.log" ||
    fail "host budget: no smaller micro-batch: $(cat "$tmp/h2.log")"
! grep -q "offloaded" "$tmp/h2.log" || fail "host budget: an offload: $(cat "$tmp/h2.log")"
# With ordered accumulation a smaller micro-batch holds the fp32 sum of
# every gradient, more than it saves on this model: at 125000 bytes (peak
# 0.88, over the threshold) the controller takes the notch predicted lowest,
# full recompute at micro-batch 2, and every step runs (it used to escalate
# to micro-batch 1, whose sum did not fit: step 2 failed).
"$train" --config "$tmp/tiny.yaml" --out "$tmp/h3" --steps 3 memory.budget=125000 \
    memory.host_budget=1 batch.accumulation=ordered > "$tmp/h3.log" 2>&1 ||
    fail "ordered: $(cat "$tmp/h3.log")"
grep -q "to \[recompute full on layers 0-0; micro-batch 2\], predicted peak .*; no setting gets under the threshold: the one predicted lowest" \
    "$tmp/h3.log" || fail "ordered: not the lowest prediction: $(cat "$tmp/h3.log")"
grep -q "^step     3/3 .* micro-batch 2 " "$tmp/h3.log" || fail "ordered: $(cat "$tmp/h3.log")"
# Still over the threshold there, with nothing lower to move to: said once.
[ "$(grep -c "no heavier setting is predicted lower: staying at \[recompute full on layers 0-0; micro-batch 2\]" "$tmp/h3.log")" = 1 ] ||
    fail "ordered: not said once that it stays: $(cat "$tmp/h3.log")"

# ---- A failed start: --resume without a checkpoint fails after the store
# made the fast tier. Its name (from --out's real path) comes from a run that
# ends normally, which removes it too.
"$train" --config "$tmp/tiny.yaml" --out "$tmp/e" --steps 1 > "$tmp/e.log" 2>&1 ||
    fail "run on e: $(cat "$tmp/e.log")"
fast=$(sed -n 's/^fast tier: \(.*\), every 1 steps$/\1/p' "$tmp/e.log")
case "$fast" in /dev/shm/llmt-train-*) ;; *) fail "no default fast tier: $(cat "$tmp/e.log")" ;; esac
fast_dirs=$fast
[ ! -e "$fast" ] || fail "$fast left after a finished run"
rm -r "$tmp/e/checkpoints"
if "$train" --config "$tmp/tiny.yaml" --out "$tmp/e" --resume > "$tmp/e1.log" 2>&1; then
    fail "--resume without a checkpoint succeeded"
fi
grep -q -- "--resume: no checkpoint in" "$tmp/e1.log" || fail "--resume: $(cat "$tmp/e1.log")"
[ ! -e "$fast" ] || fail "a failed start left $fast: $(ls -A "$fast")"
# One that existed before the run is left.
mkdir "$fast"
if "$train" --config "$tmp/tiny.yaml" --out "$tmp/e" --resume > "$tmp/e2.log" 2>&1; then
    fail "--resume without a checkpoint succeeded (existing fast tier)"
fi
[ -d "$fast" ] || fail "a failed start removed $fast, which existed before it"
# A fast tier the configuration names is never removed, even one this run made.
if "$train" --config "$tmp/tiny.yaml" --out "$tmp/e" --resume checkpoint.fast_dir="$tmp/named" \
    > "$tmp/e3.log" 2>&1; then
    fail "--resume without a checkpoint succeeded (named fast tier)"
fi
[ -d "$tmp/named" ] || fail "a failed start removed the named fast tier $tmp/named"
echo "ok: --optimizer-settings checkpoint (default) and config on a resume (lr per step, losses, checkpoint settings, log lines); memory.host_budget caps the controller's offload; a failed start removes the fast tier it made, keeps one that existed"
