#!/usr/bin/env bash
# CTest's gpu_prepare_no_lists: tests/gpu/prepare.sh, where apt knows no
# packages (its lists never fetched: here an empty lists directory through
# APT_CONFIG), stops with apt's own error and its advice, exit status 1,
# before it downloads or creates anything. No network is used. Skipped
# (exit status 77) where there is no apt-get.
#
#   test_prepare_no_lists.sh SOURCE_DIR
set -uo pipefail
src=$1
fail() {
    echo "FAIL: $*"
    exit 1
}
if ! command -v apt-get >/dev/null; then # CTest's SKIP_RETURN_CODE
    echo "SKIP: no apt-get (prepare.sh is for Debian's apt)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial"
cat >"$tmp/apt.conf" <<CONF
Dir::State::Lists "$tmp/lists/";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CONF
APT_CONFIG=$tmp/apt.conf "$src/tests/gpu/prepare.sh" >"$tmp/out" 2>"$tmp/err"
rc=$?
cat "$tmp/out" "$tmp/err"
[ "$rc" -eq 1 ] || fail "prepare.sh exited $rc, expected 1"
grep -q '^E: ' "$tmp/err" || fail "apt's own error is not shown"
grep -qE '^prepare\.sh: apt cannot download [a-z0-9.+-]+ \(its error is above; run apt-get update\?\)$' \
    "$tmp/err" || fail "prepare.sh did not say which package and what to do"
echo "PASS: with no apt lists, prepare.sh stops with apt's error and its advice"
