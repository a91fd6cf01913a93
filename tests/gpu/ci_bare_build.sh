#!/usr/bin/env bash
# tools/test.sh's GPU kit step: tests/gpu/prepare.sh, then
# tests/gpu/test_bare_build.sh BUILD_DIR, where they can run: as root (the
# check hides files with unshare -m and mount) with Debian's apt-get
# (prepare.sh downloads what .gpu-deps/ lacks). Elsewhere (a developer's
# non-root shell, a system without apt-get) it prints that the step was NOT
# run, and why, and succeeds. CI runs as root on Debian: there it always runs.
#
#   tests/gpu/ci_bare_build.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 1 ] || { echo "usage: tests/gpu/ci_bare_build.sh BUILD_DIR" >&2; exit 2; }
why=()
[ "$(id -u)" -eq 0 ] || why+=("not root (test_bare_build.sh needs unshare -m and mount)")
command -v apt-get >/dev/null || why+=("no apt-get (prepare.sh downloads Debian packages)")
if [ ${#why[@]} -gt 0 ]; then
    reasons=$(printf '; %s' "${why[@]}")
    echo "== GPU kit's bare build NOT run: ${reasons#; } =="
    exit 0
fi
tests/gpu/prepare.sh
tests/gpu/test_bare_build.sh "$1"
