# shellcheck shell=bash
# Sourced by tests/gpu/run.sh (and prepare.sh, test_bare_build.sh): unpacks the .debs that tests/gpu/prepare.sh
# downloaded into a private prefix and points the build at them, so the
# project builds where its Debian -dev packages are not installed and cannot
# be (no network), without writing outside the prefix.
#
#   gpu_deps_unpack DEBS_DIR PREFIX
#
# On success it exports PKG_CONFIG_LIBDIR (only the prefix's .pc files are
# seen: the build cannot pick up the system's by accident), LD_LIBRARY_PATH
# (the prefix's libraries first, for the programs built against them, and
# OpenBLAS's libgfortran, which no RUNPATH names), GPU_DEPS_PKG_CONFIG
# (the prefix's pkgconf, for CMake's PKG_CONFIG_EXECUTABLE) and
# GPU_DEPS_ONEDNN_INCLUDE_DIR and GPU_DEPS_ONEDNN_LIBRARY (oneDNN has no
# pkg-config module: run.sh passes them to CMake as LLMT_ONEDNN_INCLUDE_DIR
# and LLMT_ONEDNN_LIBRARY). It unpacks with dpkg-deb, or with ar and tar
# where dpkg is absent (or GPU_DEPS_NO_DPKG=1).

# The packages (tests/gpu/prepare.sh downloads them): the closure of the
# build's -dev packages (apt-cache depends), without libc6, libgcc-s1 and the
# empty meta-packages (libopenblas-dev, libopenblas0, pkgconf).
# shellcheck disable=SC2034 # used by the scripts that source this file
GPU_DEPS_PACKAGES=(libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0
                   libyaml-0-2 libyaml-dev libxxhash0 libxxhash-dev libcmocka0 libcmocka-dev
                   pkgconf-bin libpkgconf3 libdnnl2 libdnnl-dev ocl-icd-libopencl1)

# The cuDNN frontend (header-only, MIT licence) for the CUDA plugin's cuDNN
# attention (cuda/CMakeLists.txt looks in .gpu-deps/cudnn-frontend/include):
# its headers from the pinned pip wheel, checked against its SHA-256.
# shellcheck disable=SC2034
GPU_DEPS_CUDNN_FRONTEND_VERSION=1.32.0
GPU_DEPS_CUDNN_FRONTEND_SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0

#   gpu_deps_cudnn_frontend DEST
# Downloads the wheel with pip (PyPI) and puts its include/ and licences in
# DEST (its VERSION file names the version); nothing is downloaded when DEST
# already holds that version.
gpu_deps_cudnn_frontend() {
    local dest=$1 ver=$GPU_DEPS_CUDNN_FRONTEND_VERSION tmp whl sum
    if [ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$ver" ]; then
        return 0
    fi
    tmp=$(mktemp -d) || return 1
    # The wheel is the same headers for every Python; this one's tag is pinned.
    if ! python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp \
        --python-version 3.11 --abi cp311 --platform manylinux_2_28_x86_64 -d "$tmp" \
        "nvidia-cudnn-frontend==$ver"; then
        echo "gpu_deps: pip cannot download nvidia-cudnn-frontend==$ver (its error is above)" >&2
        rm -rf "$tmp"
        return 1
    fi
    whl=$(ls "$tmp"/nvidia_cudnn_frontend-*.whl)
    sum=$(sha256sum "$whl" | cut -d' ' -f1)
    if [ "$sum" != "$GPU_DEPS_CUDNN_FRONTEND_SHA256" ]; then
        echo "gpu_deps: $(basename "$whl") has SHA-256 $sum, not $GPU_DEPS_CUDNN_FRONTEND_SHA256" >&2
        rm -rf "$tmp"
        return 1
    fi
    python3 -m zipfile -e "$whl" "$tmp/x" || { rm -rf "$tmp"; return 1; }
    rm -rf "$dest"
    mkdir -p "$dest"
    mv "$tmp/x/include" "$dest/include"
    cp "$tmp"/x/nvidia_cudnn_frontend-*.dist-info/licenses/* "$dest/"
    echo "$ver" >"$dest/VERSION"
    rm -rf "$tmp"
    echo "gpu_deps: cuDNN frontend $ver headers in $dest/include"
}

gpu_deps_unpack() {
    local debs=$1 prefix=$2 deb n=0
    local multiarch=usr/lib/x86_64-linux-gnu
    rm -rf "$prefix"
    mkdir -p "$prefix"
    for deb in "$debs"/*.deb; do
        [ -f "$deb" ] || continue
        if [ -z "${GPU_DEPS_NO_DPKG:-}" ] && command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$deb" "$prefix" || return 1
        else # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
            local member z
            member=$(ar t "$deb" | grep '^data\.tar') || return 1
            case $member in
            *.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *) z= ;;
            esac
            ar p "$deb" "$member" | tar -x $z -f - -C "$prefix" || return 1
        fi
        n=$((n + 1))
    done
    if [ "$n" -eq 0 ]; then
        echo "gpu_deps: no .debs in $debs: run tests/gpu/prepare.sh here and carry .gpu-deps" >&2
        return 1
    fi
    # The .pc files name /usr (some in every line): make them name the prefix.
    local pc
    while IFS= read -r pc; do
        sed -i -E "s#(^|[=[:space:]]|-[IL])/usr(/|[[:space:]]|\$)#\\1$prefix/usr\\2#g" "$pc" || return 1
    done < <(find "$prefix" -name '*.pc')
    export PKG_CONFIG_LIBDIR="$prefix/$multiarch/pkgconfig:$prefix/$multiarch/openblas-pthread/pkgconfig"
    export PKG_CONFIG_PATH=
    export LD_LIBRARY_PATH="$prefix/$multiarch/openblas-pthread:$prefix/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export GPU_DEPS_PKG_CONFIG="$prefix/usr/bin/pkgconf"
    export GPU_DEPS_ONEDNN_INCLUDE_DIR="$prefix/usr/include"
    export GPU_DEPS_ONEDNN_LIBRARY="$prefix/$multiarch/libdnnl.so"
    local missing
    missing=$("$GPU_DEPS_PKG_CONFIG" --print-errors --exists openblas yaml-0.1 libxxhash cmocka 2>&1) || {
        echo "gpu_deps: the unpacked prefix lacks a package: $missing" >&2
        return 1
    }
    local f
    for f in "$GPU_DEPS_ONEDNN_INCLUDE_DIR/oneapi/dnnl/dnnl.h" "$GPU_DEPS_ONEDNN_LIBRARY"; do
        [ -e "$f" ] || {
            echo "gpu_deps: the unpacked prefix lacks oneDNN's $f (libdnnl-dev, libdnnl2)" >&2
            return 1
        }
    done
    echo "gpu_deps: $n .debs unpacked into $prefix; pkg-config sees only" \
        "$("$GPU_DEPS_PKG_CONFIG" --list-all | awk '{print $1}' | sort | tr '\n' ' ')"
}
