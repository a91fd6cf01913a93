#!/bin/sh
# llmt-train's command line and edges, on a tiny model and hand-made shards
# (fast enough for the sanitizer build, where it also runs):
# strict flags (exit 2, the flag and value named, "did you mean"), --help,
# --version, KEY=VALUE overrides checked like the file, a nested --out made
# with its parents, the lock on --out naming the holder's pid, --config
# refusing a FIFO and a second YAML document, the sampler within the
# logits of a 110-token vocabulary (ASan) and over byte tokens only for a
# larger one, its output escaped to valid UTF-8, and the final held-out
# loss in metrics.jsonl.
# Usage: test_llmt_train_cli.sh LLMT_TRAIN SOURCE_DIR
set -eu
train=$1
src=$2
tmp=$(mktemp -d)
holder=
trap '[ -z "$holder" ] || kill "$holder" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A version-1 shard (docs/data.md) of the bytes of text $2 as tokens: the
# header is magic 20240520, version 1, the count, zeros; UTF-16LE of ASCII
# is each byte as a little-endian uint16.
. "$(dirname "$0")/shard_v1.sh"
text=""
for i in 1 2 3 4 5 6 7 8; do text="${text}a bad cab fed a deaf jade bead; mama hid a ham. "; done
mkdir "$tmp/d"
write_shard "$tmp/d/t_000000.bin" "$text"
[ "$(wc -c < "$tmp/d/t_000000.bin")" -eq $((1024 + 2 * ${#text})) ] || fail "shard size"
cat > "$tmp/tiny.yaml" <<EOF
model: {vocab_size: 110, hidden_size: 16, num_layers: 1, num_heads: 2, num_kv_heads: 1,
        ffn_size: 32, max_seq_len: 4}
batch: {batch_size: 2, micro_batch: 2, seq_len: 4}
data: {train: "$tmp/d/t_*.bin", val: "$tmp/d/t_*.bin"}
train: {steps: 2, eval_batches: 1, seed: 7, threads: 1}
checkpoint: {every: 0, fast_every: 0}
EOF

# ---- Usage errors: exit 2, one line naming the flag and the value.
usage_error() { # expected-message args...
    want=$1
    shift
    if "$train" "$@" > "$tmp/out" 2> "$tmp/err"; then fail "accepted: $*"; else rc=$?; fi
    [ $rc -eq 2 ] || fail "$*: exit $rc, not 2: $(cat "$tmp/err")"
    grep -qF -- "$want" "$tmp/err" || fail "$*: no '$want' in: $(cat "$tmp/err")"
    [ ! -e "$tmp/nothing" ] || fail "$*: created --out"
}
usage_error "unknown option --stesp; did you mean --steps?" --stesp 3 --out "$tmp/nothing"
usage_error "--steps abc: not an integer" --steps abc --out "$tmp/nothing"
usage_error "--steps -5: out of range" --steps -5 --out "$tmp/nothing"
usage_error "--steps 1e3: not an integer" --steps 1e3 --out "$tmp/nothing"
usage_error "--steps 99999999999999999999: out of range" --steps 99999999999999999999 --out "$tmp/nothing"
usage_error "--steps needs a value" --out "$tmp/nothing" --steps
usage_error "--steps given twice" --steps 1 --steps 2 --out "$tmp/nothing"
usage_error "--fail-wait 0: out of range" --fail-wait 0 --out "$tmp/nothing"
usage_error "--resume and --no-resume cannot be given together" --resume --no-resume --out "$tmp/nothing"
usage_error "--resume takes no value" --resume=yes --out "$tmp/nothing"
usage_error "unexpected argument 'steps'" steps --out "$tmp/nothing"
usage_error "--optimizer-settings conf: neither checkpoint nor config" --optimizer-settings conf --out "$tmp/nothing"
usage_error "override optimizer.lr: 'fast' is not a number" optimizer.lr=fast --out "$tmp/nothing"
usage_error "override optimizer.lrr: unknown key" optimizer.lrr=1 --out "$tmp/nothing"
usage_error "override batch.batch_size: 0 is outside 1..1048576" batch.batch_size=0 --out "$tmp/nothing"

"$train" --help > "$tmp/help" || fail "--help exits $?"
grep -q "^usage: llmt-train" "$tmp/help" || fail "--help: $(cat "$tmp/help")"
version=$(sed -n 's/^#define LLMT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
    "$src/include/llmt/version.h" | paste -sd.)
[ "$("$train" --version)" = "llmt-train $version" ] || fail "--version: $("$train" --version)"

# ---- --config refuses a FIFO (it used to block in open) and a file whose
# second YAML document would be ignored.
mkfifo "$tmp/fifo.yaml"
if timeout 20 "$train" --config "$tmp/fifo.yaml" --out "$tmp/fifo" > /dev/null 2> "$tmp/err"; then
    fail "a FIFO config was accepted"
fi
grep -q "fifo.yaml: a FIFO, not a regular file" "$tmp/err" || fail "FIFO: $(cat "$tmp/err")"
{ cat "$tmp/tiny.yaml"; printf -- '---\ntrain: {steps: 5}\n'; } > "$tmp/two.yaml"
if "$train" --config "$tmp/two.yaml" --out "$tmp/two" > /dev/null 2> "$tmp/err"; then
    fail "a second YAML document was accepted"
fi
grep -q "two.yaml:$(($(wc -l < "$tmp/tiny.yaml") + 1)):1: a second YAML document" "$tmp/err" || fail "two documents: $(cat "$tmp/err")"

# ---- A tiny run: vocabulary 110, sequences of 4, in a nested --out made
# with its parents; overrides land in the checkpoint's configuration.
out="$tmp/runs/deep/tiny"
"$train" --config "$tmp/tiny.yaml" --out "$out" optimizer.lr=0.00123 checkpoint.keep=2 \
    > "$tmp/tiny.log" 2>&1 || fail "tiny run: $(cat "$tmp/tiny.log")"
grep -q '"lr":0.00123' "$out/checkpoints/step-00000002/MANIFEST" || fail "lr override not applied"
grep -q '"vocab_size":110' "$out/checkpoints/step-00000002/MANIFEST" || fail "no vocab 110"
final=$(sed -n 's/^final held-out loss \([0-9.]*\) nats/\1/p' "$tmp/tiny.log")
[ -n "$final" ] || fail "no final loss: $(cat "$tmp/tiny.log")"
# The final held-out loss is the last record of metrics.jsonl.
tail -1 "$out/metrics.jsonl" | grep -q '^{"event":"final_eval","step":2,"eval_loss":[0-9.e-]*}$' ||
    fail "no final_eval record: $(tail -1 "$out/metrics.jsonl")"
logged=$(tail -1 "$out/metrics.jsonl" | sed 's/.*"eval_loss":\([0-9.e-]*\)}/\1/')
awk -v a="$logged" -v b="$final" 'BEGIN { d = a - b; exit !(d < 0.00005 && d > -0.00005) }' ||
    fail "metrics final loss $logged, printed $final"
# The sample is valid UTF-8 with no control byte: those are escaped.
grep '^sample: The ' "$tmp/tiny.log" > "$tmp/sample" || fail "no sample"
iconv -f UTF-8 -t UTF-8 "$tmp/sample" > /dev/null || fail "sample is not valid UTF-8"
[ "$(tr -d '\n' < "$tmp/sample" | tr -d '\000-\037\177' | wc -c)" -eq \
  "$(tr -d '\n' < "$tmp/sample" | wc -c)" ] || fail "control bytes in the sample"

# A vocabulary larger than the bytes: only byte tokens are sampled, and
# bytes 0x80.. come out escaped (an untrained model draws them).
"$train" --config "$tmp/tiny.yaml" --out "$tmp/v300" model.vocab_size=300 \
    model.max_seq_len=8 train.steps=1 > "$tmp/v300.log" 2>&1 || fail "vocab 300: $(cat "$tmp/v300.log")"
grep '^sample: The ' "$tmp/v300.log" > "$tmp/sample" || fail "no sample (vocab 300)"
iconv -f UTF-8 -t UTF-8 "$tmp/sample" > /dev/null || fail "sample (vocab 300) is not valid UTF-8"
grep -q '\\x[89a-f][0-9a-f]' "$tmp/sample" || fail "no escaped high byte: $(cat "$tmp/sample")"

# ---- The lock: while another process holds OUT/.llmt-train.lock, a run
# on OUT fails at once naming its pid, and touches nothing.
mkdir "$tmp/locked"
# The helper locks the file on descriptor 9, writes its pid as llmt-train
# does, and becomes a sleep that keeps the descriptor (and the lock).
sh -c 'exec 9>> "$1" && flock 9 && echo $$ > "$1" && exec sleep 60' sh \
    "$tmp/locked/.llmt-train.lock" > /dev/null 2>&1 &
holder=$!
n=0
while flock -n "$tmp/locked/.llmt-train.lock" true; do
    sleep 0.1
    n=$((n + 1))
    [ $n -lt 100 ] || fail "the helper did not take the lock"
done
if "$train" --config "$tmp/tiny.yaml" --out "$tmp/locked" > /dev/null 2> "$tmp/err"; then
    fail "ran on a locked directory"
fi
grep -q "is in use by another llmt-train (pid $holder" "$tmp/err" || fail "lock: $(cat "$tmp/err")"
[ "$(ls -A "$tmp/locked")" = ".llmt-train.lock" ] || fail "touched the locked directory"
kill "$holder"
wait "$holder" 2>/dev/null || true
holder=

# ---- --no-resume refuses a directory with checkpoints, but a plain file
# named like one is not a checkpoint (the store ignores it too).
mkdir -p "$tmp/stray/checkpoints"
: > "$tmp/stray/checkpoints/step-00000035"
"$train" --config "$tmp/tiny.yaml" --out "$tmp/stray" --no-resume > "$tmp/stray.log" 2>&1 ||
    fail "--no-resume with a stray file: $(cat "$tmp/stray.log")"
if "$train" --config "$tmp/tiny.yaml" --out "$tmp/stray" --no-resume > /dev/null 2> "$tmp/err"; then
    fail "--no-resume accepted a directory with checkpoints"
fi
grep -q -- "--no-resume, but" "$tmp/err" || fail "--no-resume: $(cat "$tmp/err")"
echo "ok: strict flags, --help, --version, overrides, nested --out, lock, FIFO and multi-document configs refused, sampler within vocab, escaped sample, final_eval record, --no-resume past a stray file"
