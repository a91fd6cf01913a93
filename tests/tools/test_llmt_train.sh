#!/bin/sh
# llmt-train end to end, default configuration, a short run: it learns
# (held-out loss below the byte unigram entropy it reports), and a run killed
# with SIGKILL part-way and started again resumes and ends with weights and
# optimizer state byte-identical to an uninterrupted run's. SIGTERM saves and
# stops, and also at start-up; the lock on --out; an empty configuration on
# the default corpus; checkpoints none of which verifies, and --start-over
# (which sets them aside); --no-resume's rule for what is a checkpoint.
# Usage: test_llmt_train.sh LLMT_TRAIN
set -eu
train=$1
steps=30
tmp=$(mktemp -d)
# The fast tier of each run lives in /dev/shm under a name llmt-train
# prints; a run that ends removes it, the trap covers the ones that fail.
fast_dirs() { sed -n 's/^fast tier: \(.*\), every.*/\1/p' "$tmp"/*.log 2>/dev/null; }
trap 'fast_dirs | while read -r d; do rm -rf "$d"; done; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# The runs whose held-out loss nothing reads evaluate one batch, not the
# default 4 (the straight run's, which the learning check reads): the final
# evaluation comes after the final save, so no checkpoint byte changes.
one_eval=train.eval_batches=1

"$train" --out "$tmp/straight" --steps $steps > "$tmp/straight.log" 2>&1 ||
    fail "uninterrupted run: $(tail -5 "$tmp/straight.log")"
grep -q "starting at step 0 of $steps" "$tmp/straight.log" || fail "no start line"
entropy=$(sed -n 's/.*held-out text \([0-9.]*\) nats.*/\1/p' "$tmp/straight.log")
final=$(sed -n 's/^final held-out loss \([0-9.]*\) nats/\1/p' "$tmp/straight.log")
[ -n "$entropy" ] && [ -n "$final" ] || fail "no entropy or final loss: $(cat "$tmp/straight.log")"
awk -v f="$final" -v h="$entropy" 'BEGIN { exit !(f < h) }' ||
    fail "held-out loss $final is not below the unigram entropy $entropy after $steps steps"
grep -q "^sample: The " "$tmp/straight.log" || fail "no sample"

# Killed part-way: once step 15 is in the metrics and the step-10 fast
# checkpoint is committed (its directory has its final name), SIGKILL.
"$train" --out "$tmp/killed" --steps $steps $one_eval > "$tmp/killed1.log" 2>&1 &
pid=$!
steps_logged() {
    c=$(grep -c '^{"step":' "$tmp/killed/metrics.jsonl" 2>/dev/null || true)
    echo "${c:-0}"
}
fast_committed() {
    d=$(sed -n 's/^fast tier: \(.*\), every.*/\1/p' "$tmp/killed1.log")
    [ -n "$d" ] && [ -d "$d/step-00000010" ]
}
n=0
while [ "$(steps_logged)" -lt 15 ] || ! fast_committed; do
    sleep 0.2
    n=$((n + 1))
    [ $n -lt 1500 ] || { kill -9 $pid; fail "no progress"; }
done
kill -9 $pid
wait $pid 2>/dev/null || true
[ ! -d "$tmp/killed/checkpoints/step-$(printf %08d $steps)" ] || fail "finished before the kill"
"$train" --out "$tmp/killed" --steps $steps $one_eval > "$tmp/killed2.log" 2>&1 ||
    fail "resumed run: $(tail -5 "$tmp/killed2.log")"
grep -q "resuming at step" "$tmp/killed2.log" || fail "did not resume: $(head -5 "$tmp/killed2.log")"
for d in $(fast_dirs); do
    case $d in /dev/shm/llmt-train-*) ;; *) fail "fast tier outside /dev/shm: $d" ;; esac
    [ ! -e "$d" ] || fail "the fast tier $d is left behind after the run ended"
done
[ "$(fast_dirs | sort -u | wc -l)" -eq 2 ] || fail "expected two fast tiers: $(fast_dirs)"

last=$(printf 'step-%08d' $steps)
for f in model.safetensors optimizer.safetensors user.bin; do
    cmp "$tmp/straight/checkpoints/$last/$f" "$tmp/killed/checkpoints/$last/$f" ||
        fail "$f differs after the kill and resume"
done

# SIGTERM (what Slurm and Kubernetes send) saves and stops like SIGINT:
# exit 143, a committed checkpoint, and the next run resumes from it. While
# the run holds --out, a second llmt-train on it fails at once naming its
# pid. (The data of the straight run, through KEY=VALUE overrides.)
data="data.train=$tmp/straight/data/text_train_*.bin data.val=$tmp/straight/data/text_val_*.bin"
# shellcheck disable=SC2086 # $data is two words
"$train" --out "$tmp/termed" --steps $steps $data $one_eval > "$tmp/termed1.log" 2>&1 &
pid=$!
n=0
until grep -q '^{"step":3,' "$tmp/termed/metrics.jsonl" 2>/dev/null; do
    sleep 0.2
    n=$((n + 1))
    kill -0 $pid 2>/dev/null || fail "the SIGTERM run ended early: $(tail -3 "$tmp/termed1.log")"
    [ $n -lt 1500 ] || { kill -9 $pid; fail "no progress (SIGTERM run)"; }
done
# shellcheck disable=SC2086
if "$train" --out "$tmp/termed" --steps $steps $data > "$tmp/second.log" 2>&1; then
    fail "a second llmt-train ran on a locked --out"
fi
grep -q "is in use by another llmt-train (pid $pid" "$tmp/second.log" ||
    fail "second run: $(cat "$tmp/second.log")"
kill -TERM $pid
rc=0
wait $pid || rc=$?
[ $rc -eq 143 ] || fail "SIGTERM: exit $rc, not 143: $(tail -3 "$tmp/termed1.log")"
at=$(sed -n 's/^interrupted at step \([0-9]*\): checkpoint saved.*/\1/p' "$tmp/termed1.log")
[ -n "$at" ] || fail "SIGTERM: no checkpoint saved: $(tail -3 "$tmp/termed1.log")"
[ -f "$tmp/termed/checkpoints/$(printf 'step-%08d' "$at")/MANIFEST" ] || fail "step $at not committed"
# shellcheck disable=SC2086
"$train" --out "$tmp/termed" --steps $((at + 1)) $data $one_eval > "$tmp/termed2.log" 2>&1 ||
    fail "after SIGTERM: $(tail -5 "$tmp/termed2.log")"
grep -q "resuming at step $at of $((at + 1))" "$tmp/termed2.log" ||
    fail "did not resume from step $at: $(head -5 "$tmp/termed2.log")"

# A signal during start-up (here: as soon as the run holds --out, while the
# corpus is tokenized) stops the run cleanly before training instead of
# killing it. Should a very fast machine have begun training by then, the
# run must still stop cleanly, with a saved checkpoint.
"$train" --out "$tmp/early" --steps 3 > "$tmp/early.log" 2>&1 &
pid=$!
n=0
until [ -s "$tmp/early/.llmt-train.lock" ]; do
    sleep 0.01
    n=$((n + 1))
    [ $n -lt 3000 ] || { kill -9 $pid; fail "SIGTERM in start-up: --out never locked"; }
done
kill -TERM $pid
rc=0
wait $pid || rc=$?
[ $rc -eq 143 ] || fail "SIGTERM in start-up: exit $rc, not 143: $(cat "$tmp/early.log")"
if grep -q "^llmt-train: .* at step 0 of 3" "$tmp/early.log"; then
    grep -q "^interrupted at step [0-9]*: checkpoint saved" "$tmp/early.log" ||
        fail "SIGTERM after start-up: $(cat "$tmp/early.log")"
    rm -r "$tmp/early/checkpoints" # the checks below start from no checkpoint
else
    grep -q "^interrupted before training started: nothing trained" "$tmp/early.log" ||
        fail "SIGTERM in start-up: $(cat "$tmp/early.log")"
    [ ! -d "$tmp/early/checkpoints/step-00000000" ] || fail "saved after a start-up signal"
fi

# An empty configuration trains on the default corpus (the defaults'
# vocabulary holds the byte tokenizer's 257 ids).
: > "$tmp/empty.yaml"
"$train" --config "$tmp/empty.yaml" --out "$tmp/early" --steps 3 > "$tmp/empty.log" 2>&1 ||
    fail "empty config: $(tail -5 "$tmp/empty.log")"
grep -q "starting at step 0 of 3" "$tmp/empty.log" || fail "empty config: $(head -5 "$tmp/empty.log")"
if "$train" --config "$tmp/empty.yaml" --out "$tmp/v256" model.vocab_size=256 --steps 3 \
    > "$tmp/v256.log" 2>&1; then fail "vocab 256 on the byte corpus accepted"; fi
grep -q "model.vocab_size = 256 is below 257" "$tmp/v256.log" || fail "vocab 256: $(cat "$tmp/v256.log")"
[ ! -e "$tmp/v256" ] || fail "vocab 256: made --out before refusing"

# Checkpoints none of which verify: an error naming each and why, and the
# directory untouched; --start-over trains from step 0 over them; it is
# refused once a checkpoint verifies.
ck="$tmp/early/checkpoints/step-00000003"
printf 'XXXX' | dd of="$ck/model.safetensors" bs=1 seek=$(($(wc -c < "$ck/model.safetensors") - 64)) \
    conv=notrunc 2>/dev/null
cp "$ck/model.safetensors" "$tmp/corrupt.safetensors"
if "$train" --config "$tmp/empty.yaml" --out "$tmp/early" --steps 3 > "$tmp/bad.log" 2>&1; then
    fail "ran over checkpoints none of which verifies: $(cat "$tmp/bad.log")"
fi
grep -q "step-00000003" "$tmp/bad.log" && grep -q -- "--start-over" "$tmp/bad.log" ||
    fail "invalid checkpoints: $(cat "$tmp/bad.log")"
cmp -s "$ck/model.safetensors" "$tmp/corrupt.safetensors" || fail "the invalid checkpoint was touched"
"$train" --config "$tmp/empty.yaml" --out "$tmp/early" --steps 3 --start-over $one_eval \
    > "$tmp/over.log" 2>&1 ||
    fail "--start-over: $(tail -5 "$tmp/over.log")"
grep -q "starting at step 0 of 3" "$tmp/over.log" || fail "--start-over: $(head -5 "$tmp/over.log")"
# ... having set the invalid one aside, byte for byte, under a name no scan takes.
aside=$(ls -d "$ck".refused-* 2>/dev/null | head -1)
[ -n "$aside" ] && cmp -s "$aside/model.safetensors" "$tmp/corrupt.safetensors" ||
    fail "--start-over did not set the invalid checkpoint aside: $(ls "$tmp/early/checkpoints")"
grep -q "1 invalid checkpoint set aside" "$tmp/over.log" || fail "--start-over: $(head -5 "$tmp/over.log")"
if "$train" --config "$tmp/empty.yaml" --out "$tmp/early" --steps 3 --start-over > "$tmp/over2.log" 2>&1; then
    fail "--start-over accepted over a valid checkpoint"
fi
grep -q "checkpoint of step 3 in .* is valid" "$tmp/over2.log" || fail "--start-over: $(cat "$tmp/over2.log")"

# --no-resume takes for a checkpoint exactly what the store does: a
# directory step-foo is not one, step-00000007 (empty, invalid) is.
mkdir -p "$tmp/nr/checkpoints/step-foo"
"$train" --config "$tmp/empty.yaml" --out "$tmp/nr" --steps 1 --no-resume $one_eval > "$tmp/nr.log" 2>&1 ||
    fail "--no-resume refused over step-foo: $(tail -3 "$tmp/nr.log")"
mkdir -p "$tmp/nr2/checkpoints/step-00000007"
if "$train" --config "$tmp/empty.yaml" --out "$tmp/nr2" --steps 1 --no-resume > "$tmp/nr2.log" 2>&1; then
    fail "--no-resume accepted over a checkpoint directory"
fi
grep -q "already has checkpoints" "$tmp/nr2.log" || fail "--no-resume: $(cat "$tmp/nr2.log")"

echo "ok: learned ($final < $entropy nats); killed, resumed ($(grep -o 'resuming at step [0-9]*' "$tmp/killed2.log")), identical final state"
