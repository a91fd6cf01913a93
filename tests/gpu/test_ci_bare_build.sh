#!/usr/bin/env bash
# CTest's gpu_ci_bare_build: tools/test.sh's GPU kit step
# (tests/gpu/ci_bare_build.sh) runs prepare.sh and then test_bare_build.sh
# only as root with apt-get, and otherwise says it was NOT run and why, and
# succeeds; a failing prepare.sh fails it. Also: test_prepare_no_lists.sh
# skips (77) without apt-get. In a copy of the kit whose prepare.sh and
# test_bare_build.sh are stubs that log their calls, with a PATH of only a
# fake id (uid 0 or 1000), dirname and, or not, a fake apt-get.
#
#   test_ci_bare_build.sh SOURCE_DIR
set -uo pipefail
src=$1
fail() {
    echo "FAIL: $*"
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kit=$tmp/kit
mkdir -p "$kit/tests/gpu" "$tmp/bin"
cp "$src/tests/gpu/ci_bare_build.sh" "$kit/tests/gpu/"
# shellcheck disable=SC2016 # expanded by the stub
printf '#!/bin/sh\necho "prepare $*" >>"%s"\nexit "${PREPARE_RC:-0}"\n' "$tmp/calls" \
    >"$kit/tests/gpu/prepare.sh"
printf '#!/bin/sh\necho "bare $*" >>"%s"\n' "$tmp/calls" >"$kit/tests/gpu/test_bare_build.sh"
chmod +x "$kit/tests/gpu/"*.sh
ln -s "$(command -v dirname)" "$tmp/bin/dirname"

step() { # uid apt(yes|no) -> output; rc in $rc, the stubs' calls in $calls
    printf '#!/bin/sh\necho %s\n' "$1" >"$tmp/bin/id"
    rm -f "$tmp/bin/apt-get" "$tmp/calls"
    [ "$2" = no ] || printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/apt-get"
    chmod +x "$tmp/bin/"*
    out=$(PATH=$tmp/bin "$BASH" "$kit/tests/gpu/ci_bare_build.sh" build/bare 2>&1)
    rc=$?
    calls=$(cat "$tmp/calls" 2>/dev/null)
    echo "uid $1, apt-get $2: rc $rc; $out; calls: ${calls//$'\n'/, }"
}

expect() { # rc calls what
    [ "$rc" -eq "$1" ] || fail "$3: exit status $rc, expected $1"
    [ "$calls" = "$2" ] || fail "$3: the stubs ran [$calls], expected [$2]"
}
step 0 yes
expect 0 $'prepare \nbare build/bare' "as root with apt-get"
PREPARE_RC=1 step 0 yes
expect 1 "prepare " "as root with apt-get, prepare.sh failing"
step 1000 yes
expect 0 "" "not root"
[ "$out" = "== GPU kit's bare build NOT run: not root (test_bare_build.sh needs unshare -m and mount) ==" ] ||
    fail "not root: the step must say it was NOT run and why"
step 0 no
expect 0 "" "no apt-get"
[ "$out" = "== GPU kit's bare build NOT run: no apt-get (prepare.sh downloads Debian packages) ==" ] ||
    fail "no apt-get: the step must say it was NOT run and why"
step 1000 no
grep -q 'NOT run: not root .*; no apt-get ' <<<"$out" || fail "both reasons must be given"
echo "PASS: the kit step runs as root with apt-get, and elsewhere says why not"

# The last step left no apt-get in $tmp/bin.
out=$(PATH=$tmp/bin "$BASH" "$src/tests/gpu/test_prepare_no_lists.sh" "$src" 2>&1)
rc=$?
echo "test_prepare_no_lists.sh without apt-get: rc $rc; $out"
[ "$rc" -eq 77 ] || fail "test_prepare_no_lists.sh without apt-get exited $rc, expected 77 (skip)"
echo "PASS: test_prepare_no_lists.sh skips without apt-get"
