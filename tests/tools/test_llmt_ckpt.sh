#!/bin/sh
# llmt-ckpt on checkpoints of tiny llmt-train runs (3 steps of 4 sequences of
# 8 tokens: tokens_seen = step x 32): list and info (text and --json) give
# the values known by construction and the file bytes measured here; verify
# says OK, then REFUSED naming the file whose byte was flipped (exit 1);
# the store is opened read-only (a writer's leftover is not cleaned); --hf
# exports weights that llmt-eval --hf scores exactly as the checkpoint
# itself (the default dtype the checkpoint's own: F32, BF16). With MPI, a
# sharded checkpoint of `mpiexec -n 2` (format 2, world size 2) consolidates
# into the very bytes of a single process's save of the same training
# (batch.accumulation=ordered, as in test_llmt_train_mpi.sh), and a flipped
# byte in a shard is refused naming the shard. Usage errors exit 2.
# Usage: test_llmt_ckpt.sh LLMT_CKPT LLMT_TRAIN LLMT_EVAL HAVE_MPI(ON|OFF) [MPIEXEC]
# (run in the environment CMake gives MPI tests: LLMT_MPI_TEST_ENV).
set -eu
tool=$(realpath "$1")
train=$(realpath "$2") # run from other directories
eval=$(realpath "$3")
have_mpi=$4
mpiexec=${5:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# run ARGS...: runs the tool; $status, $tmp/out, $tmp/err hold the result.
run() {
    status=0
    "$tool" "$@" > "$tmp/out" 2> "$tmp/err" || status=$?
}
# expect STATUS ARGS...: runs the tool and wants that exit status.
expect() {
    want=$1
    shift
    run "$@"
    [ "$status" = "$want" ] || fail "$*: exit $status, not $want: $(cat "$tmp/out" "$tmp/err")"
}
# usage_error MESSAGE ARGS...: exit 2, nothing on stdout, MESSAGE on stderr.
usage_error() {
    msg=$1
    shift
    expect 2 "$@"
    [ ! -s "$tmp/out" ] || fail "$*: printed to stdout: $(cat "$tmp/out")"
    grep -qF -- "$msg" "$tmp/err" || fail "$*: no '$msg' in: $(cat "$tmp/err")"
}
# has FILE TEXT: FILE holds the line TEXT (fixed string, whole line).
has() { grep -qxF -- "$2" "$1" || fail "no line '$2' in: $(cat "$1")"; }

# ---- Usage errors, before any checkpoint exists.
usage_error "give a command"
usage_error "unknown command 'frob'" frob "$tmp"
usage_error "list needs the checkpoint directory DIR" list
usage_error "info needs --step N" info "$tmp"
usage_error "consolidate needs --step N" consolidate "$tmp" --out "$tmp/o"
usage_error "consolidate needs --out OUTDIR, --hf HFDIR or both" consolidate "$tmp" --step 1
usage_error "--step is not an option of list" list "$tmp" --step 1
usage_error "--json is not an option of verify" verify "$tmp" --json
usage_error "--step abc" info "$tmp" --step abc
usage_error "--step -1" info "$tmp" --step -1
usage_error "--hf-dtype needs --hf" consolidate "$tmp" --step 1 --out "$tmp/o" --hf-dtype f32
usage_error "--hf-dtype f64: not f32, bf16 or f16" consolidate "$tmp" --step 1 --hf "$tmp/h" --hf-dtype f64
usage_error "unexpected argument 'extra'" list "$tmp" extra
usage_error "unknown option --stpe; did you mean --step?" verify "$tmp" --stpe 1
expect 0 --help
grep -q "consolidate DIR --step N" "$tmp/out" || fail "--help: $(cat "$tmp/out")"
expect 1 list "$tmp/missing"
grep -qF "$tmp/missing" "$tmp/err" || fail "a missing DIR is not named: $(cat "$tmp/err")"

# ---- A version-1 shard (docs/data.md) of ASCII text, each byte a token.
. "$(dirname "$0")/shard_v1.sh"
write_text_shard "$tmp/d"
cat > "$tmp/tiny.yaml" <<EOF
model: {vocab_size: 110, hidden_size: 16, num_layers: 2, num_heads: 2, num_kv_heads: 1,
        ffn_size: 32, max_seq_len: 8}
batch: {batch_size: 4, micro_batch: 1, seq_len: 8}
data: {train: "$tmp/d/t_*.bin", val: "$tmp/d/t_*.bin"}
train: {steps: 3, eval_batches: 1, log_every: 1, seed: 7, threads: 1}
checkpoint: {every: 1, fast_every: 0}
EOF
# train DIR [LAUNCHER...] -- OVERRIDES...: a run into DIR/run (the same
# relative --out, so the configurations saved in the MANIFESTs are equal).
train() {
    dir=$1
    shift
    launcher=""
    while [ "$1" != "--" ]; do launcher="$launcher $1"; shift; done
    shift
    mkdir "$dir"
    (cd "$dir" && $launcher "$train" --config "$tmp/tiny.yaml" --out run "$@" > log 2>&1) ||
        fail "llmt-train in $dir: $(cat "$dir/log")"
}
train "$tmp/one" -- batch.accumulation=ordered
train "$tmp/bf16" -- precision=bf16_mixed
store=$tmp/one/run/checkpoints

# The bytes of checkpoint directory $1's files, MANIFEST not counted.
data_bytes() { cat $(ls -d "$1"/* | grep -v '/MANIFEST$') | wc -c; }

# ---- list: one row per checkpoint, from its MANIFEST.
mkdir "$store/step-00000009.tmp-abcdef" # a writer's save in progress
expect 0 list "$store"
has "$tmp/out" "$(printf '%12s %14s %6s %10s %5s %14s' step tokens_seen format world_size files bytes)"
for s in 1 2 3; do
    has "$tmp/out" "$(printf '%12d %14d %6d %10d %5d %14d' $s $((s * 32)) 1 0 3 \
        "$(data_bytes "$store/step-0000000$s")")"
done
[ "$(wc -l < "$tmp/out")" -eq 4 ] || fail "list: not a header and 3 rows: $(cat "$tmp/out")"

# ---- info: text and JSON.
expect 0 info "$store" --step 2
has "$tmp/out" "checkpoint       $store/step-00000002"
has "$tmp/out" "step             2"
has "$tmp/out" "tokens_seen      64"
has "$tmp/out" "format_version   1 (single-file)"
has "$tmp/out" "world_size       0"
has "$tmp/out" "precision        fp32"
has "$tmp/out" "model            vocab 110, hidden 16, layers 2, heads 2/1 kv, ffn 32, max_seq_len 8, tied 0, rms_norm_eps 1e-05, rope_theta 10000"
has "$tmp/out" "optimizer        yes, 2 steps"
has "$tmp/out" "files            3, $(data_bytes "$store/step-00000002") bytes"
expect 0 info "$tmp/bf16/run/checkpoints" --step 3 --json
python3 - "$tmp/out" "$tmp/bf16/run/checkpoints/step-00000003" "$(data_bytes "$tmp/bf16/run/checkpoints/step-00000003")" <<'EOF' || fail "info --json: $(cat "$tmp/out")"
import json, sys
info = json.load(open(sys.argv[1]))
want = {"path": sys.argv[2], "step": 3, "epoch": 0, "tokens_seen": 96, "format_version": 1,
        "world_size": 0, "precision": "bf16_mixed", "has_optimizer": True,
        "optimizer_steps": 3, "has_data": True, "num_files": 3, "total_bytes": int(sys.argv[3])}
wrong = {k: (info.get(k), v) for k, v in want.items() if info.get(k) != v}
assert not wrong, wrong
assert info["model"]["vocab_size"] == 110 and info["model"]["num_kv_heads"] == 1, info["model"]
assert info["model"]["rms_norm_eps"] == 1e-05 and info["model"]["rope_scaling"] == "none"
EOF
expect 1 info "$store" --step 7
grep -qF "no checkpoint of step 7 (steps there: 1 2 3)" "$tmp/err" || fail "info --step 7: $(cat "$tmp/err")"

# ---- verify: OK, and read-only (the writer's leftover is still there).
expect 0 verify "$store"
has "$tmp/out" "step 1: OK"
has "$tmp/out" "step 3: OK"
expect 0 verify "$store" --step 2
[ "$(cat "$tmp/out")" = "step 2: OK" ] || fail "verify --step 2: $(cat "$tmp/out")"
[ -d "$store/step-00000009.tmp-abcdef" ] || fail "llmt-ckpt cleaned the store: it must open it read-only"
expect 1 verify "$tmp/d"
grep -qF "no checkpoint to verify" "$tmp/err" || fail "verify of a directory without checkpoints: $(cat "$tmp/err")"

# A flipped byte in step 2's optimizer.safetensors: refused, naming the file.
flip() { # FILE OFFSET
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "\\$(printf %03o $((b ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2> /dev/null
}
cp -r "$store" "$tmp/damaged"
flip "$tmp/damaged/step-00000002/optimizer.safetensors" 200
expect 1 verify "$tmp/damaged"
has "$tmp/out" "step 1: OK"
has "$tmp/out" "step 3: OK"
grep -q "^step 2: REFUSED: .*file optimizer.safetensors: checksum mismatch" "$tmp/out" ||
    fail "verify: step 2 not refused naming the file: $(cat "$tmp/out")"
grep -qF "1 of 3 checkpoints refused" "$tmp/err" || fail "verify: $(cat "$tmp/err")"
expect 0 info "$tmp/damaged" --step 2 # the manifest alone is read
# A flipped byte in a MANIFEST: info refuses it, naming the file.
flip "$tmp/damaged/step-00000001/MANIFEST" 20
expect 1 info "$tmp/damaged" --step 1
grep -qF "step-00000001 (durable): file MANIFEST" "$tmp/err" || fail "info of a damaged MANIFEST: $(cat "$tmp/err")"

# ---- consolidate: a single-file checkpoint is refused with --out; --hf
# exports its weights in their own dtype (BF16 here), which score exactly
# as the checkpoint does.
expect 1 consolidate "$store" --step 3 --out "$tmp/c1"
grep -qF "is not sharded (format_version 1)" "$tmp/err" || fail "consolidate of format 1: $(cat "$tmp/err")"
# The loss llmt-eval prints for a model (its arguments).
loss() { "$eval" "$@" --data "$tmp/d/t_*.bin" --batches 2 | sed -n 's/.*: loss \([0-9.]*\) .*/\1/p'; }
expect 0 consolidate "$tmp/bf16/run/checkpoints" --step 3 --hf "$tmp/hf_bf16"
grep -q '"torch_dtype":"bfloat16"' "$tmp/hf_bf16/config.json" || fail "--hf of bf16_mixed: $(cat "$tmp/hf_bf16/config.json")"
a=$(loss --hf "$tmp/hf_bf16")
b=$(loss --checkpoint "$tmp/bf16/run/checkpoints" --step 3)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "the --hf export scores $a, the checkpoint $b"

if [ "$have_mpi" != ON ]; then
    echo "llmt-ckpt: list, info, verify, --hf (built without MPI: no sharded checkpoint to consolidate)"
    exit 0
fi

# ---- A sharded checkpoint: two ranks.
train "$tmp/two" "$mpiexec" -n 2 -- batch.accumulation=ordered
sharded=$tmp/two/run/checkpoints
expect 0 list "$sharded"
has "$tmp/out" "$(printf '%12d %14d %6d %10d %5d %14d' 3 96 2 2 4 "$(data_bytes "$sharded/step-00000003")")"
expect 0 info "$sharded" --step 3
has "$tmp/out" "format_version   2 (sharded)"
has "$tmp/out" "world_size       2"
has "$tmp/out" "files            4, $(data_bytes "$sharded/step-00000003") bytes"
expect 0 verify "$sharded" --step 3

# consolidate: the bytes of the single process's save, and the F32 export.
expect 0 consolidate "$sharded" --step 3 --out "$tmp/cons" --hf "$tmp/hf"
[ "$(ls "$tmp/cons/step-00000003")" = "$(ls "$store/step-00000003")" ] ||
    fail "consolidated files: $(ls "$tmp/cons/step-00000003")"
for f in MANIFEST model.safetensors optimizer.safetensors user.bin; do
    cmp "$tmp/cons/step-00000003/$f" "$store/step-00000003/$f" ||
        fail "consolidated $f differs from a single process's save"
done
grep -q '"torch_dtype":"float32"' "$tmp/hf/config.json" || fail "--hf of fp32: $(cat "$tmp/hf/config.json")"
a=$(loss --hf "$tmp/hf")
b=$(loss --checkpoint "$sharded" --step 3)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "the --hf export of the sharded checkpoint scores $a, the checkpoint $b"
expect 1 consolidate "$sharded" --step 3 --out "$tmp/cons"
grep -qF "$tmp/cons/step-00000003 already exists" "$tmp/err" || fail "consolidate over an output: $(cat "$tmp/err")"

# A flipped byte in rank 2's shard: refused, naming it.
flip "$sharded/step-00000003/optimizer-00002-of-00002.safetensors" 300
expect 1 verify "$sharded"
grep -q "^step 3: REFUSED: .*file optimizer-00002-of-00002.safetensors: checksum mismatch" "$tmp/out" ||
    fail "verify: the damaged shard is not named: $(cat "$tmp/out")"
expect 1 consolidate "$sharded" --step 3 --out "$tmp/cons2"
grep -qF "optimizer-00002-of-00002.safetensors" "$tmp/err" || fail "consolidate of a damaged shard: $(cat "$tmp/err")"
[ ! -e "$tmp/cons2/step-00000003" ] || fail "consolidate of a damaged shard wrote a checkpoint"
echo "llmt-ckpt: list, info, verify, --hf, and a sharded checkpoint consolidated to a single process's bytes"
