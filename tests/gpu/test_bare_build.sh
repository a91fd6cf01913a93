#!/usr/bin/env bash
# CI check of the GPU kit's build path (tools/test.sh runs it): builds with
# tests/gpu/run.sh --build-only where the project's Debian development
# packages are absent, as on the GPU machine's image, using only what
# tests/gpu/prepare.sh put in .gpu-deps/ (run that first). About a minute.
#
#   tests/gpu/test_bare_build.sh [build-dir]      (default build/gpu-bare)
#
# "Absent": the packages tests/gpu/bare_packages.py names, which it derives
# from tools/install-deps.sh (its -dev packages and pkg-config, with what
# they depend on, less what a bare machine has: a compiler, cmake, python3),
# not from the kit's own list: a dependency added to install-deps.sh and
# forgotten in the kit fails this check. In a private mount namespace
# (unshare -m, needs root) every file that `dpkg -L` lists for them is
# covered by an empty file (a bind mount of /dev/null): headers, libraries,
# .pc files and pkg-config itself read as empty wherever the build might
# find them outside the prefix, and only for this process tree. A chroot
# would need a whole second system; a container is not available here. The
# loader's cache (/etc/ld.so.cache) is covered too, so the CUDA toolkit's
# libraries are outside the loader's path, as they may be on the GPU
# machine: the plugin must find libcublasLt through its RUNPATH.
#
# Passes when, in there, the system's packages are shown to be hidden, and
# run.sh's deps, configure, build, plugin and cpu-smoke stages all pass
# (without nvcc the build has no CUDA plugin and the plugin stage is "not
# applicable"; device and the GPU stages are not part of this check).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/gpu-bare}
case $build in /*) ;; *) build=$PWD/$build ;; esac
[ "$(id -u)" -eq 0 ] || { echo "test_bare_build.sh: needs root (unshare -m, mount)"; exit 1; }
ls .gpu-deps/*.deb >/dev/null 2>&1 || { echo "test_bare_build.sh: no .gpu-deps: run tests/gpu/prepare.sh"; exit 1; }
list=$(python3 tests/gpu/bare_packages.py tools/install-deps.sh) # exits here if it fails
mapfile -t packages <<<"$list"
# shellcheck source=tests/gpu/gpu_deps.sh
. tests/gpu/gpu_deps.sh
echo "hiding ${packages[*]}"
not_carried=$(comm -23 <(printf '%s\n' "${packages[@]}" | sort) \
    <(printf '%s\n' "${GPU_DEPS_PACKAGES[@]}" | sort) | tr '\n' ' ')
echo "of which the kit does not carry (the build must not need them): ${not_carried:-none}"
# Captured first: a failing `dpkg -L` (a package it cannot list) stops the
# check here, rather than leaving that package's files visible.
files=$(dpkg -L "${packages[@]}") || { echo "test_bare_build.sh: dpkg -L failed (above)"; exit 1; }
# Links are covered only when they lead to a file that is hidden too: a
# mount follows the link, so covering, say, zlib1g-dev's libz.so would cover
# the runtime libz.so.1.2.13 of zlib1g, which the bare machine has (cmake
# and dpkg-deb then fail to start).
mapfile -t hide < <(sort -u <<<"$files" | python3 -c '
import os, sys
paths = [line.rstrip("\n") for line in sys.stdin]
regular = {os.path.realpath(p) for p in paths if os.path.isfile(p) and not os.path.islink(p)}
for p in paths:
    if not os.path.islink(p) or os.path.realpath(p) in regular:
        print(p)')
rm -rf "$build"
mkdir -p "$build"

# shellcheck disable=SC2016 # expanded by the inner shell
unshare -m bash -euo pipefail -c '
    build=$1
    shift
    mount --make-rprivate /
    n=0
    for f in "$@"; do
        if [ -f "$f" ]; then # regular files, and links to them (mount follows them)
            mount --bind /dev/null "$f"
            n=$((n + 1))
        fi
    done
    echo "hid $n files of the Debian packages"
    mount --bind /dev/null /etc/ld.so.cache
    ! ldconfig -p | grep -q libcublasLt || { echo "FAIL: the loader cache still lists libcublasLt"; exit 1; }
    # The hiding works: the system toolchain no longer finds libyaml.
    if printf "#include <yaml.h>\nint main(void) { return !yaml_get_version_string(); }\n" |
        cc -x c - -o "$build/yaml-probe" -lyaml 2>/dev/null; then
        echo "FAIL: a program using libyaml still builds with the system packages hidden"
        exit 1
    fi
    ! pkg-config --exists yaml-0.1 2>/dev/null || { echo "FAIL: pkg-config still finds yaml-0.1"; exit 1; }
    OUT=$build/kit tests/gpu/run.sh --build-only "$build" || true
' bare "$build" "${hide[@]}"

summary=$build/kit/gpu-summary.json
[ -s "$summary" ] || { echo "FAIL: run.sh wrote no $summary"; exit 1; }
python3 - "$summary" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
status = {st["name"]: st["status"] for st in s["stages"]}
need = ["deps", "configure", "build", "plugin", "cpu-smoke"]
ok = {n: ("pass", "not applicable") if n == "plugin" else ("pass",) for n in need}
bad = [f"{n}: {status.get(n, 'missing')}" for n in need if status.get(n) not in ok[n]]
if bad:
    sys.exit("FAIL: run.sh --build-only with the Debian packages hidden: " + ", ".join(bad))
print("PASS: with the Debian packages hidden, run.sh's "
      + ", ".join(f"{n} ({status[n]})" for n in need))
PY
