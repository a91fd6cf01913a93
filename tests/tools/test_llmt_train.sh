#!/bin/sh
# llmt-train end to end, default configuration, a short run: it learns
# (held-out loss below the byte unigram entropy it reports), and a run killed
# with SIGKILL part-way and started again resumes and ends with weights and
# optimizer state byte-identical to an uninterrupted run's.
# Usage: test_llmt_train.sh LLMT_TRAIN
set -eu
train=$1
steps=40
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -rf /dev/shm/llmt-train-*-test-$$ 2>/dev/null || true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$train" --out "$tmp/straight" --steps $steps > "$tmp/straight.log" 2>&1 ||
    fail "uninterrupted run: $(tail -5 "$tmp/straight.log")"
grep -q "starting at step 0 of $steps" "$tmp/straight.log" || fail "no start line"
entropy=$(sed -n 's/.*held-out text \([0-9.]*\) nats.*/\1/p' "$tmp/straight.log")
final=$(sed -n 's/^final held-out loss \([0-9.]*\) nats/\1/p' "$tmp/straight.log")
[ -n "$entropy" ] && [ -n "$final" ] || fail "no entropy or final loss: $(cat "$tmp/straight.log")"
awk -v f="$final" -v h="$entropy" 'BEGIN { exit !(f < h) }' ||
    fail "held-out loss $final is not below the unigram entropy $entropy after $steps steps"
grep -q "^sample: The " "$tmp/straight.log" || fail "no sample"

# Killed part-way: wait for step 15 in the metrics, then SIGKILL.
"$train" --out "$tmp/killed" --steps $steps > "$tmp/killed1.log" 2>&1 &
pid=$!
steps_logged() {
    c=$(grep -c '^{"step":' "$tmp/killed/metrics.jsonl" 2>/dev/null || true)
    echo "${c:-0}"
}
n=0
while [ "$(steps_logged)" -lt 15 ]; do
    sleep 0.2
    n=$((n + 1))
    [ $n -lt 1500 ] || { kill -9 $pid; fail "no progress"; }
done
kill -9 $pid
wait $pid 2>/dev/null || true
[ ! -d "$tmp/killed/checkpoints/step-$(printf %08d $steps)" ] || fail "finished before the kill"
"$train" --out "$tmp/killed" --steps $steps > "$tmp/killed2.log" 2>&1 ||
    fail "resumed run: $(tail -5 "$tmp/killed2.log")"
grep -q "resuming at step" "$tmp/killed2.log" || fail "did not resume: $(head -5 "$tmp/killed2.log")"

last=$(printf 'step-%08d' $steps)
for f in model.safetensors optimizer.safetensors user.bin; do
    cmp "$tmp/straight/checkpoints/$last/$f" "$tmp/killed/checkpoints/$last/$f" ||
        fail "$f differs after the kill and resume"
done
echo "ok: learned ($final < $entropy nats); killed, resumed ($(grep -o 'resuming at step [0-9]*' "$tmp/killed2.log")), identical final state"
