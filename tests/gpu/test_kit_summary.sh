#!/usr/bin/env bash
# CTest's gpu_kit_summary: tests/gpu/run.sh's gpu-summary.json is valid
# JSON and keeps the text it records, whatever that holds. A copy of the kit
# runs in an empty tree (so its deps stage fails at once: no .gpu-deps) with
# an nvidia-smi that prints quotes, a backslash, control characters and a
# byte that is not UTF-8; the summary must parse and hold that line (the
# byte as U+FFFD), with device passed and deps failed, exit status 1.
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
