#!/bin/sh
# Installs the built tree into a temporary prefix, then builds and runs a small
# consumer twice: once through find_package(llmt) and once through pkg-config.
# Usage: check_install.sh BUILD_DIR CONSUMER_SOURCE_DIR
set -eu
build_dir=$1
consumer=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build_dir" --prefix "$tmp/prefix" > "$tmp/install.log"

cmake -S "$consumer" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/cfg.log"
cmake --build "$tmp/cmake-build" > "$tmp/build.log"
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/cmake-build/consumer_shared"
"$tmp/cmake-build/consumer_static"

libdir=$(find "$tmp/prefix" -name llmt.pc -exec dirname {} \;)
PKG_CONFIG_PATH="$libdir" cc -o "$tmp/consumer_pc" "$consumer/consumer.c" \
    $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs llmt)
LD_LIBRARY_PATH="$(dirname "$libdir")" "$tmp/consumer_pc"
echo "ok: installed package consumed through CMake (shared, static) and pkg-config"
