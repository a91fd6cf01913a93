#!/bin/sh
# llmt-tokenize: shards decoded by hand (od), the train/val split, shard
# sizes, determinism, directory inputs, skipped unreadable files and errors.
# Usage: test_llmt_tokenize.sh PATH_TO_LLMT_TOKENIZE
set -eu
tool=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Little-endian int32 number $2 of file $1.
header_int() { od -An -v -t d4 --endian=little -j $(($2 * 4)) -N 4 "$1" | tr -d ' '; }
# The tokens of shard $1 (version 1), one per line.
tokens() { od -An -v -t u2 --endian=little -j 1024 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
# The expected token stream of the files given, one token per line: bytes, then 256.
expect() { for f in "$@"; do od -An -v -t u1 "$f" | tr -s ' ' '\n' | sed '/^$/d'; echo 256; done; }

mkdir "$tmp/in"
printf 'hello\n' > "$tmp/in/b.txt"
printf '\000\377\200 x' > "$tmp/in/a.txt"
head -c 3000 /dev/urandom > "$tmp/in/c.bin"
: > "$tmp/in/empty.txt"
printf 'z' > "$tmp/single.txt"

# One file: the header and tokens by hand.
"$tool" --out-dir "$tmp/o1" --prefix one "$tmp/single.txt" > "$tmp/o1.log"
s="$tmp/o1/one_train_000000.bin"
[ -f "$s" ] || fail "no shard written"
[ "$(header_int "$s" 0)" = 20240520 ] || fail "magic"
[ "$(header_int "$s" 1)" = 1 ] || fail "version"
[ "$(header_int "$s" 2)" = 2 ] || fail "count"
[ "$(stat -c %s "$s")" = 1028 ] || fail "size"
[ "$(tokens "$s" | tr '\n' ' ')" = "122 256 " ] || fail "tokens: $(tokens "$s")"
grep -q "one_train_000000.bin: 2 tokens" "$tmp/o1.log" || fail "report: $(cat "$tmp/o1.log")"

# A directory (sorted: a.txt, b.txt, c.bin, empty.txt) then a file, in
# shards of at most 1000 tokens, the last 10% as validation.
"$tool" --out-dir "$tmp/o2" --prefix d --shard-tokens 1000 --val-fraction 0.1 \
    "$tmp/in" "$tmp/single.txt" > "$tmp/o2.log"
expect "$tmp/in/a.txt" "$tmp/in/b.txt" "$tmp/in/c.bin" "$tmp/in/empty.txt" "$tmp/single.txt" \
    > "$tmp/want"
total=$(wc -l < "$tmp/want")   # 5 + 6 + 3000 + 0 + 1 bytes + 5 EOT = 3017
[ "$total" = 3017 ] || fail "expected stream has $total tokens"
n_val=302                      # ceil(0.1 * 3017)
: > "$tmp/got"
for s in "$tmp"/o2/d_train_*.bin; do
    n=$(header_int "$s" 2)
    [ "$n" -le 1000 ] || fail "$s holds $n tokens"
    tokens "$s" >> "$tmp/got"
done
[ "$(wc -l < "$tmp/got")" = $((total - n_val)) ] || fail "train holds $(wc -l < "$tmp/got")"
ls "$tmp"/o2/d_train_*.bin | sed 's|.*/||' | tr '\n' ' ' | grep -qx \
    'd_train_000000.bin d_train_000001.bin d_train_000002.bin ' || fail "train shard names"
[ "$(header_int "$tmp/o2/d_train_000000.bin" 2)" = 1000 ] || fail "first shard not full"
[ "$(header_int "$tmp/o2/d_train_000002.bin" 2)" = 715 ] || fail "last train shard"
for s in "$tmp"/o2/d_val_*.bin; do tokens "$s" >> "$tmp/got"; done
[ -f "$tmp/o2/d_val_000000.bin" ] && [ ! -f "$tmp/o2/d_val_000001.bin" ] || fail "val shards"
[ "$(header_int "$tmp/o2/d_val_000000.bin" 2)" = $n_val ] || fail "val count"
cmp -s "$tmp/want" "$tmp/got" || fail "token stream differs from the input bytes"
grep -q "train 2715 tokens in 3 shards, val 302 tokens in 1 shards" "$tmp/o2.log" ||
    fail "summary: $(cat "$tmp/o2.log")"

# Deterministic: the same inputs give identical shards.
"$tool" --out-dir "$tmp/o3" --prefix d --shard-tokens 1000 --val-fraction 0.1 \
    "$tmp/in" "$tmp/single.txt" > /dev/null
for s in "$tmp"/o2/*.bin; do cmp -s "$s" "$tmp/o3/${s##*/}" || fail "${s##*/} differs"; done

# An unreadable or missing file is skipped with a warning.
"$tool" --out-dir "$tmp/o4" "$tmp/missing.txt" "$tmp/single.txt" > /dev/null 2> "$tmp/o4.err"
grep -q "warning: skipping $tmp/missing.txt" "$tmp/o4.err" ||
    fail "no warning: $(cat "$tmp/o4.err")"
[ "$(header_int "$tmp/o4/data_train_000000.bin" 2)" = 2 ] || fail "default prefix"

# Errors: a clear message and a nonzero status.
check_error() {
    want=$1; shift
    if "$tool" "$@" > /dev/null 2> "$tmp/err"; then fail "accepted: $*"; fi
    grep -q -- "$want" "$tmp/err" || fail "message for $*: $(cat "$tmp/err")"
}
check_error "no input files" --out-dir "$tmp/o5"
check_error "no readable input" --out-dir "$tmp/o5" "$tmp/missing.txt"
check_error "--shard-tokens 0" --shard-tokens 0 "$tmp/single.txt"
check_error "--shard-tokens x" --shard-tokens x "$tmp/single.txt"
check_error "--val-fraction 1" --val-fraction 1 "$tmp/single.txt"
check_error "--val-fraction -0.5" --val-fraction -0.5 "$tmp/single.txt"
check_error "unknown option --bogus" --bogus "$tmp/single.txt"
check_error "needs a value" "$tmp/single.txt" --prefix
check_error "cannot create" --out-dir "$tmp/no/such" "$tmp/single.txt"
# Strict flags (the shared parser, examples/cli_args.c): whole numbers in
# range, the flag and value named, exit status 2; --help and --version exit 0.
usage_error() {
    want=$1; shift
    if "$tool" "$@" > /dev/null 2> "$tmp/err"; then fail "accepted: $*"; else rc=$?; fi
    [ $rc -eq 2 ] || fail "$*: exit $rc, not 2"
    grep -qF -- "$want" "$tmp/err" || fail "message for $*: $(cat "$tmp/err")"
}
usage_error "--shard-tokens 1e3: not an integer" --shard-tokens 1e3 "$tmp/single.txt"
usage_error "--shard-tokens -5: out of range" --shard-tokens -5 "$tmp/single.txt"
usage_error "--shard-tokens 99999999999999999999: out of range" --shard-tokens 99999999999999999999 "$tmp/single.txt"
usage_error "--shard-tokens 12abc: not an integer" --shard-tokens=12abc "$tmp/single.txt"
usage_error "--val-fraction nan: out of range" --val-fraction nan "$tmp/single.txt"
usage_error "--prefix given twice" --prefix a --prefix b "$tmp/single.txt"
usage_error "unknown option --prefx; did you mean --prefix?" --prefx a "$tmp/single.txt"
"$tool" --help | grep -q "^usage: llmt-tokenize" || fail "--help"
"$tool" --version | grep -qx "llmt-tokenize [0-9]*\.[0-9]*\.[0-9]*" || fail "--version: $("$tool" --version)"
# "--" ends the options: a file named like a flag is an input.
printf 'z' > "$tmp/--odd"
(cd "$tmp" && "$tool" --out-dir o6 -- --odd > /dev/null) || fail "-- did not end the options"
[ "$(header_int "$tmp/o6/data_train_000000.bin" 2)" = 2 ] || fail "-- input"
echo "ok: llmt-tokenize"
