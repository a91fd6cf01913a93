#!/bin/sh
# Runs a libFuzzer target for a bounded time over a scratch copy of its seed
# corpus (the fuzzer adds to the first corpus directory).
# Usage: run_fuzzer.sh FUZZER SEED_DIR SECONDS
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$2"/. "$work"/
exec "$1" -max_total_time="$3" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 "$work"
