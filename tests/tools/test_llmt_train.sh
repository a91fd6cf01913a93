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
# The fast tier of each run lives in /dev/shm under a name llmt-train
# prints; a run that ends removes it, the trap covers the ones that fail.
fast_dirs() { sed -n 's/^fast tier: \(.*\), every.*/\1/p' "$tmp"/*.log 2>/dev/null; }
trap 'fast_dirs | while read -r d; do rm -rf "$d"; done; rm -rf "$tmp"' EXIT
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

# Killed part-way: once step 15 is in the metrics and the step-10 fast
# checkpoint is committed (its directory has its final name), SIGKILL.
"$train" --out "$tmp/killed" --steps $steps > "$tmp/killed1.log" 2>&1 &
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
"$train" --out "$tmp/killed" --steps $steps > "$tmp/killed2.log" 2>&1 ||
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
echo "ok: learned ($final < $entropy nats); killed, resumed ($(grep -o 'resuming at step [0-9]*' "$tmp/killed2.log")), identical final state"
