#!/bin/sh
# llmt-train's default corpus (no data.train): it tokenizes every regular
# file, not the links, of /usr/share/common-licenses and every
# /usr/share/doc/*/copyright, counted here independently with the shell's
# own globs, and trains on it. In the sanitizer build LeakSanitizer also
# checks that none of glob's entries is lost (exit status non-zero if so).
# Usage: test_llmt_train_default_corpus.sh LLMT_TRAIN
set -eu
train=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

n=0
for f in /usr/share/common-licenses/* /usr/share/doc/*/copyright; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then n=$((n + 1)); fi
done
[ "$n" -gt 0 ] || fail "this system has no licence texts to count"
cat > "$tmp/tiny.yaml" <<YAML
model: {vocab_size: 257, hidden_size: 16, num_layers: 1, num_heads: 2, num_kv_heads: 1,
        ffn_size: 32, max_seq_len: 4}
batch: {batch_size: 2, micro_batch: 2, seq_len: 4}
train: {steps: 1, eval_batches: 1, seed: 7, threads: 1}
checkpoint: {every: 0, fast_every: 0}
YAML
if ! "$train" --config "$tmp/tiny.yaml" --out "$tmp/run" > "$tmp/out" 2>&1; then
    cat "$tmp/out"
    fail "llmt-train on the default corpus failed"
fi
grep -q "^tokenized $n files " "$tmp/out" ||
    { cat "$tmp/out"; fail "expected 'tokenized $n files' (the regular files)"; }
grep -q "^final held-out loss" "$tmp/out" || { cat "$tmp/out"; fail "no final held-out loss"; }
echo "PASS: the default corpus is the $n regular licence files"
