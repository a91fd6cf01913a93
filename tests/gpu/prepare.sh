#!/usr/bin/env bash
# Run HERE, with Debian's apt reachable, before a GPU run: downloads the
# Debian 12 (bookworm) .debs of what the build needs and the GPU machine's
# image may lack (GPU_DEPS_PACKAGES in gpu_deps.sh: OpenBLAS with its Fortran
# runtime, oneDNN with the OpenCL loader it links, libyaml, xxHash, CMocka,
# pkgconf) into .gpu-deps/ (git-ignored), which the device call
# carries (`carry: [".gpu-deps"]`). tests/gpu/run.sh unpacks them into a
# private prefix there, with no network and without touching /. It also
# puts the cuDNN frontend's headers (pinned pip wheel, from PyPI) in
# .gpu-deps/cudnn-frontend/include, where the plugin's build finds them.
#
#   tests/gpu/prepare.sh          (about 23 MiB; nothing is downloaded twice)
#
# libc6, libgcc-s1, libstdc++6 and libgomp1, the packages' remaining
# dependencies, are in every glibc system with a compiler; the .debs need glibc >= 2.34 (Debian 12 has
# 2.36, Ubuntu 24.04 2.39), which tests/gpu/run.sh checks there.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.gpu-deps
# shellcheck source=tests/gpu/gpu_deps.sh
. tests/gpu/gpu_deps.sh
packages=("${GPU_DEPS_PACKAGES[@]}")

declare -A file # package -> the .deb file name apt would fetch now
missing=()
for p in "${packages[@]}"; do
    # apt's own error (stderr) stays visible: it says why.
    if ! uri=$(apt-get download --print-uris "$p"); then
        echo "prepare.sh: apt cannot download $p (its error is above; run apt-get update?)" >&2
        exit 1
    fi
    file[$p]=$(awk '{print $2}' <<<"$uri")
    if [ -z "${file[$p]}" ]; then
        echo "prepare.sh: apt names no .deb to download for $p" >&2
        exit 1
    fi
    [ -f "$dest/${file[$p]}" ] || missing+=("$p")
done
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chown _apt "$tmp" 2>/dev/null || true # apt downloads as _apt where it can
if [ ${#missing[@]} -gt 0 ]; then
    (cd "$tmp" && apt-get download "${missing[@]}")
    mv "$tmp"/*.deb "$dest"/
fi
# One version per package: drop what an older run left.
for p in "${packages[@]}"; do
    for f in "$dest/${p}_"*.deb; do
        [ "$(basename "$f")" = "${file[$p]}" ] || rm -f "$f"
    done
done
count=$(find "$dest" -name '*.deb' | wc -l)
if [ "$count" -ne ${#packages[@]} ]; then
    echo "prepare.sh: expected ${#packages[@]} .debs in $dest, found $count" >&2
    exit 1
fi
gpu_deps_cudnn_frontend "$dest/cudnn-frontend"
echo "prepare.sh: $count .debs in $dest ($(du -sh "$dest" | cut -f1)); carry \".gpu-deps\""
