#!/bin/sh
# llmt-plan: --help and --version exit 0; bad values (--backend tpu, --seq abc,
# --budget lots, --precision fp8, --seq past a --config's max_seq_len, ...)
# are usage errors naming the option and the value; the parameter count is
# checked against the LLaMA formula; the budget fit searches precisions
# (checked against the tool's own table) unless --precision pins one;
# --backend cuda plans without a device where the CUDA plugin is built, and
# says the build has none where it is not; --world N plans one rank of a
# ZeRO-1 run (checked against the sharding rule by hand), --rank R another;
# --offload optimizer [--offload-layers K] moves AdamW's bytes to the host
# column (checked by hand), and with --budget offloads the fewest layers that
# fit after full recompute; --offload optimizer+grads moves the gradients
# below the split too, less the device bucket (checked by hand), and fits
# with fewer layers; --offload grads alone is a usage error; with --world,
# each rank offloads the part of its range below the prefix (checked by
# hand) and with optimizer+grads every rank the gradients of the whole
# prefix's granules (named), which on CUDA a rank adding one micro-batch at
# a time (--reduce) keeps none of in host memory but a tied embedding's;
# --host-budget (or the config's memory.host_budget) keeps the fit's offload
# to what the host holds, and is a usage error without --budget or offload.
# Usage: test_llmt_plan.sh PATH_TO_LLMT_PLAN CUDA_PLUGIN_BUILT(ON|OFF) SOURCE_DIR
set -eu
tool=$1
cuda=$2
src=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# run ARGS...: runs the tool; $status, $tmp/out, $tmp/err hold the result.
run() {
    status=0
    "$tool" "$@" > "$tmp/out" 2> "$tmp/err" || status=$?
}
# usage_error WORDS -- ARGS...: exit status 2, nothing on stdout, and stderr
# naming each of WORDS.
usage_error() {
    words=""
    while [ "$1" != "--" ]; do words="$words $1"; shift; done
    shift
    run "$@"
    [ "$status" = 2 ] || fail "$*: exit $status, not 2: $(cat "$tmp/err")"
    [ ! -s "$tmp/out" ] || fail "$*: printed to stdout: $(cat "$tmp/out")"
    for w in $words; do
        grep -q -e "$w" "$tmp/err" || fail "$*: the message does not name '$w': $(cat "$tmp/err")"
    done
    if grep -Eq ':[0-9]+:[0-9]+' "$tmp/err"; then
        fail "$*: the message gives a file position: $(cat "$tmp/err")"
    fi
}

run --help
[ "$status" = 0 ] || fail "--help exits $status"
grep -q "^usage: llmt-plan" "$tmp/out" || fail "--help prints no usage on stdout"
run --version
[ "$status" = 0 ] || fail "--version exits $status"
grep -Eqx 'llmt-plan [0-9]+\.[0-9]+\.[0-9]+' "$tmp/out" || fail "--version: $(cat "$tmp/out")"

usage_error -- --backend cpu
usage_error -- --preset small extra
usage_error --backend tpu -- --preset small --backend tpu
usage_error --seq abc -- --preset small --seq abc
if grep -q max_seq_len "$tmp/err"; then fail "--seq abc: a library message: $(cat "$tmp/err")"; fi
usage_error --seq -- --preset small --seq 0
usage_error --seq -- --preset small --seq -5
usage_error --seq 1e3 -- --preset small --seq 1e3
usage_error --seq -- --preset small --seq 99999999999999999999
usage_error --micro-batch -- --preset small --micro-batch x
usage_error --threads -- --preset small --threads 0
usage_error --budget lots -- --preset small --budget lots
usage_error --budget -- --preset small --budget 0
usage_error --budget -- --preset small --budget -1GiB
usage_error --precision fp8 -- --preset small --precision fp8
usage_error --preset tiny -- --preset tiny
usage_error --preset --config -- --preset small --config x.yaml
usage_error --stesp -- --preset small --stesp 3
usage_error "--seq 5000" max_seq_len -- --config "$src/examples/configs/100m.yaml" --seq 5000
usage_error "--world 0" -- --preset small --world 0
usage_error "--world -8" -- --preset small --world -8
usage_error "--world 65537" -- --preset small --world 65537
usage_error "--world 8x" -- --preset small --world 8x
usage_error "--world 1e3" -- --preset small --world 1e3
usage_error "--rank 2" "needs --world" -- --preset small --rank 2
usage_error "--rank 8" "--world 8" -- --preset small --world 8 --rank 8
usage_error "--rank -1" -- --preset small --world 8 --rank -1
usage_error "--reduce fast" "needs --world N" -- --preset small --reduce fast
usage_error "--reduce slow" "not a reduce mode (deterministic or fast)" -- \
    --preset small --world 2 --reduce slow
usage_error "--offload grads" "needs the optimizer" "optimizer+grads" -- \
    --preset small --offload grads
usage_error "--offload Optimizer" -- --preset small --offload Optimizer
usage_error "--offload grads+optimizer" "optimizer+grads" -- \
    --preset small --offload grads+optimizer
usage_error "--offload optimizer+grads+" -- --preset small --offload optimizer+grads+
usage_error "--offload-layers 3" "needs --offload optimizer or optimizer+grads" -- \
    --preset small --offload-layers 3
usage_error "--offload-layers 3" "needs --offload optimizer" -- --preset small --offload-layers 3
usage_error "--offload-layers 3" "needs --offload optimizer" -- \
    --preset small --offload none --offload-layers 3
for bad in 9 -1 x 3x 1e1 " 3" ALL 99999999999999999999; do
    usage_error "--offload-layers $bad" "0..8" -- \
        --preset small --offload optimizer --offload-layers "$bad"
done

# The parameter count of preset small (vocab 8192, hidden 512, 8 layers, 8
# heads of 64, 8 kv heads, ffn 1408, untied): embedding and LM head, per layer
# two norms, q k v o and the three FFN matrices, and the final norm.
v=8192 d=512 l=8 kv=$((8 * 64)) f=1408
params=$((2 * v * d + l * (2 * d + 2 * d * d + 2 * d * kv + 3 * d * f) + d))
run --preset small --seq 256
[ "$status" = 0 ] || fail "--preset small: exit $status: $(cat "$tmp/err")"
grep -q "($params parameters)" "$tmp/out" || fail "not $params parameters: $(cat "$tmp/out")"
[ "$(grep -Ec '^(fp32|bf16_mixed|fp16_mixed|bf16_pure) ' "$tmp/out")" = 24 ] ||
    fail "the table has not 4 precisions x 6 policies: $(cat "$tmp/out")"

# The fit the table implies: the first precision (fp32, bf16_mixed,
# fp16_mixed, bf16_pure) with a policy of the ladder whose peak (last column,
# GiB, at micro-batch 1) is within the budget, and the lightest such policy.
expected_fit() { # budget-GiB < table
    awk -v budget="$1" '
        NF == 9 && $1 ~ /^(fp32|bf16_mixed|fp16_mixed|bf16_pure)$/ { peak[$1 " " $2] = $8 }
        END {
            split("fp32 bf16_mixed fp16_mixed bf16_pure", precs, " ")
            split("none ffn_act attn_core+ffn_act attn_core+ffn full", ladder, " ")
            for (p = 1; p <= 4; p++)
                for (k = 1; k <= 5; k++)
                    if ((precs[p] " " ladder[k]) in peak && peak[precs[p] " " ladder[k]] <= budget) {
                        printf "%s, micro-batch 1 with recompute %s fits\n", precs[p], ladder[k]
                        exit
                    }
            print "nothing fits"
        }'
}
run --preset llama-7b --budget 80GiB
[ "$status" = 0 ] || fail "--budget 80GiB: exit $status: $(cat "$tmp/err")"
want=$(expected_fit 80 < "$tmp/out")
[ "$want" != "nothing fits" ] || fail "the table shows nothing within 80 GiB: $(cat "$tmp/out")"
grep -qF "budget 80.00 GiB: $want" "$tmp/out" || fail "not '$want': $(tail -5 "$tmp/out")"
grep -q "budget 80.00 GiB: fp32 does not fit" "$tmp/out" || fail "fp32 was not tried first"

# --precision pins the table and the fit.
run --preset llama-7b --budget 80GiB --precision fp32
[ "$status" = 1 ] || fail "--precision fp32 --budget 80GiB: exit $status, not 1"
[ "$(grep -Ec '^fp32 ' "$tmp/out")" = 6 ] && ! grep -Eq '^(bf16|fp16)' "$tmp/out" ||
    fail "--precision fp32 planned other precisions: $(cat "$tmp/out")"
grep -q "budget 80.00 GiB: nothing fits" "$tmp/out" || fail "no 'nothing fits': $(cat "$tmp/out")"
run --preset small --seq 256 --budget 1GiB --precision bf16_pure
[ "$status" = 0 ] || fail "--precision bf16_pure --budget 1GiB: exit $status"
grep -q "budget 1.00 GiB: bf16_pure, micro-batch 1 with recompute none fits" "$tmp/out" ||
    fail "--precision bf16_pure: $(tail -2 "$tmp/out")"

# --world 8: LLaMA-7B's rank with the most of its 6738415616 parameters in
# granules of 4096 split floor(G r / 8), in bf16_mixed: weights 2 bytes per
# parameter, gradients 2 plus 4 per owned element (the owner's fp32 sum),
# AdamW 12 per owned element; activations as in one process.
P=6738415616
G=$(((P + 4095) / 4096))
best=-1 most=-1 first=0 end=0
for r in 0 1 2 3 4 5 6 7; do
    a=$((G * r / 8 * 4096)) b=$((G * (r + 1) / 8 * 4096))
    [ "$b" -le "$P" ] || b=$P
    if [ $((b - a)) -gt "$most" ]; then best=$r most=$((b - a)) first=$a end=$b; fi
done
run --preset llama-7b --world 8 --precision bf16_mixed
[ "$status" = 0 ] || fail "--world 8: exit $status: $(cat "$tmp/err")"
head="per rank, 8 ranks (ZeRO-1): rank"
line="$head $best, the largest, holds AdamW state for parameters [$first, $end) ($most)"
grep -qxF "$line" "$tmp/out" || fail "--world 8: not rank $best [$first, $end): $(cat "$tmp/out")"
want=$(awk -v p="$P" -v o="$most" 'BEGIN { g = 1073741824
    printf "%9.2f %9.2f %9.2f", 2 * p / g, (2 * p + 4 * o) / g, 12 * o / g }')
grep -qF "bf16_mixed  none               $want" "$tmp/out" ||
    fail "--world 8: params, grads, optimizer not $want: $(cat "$tmp/out")"
grep '^bf16_mixed' "$tmp/out" | awk '{ print $2, $6 }' > "$tmp/ranked"
run --preset llama-7b --precision bf16_mixed
grep '^bf16_mixed' "$tmp/out" | awk '{ print $2, $6 }' > "$tmp/single"
cmp -s "$tmp/ranked" "$tmp/single" || fail "--world 8 changed the activations"
run --preset llama-7b --world 8 --rank 0 --precision bf16_mixed
n0=$((G / 8 * 4096))
grep -qxF "$head 0 holds AdamW state for parameters [0, $n0) ($n0)" "$tmp/out" ||
    fail "--rank 0: $(sed -n 2p "$tmp/out")"
run --preset llama-7b --world 8 --budget 40GiB
[ "$status" = 0 ] || fail "--world 8 --budget 40GiB: exit $status: $(cat "$tmp/err")"
want=$(expected_fit 40 < "$tmp/out")
grep -qF "budget 40.00 GiB per rank: $want" "$tmp/out" ||
    fail "per rank: not '$want': $(tail -5 "$tmp/out")"

# --offload optimizer: AdamW's 12 bytes per parameter (bf16_mixed: two fp32
# moments and the fp32 master) leave the optimizer column and the peak for
# the host column; with --offload-layers 4 only those of the embedding and
# layers 0-3 (stored first) do. The CPU reads host memory: no staging.
row() { grep "^$1 *$2 " "$tmp/out" | head -n 1; }
run --preset small --seq 256 --precision bf16_mixed
base=$(row bf16_mixed none)
layer=$((2 * d + 2 * d * d + 2 * d * kv + 3 * d * f))
for k in all 4; do
    if [ $k = all ]; then host=$params; else host=$((v * d + k * layer)); fi
    run --preset small --seq 256 --precision bf16_mixed --offload optimizer --offload-layers $k
    [ "$status" = 0 ] || fail "--offload-layers $k: exit $status: $(cat "$tmp/err")"
    got=$(row bf16_mixed none)
    want=$(echo "$base" | awk -v h="$host" -v p="$params" '{ g = 1073741824
        printf "%.2f %.2f %.2f", 12 * (p - h) / g, $8 - 12 * h / g, 12 * h / g }')
    have=$(echo "$got" | awk '{ print $5, $8, $9 }')
    # The peak is rounded twice in $want: allow 0.01 there.
    echo "$want $have" | awk '{ d = $2 - $5; exit !($1 == $4 && $3 == $6 && d < 0.0101 && d > -0.0101) }' ||
        fail "--offload-layers $k: optimizer, peak, host not $want: $got"
done
grep -q "the optimizer's state of the embedding and layers 0-3 offloaded" "$tmp/out" ||
    fail "--offload-layers 4: the header does not say so: $(head -n 1 "$tmp/out")"
run --preset small --seq 256 --precision bf16_mixed --offload none
[ "$(row bf16_mixed none)" = "$base" ] || fail "--offload none changed the plan"

# --offload optimizer+grads: also the gradients [0, gs) leave the device for
# the host, gs the prefix rounded down to 4096-element granules, except one
# bucket's worth: the largest bucket (the embedding, a layer, or the tail of
# final norm and LM head, in that order) starting below gs. bf16_mixed: 2
# bytes a gradient.
for k in all 4; do
    if [ $k = all ]; then host=$params; else host=$((v * d + k * layer)); fi
    run --preset small --seq 256 --precision bf16_mixed --offload optimizer+grads \
        --offload-layers $k
    [ "$status" = 0 ] || fail "optimizer+grads --offload-layers $k: exit $status: $(cat "$tmp/err")"
    got=$(row bf16_mixed none)
    want=$(echo "$base" | awk -v h="$host" -v p="$params" -v e=$((v * d)) -v l="$layer" \
        -v n="$l" -v t=$((d + v * d)) '{ g = 1073741824
        gs = int(h / 4096) * 4096
        b = 0; s = 0
        for (i = 0; i < n + 2; i++) {
            size = i == 0 ? e : i <= n ? l : t
            if (s < gs && size > b) b = size
            s += size
        }
        printf "%.2f %.2f %.2f %.2f", 2 * (p - gs + b) / g, 12 * (p - h) / g,
            $8 - (12 * h + 2 * (gs - b)) / g, (12 * h + 2 * gs) / g }')
    have=$(echo "$got" | awk '{ print $4, $5, $8, $9 }')
    echo "$want $have" | awk '{ d = $3 - $7; exit !($1 == $5 && $2 == $6 && $4 == $8 && d < 0.0101 && d > -0.0101) }' ||
        fail "optimizer+grads --offload-layers $k: grads, optimizer, peak, host not $want: $got"
done
grep -q "the optimizer's state and gradients of the embedding and layers 0-3 offloaded" \
    "$tmp/out" || fail "optimizer+grads --offload-layers 4: the header: $(head -n 1 "$tmp/out")"

# --budget with --offload optimizer: LLaMA-7B in fp32 (tried first) needs
# 8 bytes per parameter of AdamW state; with full recompute (the table's
# peak) it fits 80 GiB once the embedding (32000 x 4096) and K layers of
# 202383360 parameters are offloaded, for the least such K.
run --preset llama-7b --precision fp32
full=$(row fp32 full)
run --preset llama-7b --budget 80GiB --offload optimizer
[ "$status" = 0 ] || fail "--offload optimizer --budget 80GiB: exit $status: $(cat "$tmp/err")"
want=$(echo "$full" | awk '{ g = 1073741824; e = 32000 * 4096; l = 202383360
    for (k = 1; $8 - 8 * (e + k * l) / g > 80; k++) {}
    printf "fp32, micro-batch 1 with recompute full, the optimizer'"'"'s state of the embedding " \
        "and layers 0-%d offloaded (host %.2f GiB) fits", k - 1, 8 * (e + k * l) / g }')
grep -qF "budget 80.00 GiB: $want" "$tmp/out" || fail "not '$want': $(tail -n 2 "$tmp/out")"
# --host-budget: the fit offloads only what the host holds. Exactly the
# bytes of that fit's host state: the same fit; a byte fewer: fp32 cannot
# offload enough at micro-batch 1 (the state's host bytes only grow with
# the layers), so it does not fit and says what host memory it would need.
host=$(echo "$full" | awk '{ e = 32000 * 4096; l = 202383360
    for (k = 1; $8 - 8 * (e + k * l) / 1073741824 > 80; k++) {}
    printf "%.0f", 8 * (e + k * l) }')
run --preset llama-7b --budget 80GiB --offload optimizer --precision fp32 --host-budget "$host"
[ "$status" = 0 ] || fail "--host-budget $host: exit $status: $(cat "$tmp/err")"
grep -qF "host $(echo "$host" | awk '{ printf "%.2f", $1 / 1073741824 }') GiB: $want" "$tmp/out" ||
    fail "--host-budget $host: not '$want': $(tail -n 1 "$tmp/out")"
run --preset llama-7b --budget 80GiB --offload optimizer --precision fp32 --host-budget $((host - 1))
[ "$status" = 1 ] || fail "--host-budget $((host - 1)): exit $status, not 1"
grep -q "fp32 does not fit: micro-batch 1 with full recompute and all of the optimizer offloaded needs .* GiB and .* GiB of host memory" "$tmp/out" ||
    fail "--host-budget $((host - 1)): $(tail -n 2 "$tmp/out")"
# The config's memory.host_budget is the default; --host-budget overrides it.
sed 's/^memory:$/memory:\n  host_budget: '"$((host - 1))"'/' "$src/examples/configs/100m.yaml" \
    > "$tmp/host.yaml"
grep -q "host_budget: $((host - 1))" "$tmp/host.yaml" || fail "the test's host config was not written"
run --config "$tmp/host.yaml" --precision bf16_mixed --budget 1GiB --offload optimizer
with_config=$(tail -n 1 "$tmp/out")
run --config "$tmp/host.yaml" --precision bf16_mixed --budget 1GiB --offload optimizer \
    --host-budget $((host - 1))
[ "$with_config" = "$(tail -n 1 "$tmp/out")" ] ||
    fail "config host_budget: '$with_config', not '$(tail -n 1 "$tmp/out")'"
case "$with_config" in *", host "*) ;; *) fail "config host_budget not used: $with_config" ;; esac
usage_error "--host-budget 1GiB" "needs --budget" -- --preset small --offload optimizer \
    --host-budget 1GiB
usage_error "--host-budget 1GiB" "needs --offload" -- --preset small --budget 1GiB \
    --host-budget 1GiB
run --preset small --budget 1GiB --host-budget 0 # none: nothing to offload, nothing refused
[ "$status" = 0 ] || fail "--host-budget 0 without offload: exit $status: $(cat "$tmp/err")"
usage_error "--host-budget lots" -- --preset small --budget 1GiB --offload optimizer \
    --host-budget lots
# --host-budget 0 is none, over a config's; a config's host budget with
# nothing offloaded limits nothing and is not shown.
run --config "$tmp/host.yaml" --precision bf16_mixed --budget 1GiB --offload optimizer \
    --host-budget 0
case "$(tail -n 1 "$tmp/out")" in *", host "*) fail "--host-budget 0: $(tail -n 1 "$tmp/out")" ;; esac
run --config "$tmp/host.yaml" --precision bf16_mixed --budget 1GiB
case "$(tail -n 1 "$tmp/out")" in *"host"*) fail "no offload: $(tail -n 1 "$tmp/out")" ;; esac
# With --world and no --rank the host bytes are those of the rank holding
# the most (rank 0, whose whole range is offloaded: its own plan's host
# column), not the planned rank's (the largest device peak), and the host
# budget holds for every rank.
run --preset llama-7b --precision fp32 --world 8 --offload optimizer --budget 60GiB
k=$(tail -n 1 "$tmp/out" | sed -n 's/.*and layers 0-\([0-9]*\) offloaded.*/\1/p')
[ -n "$k" ] || fail "--world 8 --budget 60GiB: $(tail -n 1 "$tmp/out")"
fit=$(tail -n 1 "$tmp/out")
run --preset llama-7b --precision fp32 --world 8 --rank 0 --offload optimizer \
    --offload-layers $((k + 1))
most=$(row fp32 full | awk '{ print $9 }')
case "$fit" in *"(host $most GiB on the rank holding the most) fits") ;;
    *) fail "--world 8: not rank 0's host $most: $fit" ;; esac
run --preset llama-7b --precision fp32 --world 8 --offload optimizer --budget 60GiB \
    --host-budget 3GiB
[ "$status" = 1 ] || fail "--world 8 --host-budget 3GiB: exit $status, not 1: $(tail -n 1 "$tmp/out")"
grep -q "GiB of host memory on the rank holding the most" "$tmp/out" ||
    fail "--world 8 --host-budget 3GiB: $(tail -n 2 "$tmp/out")"
# With the gradients (4 bytes each in fp32) too: the prefix's gradients
# beyond one layer's (the bucket) leave the device, so fewer layers do.
run --preset llama-7b --budget 80GiB --offload optimizer+grads
[ "$status" = 0 ] || fail "--offload optimizer+grads --budget 80GiB: exit $status: $(cat "$tmp/err")"
want=$(echo "$full" | awk '{ g = 1073741824; e = 32000 * 4096; l = 202383360
    for (k = 1; ; k++) {
        h = e + k * l; gs = int(h / 4096) * 4096
        if ($8 - (8 * h + 4 * (gs - l)) / g <= 80) break
    }
    printf "fp32, micro-batch 1 with recompute full, the optimizer'"'"'s state and gradients " \
        "of the embedding and layers 0-%d offloaded (host %.2f GiB) fits", k - 1,
        (8 * h + 4 * gs) / g }')
grep -qF "budget 80.00 GiB: $want" "$tmp/out" || fail "not '$want': $(tail -n 2 "$tmp/out")"
# A config's optimizer+grads of 0 layers is the owner's leave to offload,
# not a placement: its fit is that of --offload optimizer+grads.
sed 's/^optimizer:$/optimizer:\n  offload: optimizer+grads\n  offload_layers: 0/' \
    "$src/examples/configs/100m.yaml" > "$tmp/leave.yaml"
grep -q "offload_layers: 0" "$tmp/leave.yaml" || fail "the test's config was not written"
run --config "$tmp/leave.yaml" --precision bf16_mixed --budget 2GiB
from_config=$(tail -n 1 "$tmp/out")
run --config "$tmp/leave.yaml" --precision bf16_mixed --budget 2GiB --offload optimizer+grads
[ "$from_config" = "$(tail -n 1 "$tmp/out")" ] ||
    fail "config optimizer+grads of 0 layers: '$from_config', not '$(tail -n 1 "$tmp/out")'"
case "$from_config" in *offloaded*) ;; *) fail "no offload in the fit: $from_config" ;; esac
# A budget that recompute meets alone: no offload.
run --preset small --seq 256 --precision bf16_mixed --budget 1GiB --offload optimizer
grep -qxF "budget 1.00 GiB: bf16_mixed, micro-batch 1 with recompute none fits" "$tmp/out" ||
    fail "--budget 1GiB --offload optimizer: $(tail -n 1 "$tmp/out")"
# --offload-layers pins the placement in the fit.
run --preset llama-7b --budget 80GiB --precision fp32 --offload optimizer --offload-layers 2
[ "$status" = 1 ] || fail "--offload-layers 2 --budget 80GiB: exit $status, not 1"
grep -q "fp32 does not fit: micro-batch 1 with full recompute and the given offload" "$tmp/out" ||
    fail "--offload-layers 2 --budget 80GiB: $(tail -n 2 "$tmp/out")"
# --world 2 --offload optimizer: each rank of the ZeRO-1 split (granules of
# 4096, floor(G r / 2)) offloads the part of its range below the prefix
# (all, or the embedding and layers 0-5: rank 0 wholly, rank 1 split):
# AdamW's 12 bytes of each such parameter leave its optimizer column for
# the host column; params, grads, activations and workspace stay those of
# the rank without offload.
G=$(((params + 4095) / 4096))
for k in all 6; do
    if [ $k = all ]; then pre=$params; else pre=$((v * d + k * layer)); fi
    for r in 0 1; do
        a=$((G * r / 2 * 4096)) b=$((G * (r + 1) / 2 * 4096))
        [ "$b" -le "$params" ] || b=$params
        s=$pre
        [ "$s" -ge "$a" ] || s=$a
        [ "$s" -le "$b" ] || s=$b
        run --preset small --seq 256 --precision bf16_mixed --world 2 --rank $r
        base=$(row bf16_mixed none)
        run --preset small --seq 256 --precision bf16_mixed --world 2 --rank $r \
            --offload optimizer --offload-layers $k
        [ "$status" = 0 ] || fail "--world 2 --rank $r --offload-layers $k: exit $status: $(cat "$tmp/err")"
        line="offloaded on rank $r: the state of [$a, $s) ($((s - a))) in host memory, of [$s, $b) ($((b - s))) on the device"
        grep -qxF "$line" "$tmp/out" ||
            fail "--world 2 --rank $r --offload-layers $k: not '$line': $(cat "$tmp/out")"
        got=$(row bf16_mixed none)
        want=$(echo "$base" | awk -v h=$((s - a)) -v o=$((b - s)) '{ g = 1073741824
            printf "%s %s %.2f %s %s %.2f", $3, $4, 12 * o / g, $6, $7, 12 * h / g }')
        have=$(echo "$got" | awk '{ print $3, $4, $5, $6, $7, $9 }')
        [ "$have" = "$want" ] ||
            fail "--world 2 --rank $r --offload-layers $k: not '$want': $got"
    done
done
# Without --rank: the rank with the largest device peak, rank 1 (the
# partial granule's, offloaded last), with all of its state on the host.
run --preset small --seq 256 --world 2 --offload optimizer
[ "$status" = 0 ] || fail "--world 2 --offload optimizer: exit $status: $(cat "$tmp/err")"
a=$((G / 2 * 4096))
grep -qxF "offloaded on rank 1: the state of [$a, $params) ($((params - a))) in host memory, of [$params, $params) (0) on the device" \
    "$tmp/out" || fail "--world 2 --offload optimizer: $(sed -n 2,3p "$tmp/out")"
# With the gradients: every rank's whole gradient prefix in whole 4096-element
# granules (all of it here, less the partial granule), the state as above.
run --preset small --seq 256 --world 2 --offload optimizer+grads
[ "$status" = 0 ] || fail "--world 2 --offload optimizer+grads: exit $status: $(cat "$tmp/err")"
sg=$((params / 4096 * 4096))
grep -qxF "offloaded on rank 1: the state of [$a, $params) ($((params - a))) in host memory, of [$params, $params) (0) on the device" \
    "$tmp/out" &&
    grep -qxF "offloaded on every rank: the gradients of [0, $sg) ($sg) in host memory, the rest and one layer's bucket on the device" \
    "$tmp/out" || fail "--world 2 --offload optimizer+grads: $(sed -n 2,4p "$tmp/out")"
# A config's ordered accumulation (an fp32 sum counted only without
# --world) does not change the gradients named: 100m.yaml's every whole
# granule.
sed 's/^  micro_batch: 8$/  micro_batch: 8\n  accumulation: ordered/' "$src/examples/configs/100m.yaml" \
    > "$tmp/ordered.yaml"
grep -q "accumulation: ordered" "$tmp/ordered.yaml" || fail "the test's ordered config was not written"
run --config "$tmp/ordered.yaml" --precision bf16_mixed --world 2 --offload optimizer+grads
line="offloaded on every rank: the gradients of [0, 100089856) (100089856) in host memory, the rest and one layer's bucket on the device"
grep -qxF "$line" "$tmp/out" || fail "ordered config --world 2: not '$line': $(sed -n 4p "$tmp/out")"
run --preset small --seq 256 --world 2 --offload optimizer+grads --offload-layers 0
[ "$status" = 0 ] && grep -qxF "offloaded on every rank: no gradients (the offloaded prefix holds no whole 4096-element granule)" \
    "$tmp/out" || fail "--world 2 --offload optimizer+grads --offload-layers 0: exit $status: $(cat "$tmp/out" "$tmp/err")"

# CUDA: arithmetic only, so no GPU or driver is needed.
run --preset small --seq 256 --backend cuda
if [ "$cuda" = ON ]; then
    [ "$status" = 0 ] || fail "--backend cuda: exit $status: $(cat "$tmp/err")"
    grep -q "($params parameters)" "$tmp/out" || fail "cuda: not $params parameters"
    grep -q "cuda backend" "$tmp/out" || fail "cuda: the header does not say cuda"
    # Offloaded on CUDA: two staging buffers (gradients in, weights out) of
    # two halves of min(params, 2^22) bf16 elements join the host bytes.
    run --preset small --seq 256 --backend cuda --precision bf16_mixed --offload optimizer
    want=$(awk -v p="$params" 'BEGIN { s = p < 4194304 ? p : 4194304
        printf "%.2f", (12 * p + 2 * 2 * 2 * s) / 1073741824 }')
    [ "$(row bf16_mixed none | awk '{ print $9 }')" = "$want" ] ||
        fail "cuda --offload optimizer: host not $want: $(row bf16_mixed none)"
    # With the gradients: the host also holds the gradients below the split
    # (every parameter but the last partial granule's), and the device
    # bucket has two slots (one stored to the host while the next is
    # written), each the larger of the tail (final norm and LM head, the
    # largest bucket) and the norm's upload chunk of up to 2^20 elements,
    # plus 128 elements for alignment, rounded up to 128.
    run --preset small --seq 256 --backend cuda --precision bf16_mixed --offload optimizer+grads
    [ "$status" = 0 ] || fail "cuda --offload optimizer+grads: exit $status: $(cat "$tmp/err")"
    want=$(awk -v p="$params" -v t=$((d + v * d)) 'BEGIN { s = p < 4194304 ? p : 4194304
        gs = int(p / 4096) * 4096; g = 1073741824
        c = gs < 1048576 ? gs : 1048576; slot = (t > c ? t : c) + 128
        slot = int((slot + 127) / 128) * 128
        printf "%.2f %.2f", 2 * (p - gs + 2 * slot) / g, (12 * p + 2 * 2 * 2 * s + 2 * gs) / g }')
    [ "$(row bf16_mixed none | awk '{ print $4, $9 }')" = "$want" ] ||
        fail "cuda --offload optimizer+grads: grads, host not $want: $(row bf16_mixed none)"
    # With --world, a rank that adds one micro-batch at a time (deterministic,
    # or fast with one micro-batch a rank) sends the offloaded gradients from
    # the device bucket and keeps none of small's (untied) in host memory:
    # its host column is the state's alone (--offload optimizer's).
    run --preset small --seq 256 --backend cuda --precision bf16_mixed --world 2 \
        --offload optimizer
    state=$(row bf16_mixed none | awk '{ print $9 }')
    for mode in deterministic fast; do
        run --preset small --seq 256 --backend cuda --precision bf16_mixed --world 2 \
            --offload optimizer+grads --reduce $mode
        [ "$status" = 0 ] || fail "cuda --world 2 --reduce $mode: exit $status: $(cat "$tmp/err")"
        line="offloaded on every rank: the gradients of [0, $sg) ($sg), sent to their owners from the device's bucket as backward ends each layer; in host memory on rank 1: 0 of them"
        grep -qxF "$line" "$tmp/out" && [ "$(row bf16_mixed none | awk '{ print $9 }')" = "$state" ] ||
            fail "cuda --world 2 --reduce $mode: not '$line' and host $state: $(cat "$tmp/out")"
    done
    # 100m.yaml (tied; 4 micro-batches of 8 for 2 ranks): deterministic
    # keeps the embedding's bucket (48000 x 512, stored in the forward), fast
    # (two micro-batches a rank) every offloaded gradient.
    run --config "$src/examples/configs/100m.yaml" --backend cuda --precision bf16_mixed \
        --world 2 --offload optimizer+grads
    grep -qF "in host memory on rank 1: 24576000 of them (a tied embedding's" "$tmp/out" ||
        fail "cuda 100m.yaml --world 2 deterministic: $(sed -n 4p "$tmp/out")"
    run --config "$src/examples/configs/100m.yaml" --backend cuda --precision bf16_mixed \
        --world 2 --offload optimizer+grads --reduce fast
    grep -q "^offloaded on every rank: the gradients of \[0, [0-9]*) ([0-9]*) in host memory" \
        "$tmp/out" || fail "cuda 100m.yaml --world 2 fast: $(sed -n 4p "$tmp/out")"
else
    [ "$status" = 1 ] || fail "--backend cuda without the plugin: exit $status, not 1"
    grep -q "has none (configure with -DLLMT_CUDA=ON)" "$tmp/err" ||
        fail "--backend cuda without the plugin: $(cat "$tmp/err")"
fi
echo "ok: llmt-plan"
