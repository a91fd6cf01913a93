#!/bin/sh
# llmt-generate and llmt-eval against a fixture (generate_fixture.c) whose
# expected tokens and losses come from full recomputes through the library:
# greedy ids from a checkpoint (newest, --step), a safetensors file and a
# Hugging Face directory; the printed text against Python's own UTF-8
# decoding of those ids; seeds, --top-k 1, --stop-token; the tokenizer.json
# and vocab_size refusals; strict --prompt-tokens; a cache of the call's size
# (a 2^20-position model under a data limit); eval's loss, perplexity and
# window count, at most one pass, --hf's default --seq-len; usage and load
# errors.
# Usage: test_llmt_generate.sh LLMT_GENERATE LLMT_EVAL GENERATE_FIXTURE
set -eu
gen=$1
ev=$2
fixture=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# run TOOL ARGS...: $status, $tmp/out, $tmp/err hold the result.
run() {
    status=0
    "$@" > "$tmp/out" 2> "$tmp/err" || status=$?
}
expect_status() { [ "$status" = "$1" ] || fail "$2: status $status, want $1: $(cat "$tmp/err")"; }
expect_err() { grep -q -- "$1" "$tmp/err" || fail "stderr lacks '$1': $(cat "$tmp/err")"; }

"$fixture" "$tmp/f"
f=$tmp/f
A=$(cat "$f/greedy_a.ids")
B=$(cat "$f/greedy_b.ids")
[ "$A" != "$B" ] || fail "the fixture's two models agree"

# Greedy ids: the checkpoint's newest step is B, step 1 is A.
run "$gen" --checkpoint "$f/ckpt" --prompt ab --max-tokens 12 --temperature 0 --print-ids
expect_status 0 "newest checkpoint"
[ "$(cat "$tmp/out")" = "$B" ] || fail "newest checkpoint: $(cat "$tmp/out"), want $B"
run "$gen" --checkpoint "$f/ckpt" --step 1 --prompt ab --max-tokens 12 --temperature 0 --print-ids
[ "$(cat "$tmp/out")" = "$A" ] || fail "--step 1: $(cat "$tmp/out"), want $A"
run "$gen" --model "$f/model_a.safetensors" --prompt ab --max-tokens 12 --temperature 0 --print-ids
[ "$(cat "$tmp/out")" = "$A" ] || fail "--model: $(cat "$tmp/out"), want $A"
run "$gen" --hf "$f/hf" --prompt-tokens 97,98 --max-tokens 12 --temperature 0 --print-ids
[ "$(cat "$tmp/out")" = "$B" ] || fail "--hf: $(cat "$tmp/out"), want $B"
# top-k 1 at temperature 1 is greedy; the default max-tokens fills the context (16 - 2).
run "$gen" --hf "$f/hf" --prompt ab --top-k 1 --seed 7 --print-ids
[ "$(cat "$tmp/out" | cut -d, -f1-12)" = "$B" ] || fail "--top-k 1: $(cat "$tmp/out")"
[ "$(tr ',' '\n' < "$tmp/out" | wc -l)" = 14 ] || fail "default max-tokens: $(cat "$tmp/out")"

# Text: the ids' bytes, printed as Python decodes and escapes them; the
# end-of-text token (256) prints nothing, a larger id <|N|>.
cat > "$tmp/decode.py" <<'PY'
import sys
ids = [int(t) for t in sys.argv[1].split(",")]
pieces = [[]]  # runs of bytes, and the <|N|> marks between them
for i in ids:
    if i < 256:
        pieces[-1].append(i) if isinstance(pieces[-1], list) else pieces.append([i])
    else:
        pieces.append("" if i == 256 else "<|%d|>" % i)
out = []
for p in pieces:
    if isinstance(p, str):
        out.append(p)
        continue
    for ch in bytes(p).decode("utf-8", errors="surrogateescape"):
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            out.append("\\x%02x" % (o - 0xDC00))
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif 0x80 <= o < 0xA0:
            out.append("\\xc2\\x%02x" % o)
        else:
            out.append(ch)
want = "".join(out) + "\n"
got = open(sys.argv[2], encoding="utf-8", errors="surrogateescape").read()
if got != want:
    sys.exit("got %r, want %r" % (got, want))
PY
run "$gen" --hf "$f/hf" --prompt ab --max-tokens 12 --temperature 0
expect_status 0 "text"
python3 "$tmp/decode.py" "$B" "$tmp/out" || fail "printed text differs from the decoded ids"

# Sampling: a seed repeats itself; the stop token ends the output after it.
run "$gen" --hf "$f/hf" --prompt ab --max-tokens 12 --temperature 1.5 --seed 3 --print-ids
s1=$(cat "$tmp/out")
run "$gen" --hf "$f/hf" --prompt ab --max-tokens 12 --temperature 1.5 --seed 3 --print-ids
[ "$(cat "$tmp/out")" = "$s1" ] || fail "seed 3 twice: $s1, then $(cat "$tmp/out")"
stop=$(echo "$B" | cut -d, -f3)
first=$(echo "$B" | tr ',' '\n' | grep -n -x -m1 "$stop" | cut -d: -f1)
run "$gen" --hf "$f/hf" --prompt ab --max-tokens 12 --temperature 0 --stop-token "$stop" --print-ids
[ "$(cat "$tmp/out")" = "$(echo "$B" | cut -d, -f1-"$first")" ] ||
    fail "--stop-token $stop: $(cat "$tmp/out")"

# A directory with its own tokenizer: ids only.
run "$gen" --hf "$f/hf_tok" --prompt ab
expect_status 2 "tokenizer.json with --prompt"
expect_err "has its own tokenizer"
run "$gen" --hf "$f/hf_tok" --prompt-tokens 97,98 --max-tokens 12 --temperature 0 --print-ids
[ "$(cat "$tmp/out")" = "$B" ] || fail "hf_tok ids: $(cat "$tmp/out")"

# A vocabulary other than the byte tokenizer's (a model trained on
# llmt.tokenize shards): no byte-encoded prompt, no byte-decoded output.
run "$gen" --model "$f/model_v300.safetensors" --prompt ab --max-tokens 3
expect_status 2 "vocab 300 with --prompt"
expect_err "has vocab_size 300, not the byte tokenizer's 257"
run "$gen" --model "$f/model_v300.safetensors" --prompt-tokens 97,299 --max-tokens 3
expect_status 2 "vocab 300 without --print-ids"
expect_err "give --prompt-tokens and --print-ids"
run "$gen" --model "$f/model_v300.safetensors" --prompt-tokens 97,299 --max-tokens 3 --print-ids
expect_status 0 "vocab 300 ids"
grep -q -x '[0-9]*,[0-9]*,[0-9]*' "$tmp/out" || fail "vocab 300 ids: $(cat "$tmp/out")"
# --bytes: a vocabulary padded above the byte tokenizer's (llmt-train's
# default model's 320) takes a text prompt, the same as its ids by hand, and
# prints the ids' text; without it, the refusal points to it.
run "$gen" --model "$f/model_v300.safetensors" --prompt-tokens 97,98 --max-tokens 12 \
    --temperature 0 --print-ids
V=$(cat "$tmp/out")
run "$gen" --model "$f/model_v300.safetensors" --bytes --prompt ab --max-tokens 12 \
    --temperature 0 --print-ids
expect_status 0 "--bytes, ids"
[ "$(cat "$tmp/out")" = "$V" ] || fail "--bytes --prompt ab: $(cat "$tmp/out"), want $V"
run "$gen" --model "$f/model_v300.safetensors" --bytes --prompt ab --max-tokens 12 --temperature 0
expect_status 0 "--bytes, text"
python3 "$tmp/decode.py" "$V" "$tmp/out" || fail "--bytes: printed text differs from the ids"
run "$gen" --model "$f/model_v300.safetensors" --prompt ab --max-tokens 3
expect_err "or --bytes if it was trained on bytes"

# The cache holds the prompt and the new tokens, not the model's 2^20
# positions (hundreds of MiB of cache and attention scratch), so the tool
# runs within 256 MiB of data. Not under AddressSanitizer (its runtime,
# linked in either way, names __asan_init), whose shadow memory counts
# against the limit; the plain build runs it.
if ! nm -D "$gen" | grep -q __asan_init; then
    status=0
    (ulimit -d 262144 && OMP_NUM_THREADS=2 exec "$gen" --hf "$f/hf_huge" --prompt ab \
        --max-tokens 4 --print-ids) > "$tmp/out" 2> "$tmp/err" || status=$?
    expect_status 0 "a 2^20-position model in 256 MiB"
    grep -q -x '[0-9]*,[0-9]*,[0-9]*,[0-9]*' "$tmp/out" || fail "hf_huge ids: $(cat "$tmp/out")"
fi

# Usage and load errors.
run "$gen" --prompt ab
expect_status 2 "no model"
expect_err "exactly one of --checkpoint DIR, --hf DIR, --model FILE (0 given)"
run "$gen" --hf "$f/hf" --model "$f/model_a.safetensors" --prompt ab
expect_status 2 "two models"
run "$gen" --hf "$f/hf" --step 1 --prompt ab
expect_status 2 "--step without --checkpoint"
expect_err "step needs --checkpoint"
run "$gen" --hf "$f/hf"
expect_status 2 "no prompt"
run "$gen" --hf "$f/hf" --prompt ab --temperature -1
expect_status 2 "negative temperature"
expect_err "temperature"
for ids in 97,x " 97,98" "97, 98" +97 97,+98 97,,98 97, ,97 -1 2147483648 "97 "; do
    run "$gen" --hf "$f/hf" --prompt-tokens "$ids" --print-ids
    expect_status 2 "--prompt-tokens '$ids'"
    expect_err "'$ids' is not a list of token ids"
done
run "$gen" --hf "$f/hf" --prompt ab --max-tokens 15
expect_status 1 "past the context"
expect_err "max_new = 15"
run "$gen" --hf "$f/hf" --prompt 01234567890123456
expect_status 1 "prompt past the context"
expect_err "n_prompt = 17"
run "$gen" --hf "$f/hf" --prompt-tokens 97,257
expect_status 1 "token out of range"
expect_err "prompt\[1\] = 257"
run "$gen" --checkpoint "$f/ckpt" --step 5 --prompt ab
expect_status 1 "missing step"
expect_err "checkpoint directory $f/ckpt: no step 5 (steps there: 1 2)"
mkdir "$tmp/empty"
run "$gen" --checkpoint "$tmp/empty" --prompt ab
expect_status 1 "no checkpoint"

# Evaluation: B's loss over all 30 windows (18 + 12) of 16 + 1 tokens.
set -- $(cat "$f/eval_b.txt")
windows=$1 loss=$2 ppl=$3
[ "$windows" = 30 ] || fail "fixture windows $windows"
set -- $(cat "$f/eval_a.txt")
loss_a=$2
# close GOT WANT REL: whether |GOT - WANT| <= REL |WANT|.
close() {
    python3 -c "import sys; sys.exit(abs(float('$1') - float('$2')) > $3 * abs(float('$2')))"
}
close "$loss_a" "$loss" 1e-3 && fail "the fixture's A and B score alike ($loss_a, $loss)"
pattern='.* 30 windows of 16 tokens (480 predictions): loss \([0-9.]*\) perplexity \([0-9.]*\)$'
# expect_eval LOSS PPL WHAT: the output is 30 windows with that loss and perplexity.
expect_eval() {
    got=$(sed -n "s/$pattern/\1 \2/p" "$tmp/out")
    [ -n "$got" ] || fail "$3 output: $(cat "$tmp/out") $(cat "$tmp/err")"
    close "${got% *}" "$1" 1e-5 || fail "$3 loss ${got% *}, want $1"
    [ -z "$2" ] || close "${got#* }" "$2" 1e-5 || fail "$3 perplexity ${got#* }, want $2"
}
for src in "--hf $f/hf" "--checkpoint $f/ckpt"; do
    run "$ev" $src --data "$f/val_*.bin" --seq-len 16 --batch-size 4
    expect_status 0 "eval $src"
    expect_eval "$loss" "$ppl" "eval $src"
done
run "$ev" --checkpoint "$f/ckpt" --step 1 --data "$f/val_*.bin" --batch-size 4
expect_status 0 "eval --step 1"
grep -q "step 1: 30 windows" "$tmp/out" || fail "eval --step 1: $(cat "$tmp/out")"
expect_eval "$loss_a" "" "eval --step 1 (A's loss)"
# More batches than one pass evaluates each window once, also where
# batches x batch-size passes int64.
for n in 8 100 9223372036854775807; do
    run "$ev" --hf "$f/hf" --data "$f/val_*.bin" --batches $n --batch-size 4
    expect_status 0 "--batches $n"
    expect_eval "$loss" "$ppl" "--batches $n of 4"
    expect_err "more than one pass: evaluating its 30 windows once"
done
run "$ev" --hf "$f/hf" --data "$f/val_*.bin" --batches 9223372036854775807 --batch-size 65536
expect_status 0 "--batches INT64_MAX x 65536"
expect_eval "$loss" "$ppl" "--batches INT64_MAX x 65536"
# --hf's default --seq-len is at most 1024 (hf_long's max_seq_len is 2048):
# the 2100-token shard holds two windows of 1024 + 1.
run "$ev" --hf "$f/hf_long" --data "$f/long_*.bin"
expect_status 0 "hf_long default seq-len"
grep -q ": 2 windows of 1024 tokens (2048 predictions)" "$tmp/out" ||
    fail "hf_long default seq-len: $(cat "$tmp/out")"
run "$ev" --model "$f/model_a.safetensors" --data "$f/val_*.bin" --batches 2 --batch-size 3 \
    --seq-len 8
grep -q ": 6 windows of 8 tokens (48 predictions)" "$tmp/out" || fail "--batches: $(cat "$tmp/out")"
run "$ev" --hf "$f/hf" --data "$f/none_*.bin"
expect_status 1 "no shards"
expect_err "none_"
run "$ev" --hf "$f/hf" --data "$f/val_*.bin" --seq-len 17
expect_status 1 "seq-len past the model"
expect_err "seq-len 17"
run "$ev" --hf "$f/hf"
expect_status 2 "no data"
echo ok
