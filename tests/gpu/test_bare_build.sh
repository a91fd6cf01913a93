#!/usr/bin/env bash
# CI check of the GPU kit's build path (tools/test.sh runs it): builds with
# tests/gpu/run.sh --build-only where the project's Debian packages are
# absent, as on the GPU machine's image, using only what
# tests/gpu/prepare.sh put in .gpu-deps/ (run that first).
#
#   tests/gpu/test_bare_build.sh [build-dir]      (default build/gpu-bare)
#
# "Absent": in a private mount namespace (unshare -m, needs root), every file
# that `dpkg -L` lists for the carried packages (GPU_DEPS_PACKAGES: the -dev
# packages, their libraries, pkgconf) is covered by an empty file (a bind
# mount of /dev/null). Headers, libraries, .pc files and pkg-config itself
# then read as empty wherever the build might find them outside the prefix,
# and only for this process tree: the machine's packages stay installed for
# everything else. A chroot would need a whole second system; a container
# is not available here. The loader's cache (/etc/ld.so.cache) is covered
# too, so the CUDA toolkit's libraries are outside the loader's path, as
# they may be on the GPU machine: the plugin must find libcublasLt through
# its RUNPATH.
#
# Passes when, in there, the system's packages are shown to be hidden, and
# run.sh's deps, configure (CUDA plugin included, where nvcc is), build,
# plugin and cpu-smoke stages all pass (device and the GPU stages are not
# part of this check).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$PWD/${1:-build/gpu-bare}
[ "$(id -u)" -eq 0 ] || { echo "test_bare_build.sh: needs root (unshare -m, mount)"; exit 1; }
ls .gpu-deps/*.deb >/dev/null 2>&1 || { echo "test_bare_build.sh: no .gpu-deps: run tests/gpu/prepare.sh"; exit 1; }
# shellcheck source=tests/gpu/gpu_deps.sh
. tests/gpu/gpu_deps.sh
mapfile -t hide < <(dpkg -L "${GPU_DEPS_PACKAGES[@]}" | sort -u)
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
bad = [f"{n}: {status.get(n, 'missing')}" for n in need if status.get(n) != "pass"]
if bad:
    sys.exit("FAIL: run.sh --build-only with the Debian packages hidden: " + ", ".join(bad))
print("PASS: with the Debian packages hidden, run.sh's " + ", ".join(need) + " stages passed")
PY
