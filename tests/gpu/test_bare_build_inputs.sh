#!/usr/bin/env bash
# CTest's gpu_bare_build_inputs: what tests/gpu/test_bare_build.sh hides is
# right, or the check stops. No root, network or build needed.
# 1. bare_packages.py, over a hand-written dpkg database (a fake dpkg-query)
#    where cmake and python3 were not installed by dpkg, prints exactly the
#    -dev packages and pkg-config of a stub install-deps.sh with what they
#    depend on (a virtual package through its provider), less the required
#    and Essential packages and build-essential with theirs.
# 2. test_bare_build.sh, in a copy of the kit whose `dpkg -L` lists one
#    file and then fails (as for a package it cannot list), stops with an
#    error before it hides anything (a fake unshare records whether it ran).
#
#   test_bare_build_inputs.sh SOURCE_DIR
set -uo pipefail
src=$1
fail() {
    echo "FAIL: $*"
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"

# 1. Status, name, Essential, Priority, Provides, "Pre-Depends, Depends".
t=$'\t'
cat >"$tmp/dpkg-db" <<DB
ii ${t}libc6${t}${t}required${t}${t}, 
ii ${t}dash${t}yes${t}optional${t}${t}libc6, 
ii ${t}build-essential${t}${t}optional${t}${t}, gcc, make
ii ${t}gcc${t}${t}optional${t}${t}, libc6 (>= 2.34)
ii ${t}make${t}${t}optional${t}${t}, libc6
ii ${t}pkg-config${t}${t}optional${t}${t}, pkgconf
ii ${t}pkgconf${t}${t}optional${t}${t}, pkgconf-bin, libpkgconf3
ii ${t}pkgconf-bin${t}${t}optional${t}${t}, libpkgconf3 (>= 1.8), libc6
ii ${t}libpkgconf3${t}${t}optional${t}${t}, libc6
ii ${t}libyaml-dev${t}${t}optional${t}${t}, libyaml-0-2:amd64 (= 0.2.5-1)
ii ${t}libyaml-0-2${t}${t}optional${t}${t}, libc6
ii ${t}libfoo-dev${t}${t}optional${t}${t}, gcc | clang, libbar-abi
ii ${t}libbar1${t}${t}optional${t}libbar-abi (= 1)${t}, libc6
rc ${t}libgone-dev${t}${t}optional${t}${t}, libc6
ii ${t}python3-numpy${t}${t}optional${t}${t}, python3
DB
printf '#!/bin/sh\ncat "%s"\n' "$tmp/dpkg-db" >"$tmp/bin/dpkg-query"
chmod +x "$tmp/bin/dpkg-query"
cat >"$tmp/install-deps.sh" <<'SH'
packages=(
    build-essential cmake pkg-config # not-dev
    libyaml-dev libfoo-dev
    python3-numpy
)
SH
got=$(PATH=$tmp/bin:$PATH python3 "$src/tests/gpu/bare_packages.py" "$tmp/install-deps.sh") ||
    fail "bare_packages.py failed: $got"
want=$(printf '%s\n' libbar1 libfoo-dev libpkgconf3 libyaml-0-2 libyaml-dev pkg-config pkgconf \
    pkgconf-bin)
[ "$got" = "$want" ] || fail "bare_packages.py printed [$got], expected [$want]"
echo "PASS: bare_packages.py without cmake and python3 installed by dpkg"

# 2. A copy of the kit, as root (a fake id), with one .deb and two packages.
kit=$tmp/kit
mkdir -p "$kit/tests/gpu" "$kit/.gpu-deps" "$kit/fake"
cp "$src/tests/gpu/test_bare_build.sh" "$src/tests/gpu/gpu_deps.sh" "$kit/tests/gpu/"
touch "$kit/.gpu-deps/libyaml-dev_0.2.5-1_amd64.deb"
printf 'print("libyaml-dev\\nlibgone-dev")\n' >"$kit/tests/gpu/bare_packages.py"
printf '#!/bin/sh\necho 0\n' >"$kit/fake/id"
printf '#!/bin/sh\necho /usr/include/yaml.h\necho "dpkg-query: package %s is not installed" >&2\nexit 1\n' \
    "'libgone-dev'" >"$kit/fake/dpkg"
printf '#!/bin/sh\ntouch "%s"\n' "$tmp/unshare-ran" >"$kit/fake/unshare"
chmod +x "$kit/fake/"*
out=$(PATH=$kit/fake:$PATH "$kit/tests/gpu/test_bare_build.sh" build 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "test_bare_build.sh passed although dpkg -L failed"
[ ! -e "$tmp/unshare-ran" ] || fail "test_bare_build.sh went on to hide files after dpkg -L failed"
grep -q 'dpkg -L failed' <<<"$out" || fail "test_bare_build.sh did not say that dpkg -L failed"
echo "PASS: test_bare_build.sh stops when dpkg -L fails"
