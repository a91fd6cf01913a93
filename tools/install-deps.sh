#!/usr/bin/env bash
# Installs the Debian packages libllmt needs to build and test, skipping those
# already present. Run as root (or with sudo available).
set -euo pipefail

packages=(
    build-essential cmake pkg-config binutils
    libopenblas-dev libdnnl-dev libyaml-dev libxxhash-dev libcmocka-dev
    clang libclang-rt-14-dev
    python3-numpy python3-pytest python3-matplotlib python3-pip python3-venv
)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root to install ${missing[*]}" >&2; exit 1; }
    sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
