#!/usr/bin/env bash
# Installs the Debian packages libllmt needs to build and test, skipping those
# already present, and the Python package tokenizers (below). Run it as the
# user who runs the tests, not under sudo: it calls sudo for apt-get only
# (as root it needs none), and tokenizers goes to the running user's site
# (`sudo tools/install-deps.sh` would put it in /root/.local).
set -euo pipefail

packages=(
    build-essential cmake pkg-config binutils
    libopenblas-dev libdnnl-dev libyaml-dev libxxhash-dev libcmocka-dev
    clang libclang-rt-14-dev
    python3-numpy python3-pytest python3-matplotlib python3-pip python3-venv
    openmpi-bin libopenmpi-dev python3-mpi4py
)

# Python packages Debian 12 does not ship, for /usr/bin/python3 (the one the
# tests run): tokenizers, for python -m llmt.tokenize and its tests. Pinned,
# from PyPI as a prebuilt wheel only (never a source build, which would need
# a Rust toolchain), without its dependency huggingface_hub (used only to
# download tokenizers, which llmt.tokenize does not do), into the running
# user's site-packages (~/.local; root's in CI), where it shadows no Debian
# package.
install_python_packages() {
    /usr/bin/python3 -c 'import tokenizers' 2>/dev/null && return 0
    echo "install-deps: pip install --user --only-binary=:all: tokenizers==0.23.3"
    /usr/bin/python3 -m pip install -q --user --no-deps --only-binary=:all: \
        --break-system-packages --root-user-action=ignore tokenizers==0.23.3
}

# Where nvcc is: the cuDNN frontend's headers (pinned pip wheel, from PyPI)
# in .gpu-deps/cudnn-frontend/include, for the CUDA plugin's cuDNN attention
# (tests/gpu/gpu_deps.sh; cuda/CMakeLists.txt finds them there).
install_cudnn_frontend() {
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || return 0
    local root
    root=$(cd "$(dirname "$0")/.." && pwd)
    # shellcheck source=tests/gpu/gpu_deps.sh
    . "$root/tests/gpu/gpu_deps.sh"
    gpu_deps_cudnn_frontend "$root/.gpu-deps/cudnn-frontend"
}

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { install_python_packages; install_cudnn_frontend; exit 0; }

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root to install ${missing[*]}" >&2; exit 1; }
    sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_python_packages
install_cudnn_frontend
