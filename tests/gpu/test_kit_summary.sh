#!/usr/bin/env bash
# CTest's gpu_kit_summary: tests/gpu/run.sh's gpu-summary.json is valid
# JSON and keeps the text it records, whatever that holds. A copy of the kit
# runs in an empty tree (so its deps stage fails at once: no .gpu-deps) with
# an nvidia-smi that prints quotes, a backslash, control characters and a
# byte that is not UTF-8; the summary must parse and hold that line (the
# byte as U+FFFD), with device passed and deps failed, exit status 1.
# Then summary.py alone, given passed bench and torch stages whose results
# hold NaN, Infinity, -Infinity and 1e999 (PyTorch's loss starts at NaN):
# the summary must parse as strict JSON, with those numbers null and the
# finite ones kept.
#
#   test_kit_summary.sh SOURCE_DIR
set -uo pipefail
src=$1
fail() {
    echo "FAIL: $*"
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tree/tests/gpu" "$tmp/bin"
cp "$src"/tests/gpu/{run.sh,gpu_deps.sh,summary.py} "$tmp/tree/tests/gpu/"
line='H200 "NVL" \\x\001\033[0m\t\377, 580.65, 143771 MiB, 9.0'
printf '#!/bin/sh\nprintf '"'%%b\\\\n'"' '"'%s'"'\n' "$line" >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
PATH=$tmp/bin:$PATH OUT=$tmp/out "$tmp/tree/tests/gpu/run.sh" --build-only "$tmp/build" >"$tmp/log" 2>&1
rc=$?
cat "$tmp/log"
[ "$rc" -eq 1 ] || fail "run.sh exited $rc, expected 1 (the deps stage)"
python3 - "$tmp/out/gpu-summary.json" <<'PY' || fail "the summary"
import json, sys
raw = open(sys.argv[1], "rb").read()
try:
    s = json.loads(raw.decode("utf-8"))
except ValueError as e:
    sys.exit(f"gpu-summary.json is not valid JSON: {e}: {raw[:400]!r}")
want = ('H200 "NVL" \\x\x01\x1b[0m\t\ufffd, 580.65, 143771 MiB, 9.0')
got = s["host"].get("gpu")
if got != want:
    sys.exit(f"host.gpu is {got!r}, expected {want!r}")
st = {x["name"]: x for x in s["stages"]}
if st["device"]["status"] != "pass" or st["device"]["note"] != want:
    sys.exit(f"device stage: {st['device']!r}")
if st.get("deps", {}).get("status") != "fail" or s["failed_stages"] != 1 or s["result"] != "fail":
    sys.exit(f"expected deps failed and one failed stage: {s['stages']!r}")
print("PASS: the summary parses and keeps the nvidia-smi line exactly")
PY

printf '{"mfu": 0.41, "loss": NaN, "peak": {"act": [1, Infinity, -Infinity]}}\n' >"$tmp/bench.json"
printf '{"eager": {"loss": NaN, "tokens_per_s": 1e999, "steps": 5}}\n' >"$tmp/torch.json"
python3 "$src/tests/gpu/summary.py" "$tmp/nan-summary.json" full 480 60 0 "$tmp/bench.json" \
    "$tmp/torch.json" 0 bench pass 10 "" torch pass 20 "" || fail "summary.py with NaN results"
python3 - "$tmp/nan-summary.json" <<'PY' || fail "the summary of results with NaN"
import json, sys
def strict(word):
    raise ValueError(f"{word} is not JSON")
raw = open(sys.argv[1], encoding="ascii").read()
try:
    s = json.loads(raw, parse_constant=strict)
except ValueError as e:
    sys.exit(f"gpu-summary.json is not strict JSON: {e}: {raw[:400]!r}")
want_bench = {"mfu": 0.41, "loss": None, "peak": {"act": [1, None, None]}}
want_torch = {"eager": {"loss": None, "tokens_per_s": None, "steps": 5}}
if s["bench"] != want_bench or s["torch"] != want_torch:
    sys.exit(f"bench {s['bench']!r}, torch {s['torch']!r}; expected {want_bench!r}, {want_torch!r}")
print("PASS: non-finite results are null in a strict JSON summary")
PY
