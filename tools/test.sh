#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, builds with
# warnings as errors and runs every test, then runs the README's first
# command (tools/demo.sh, 3 steps) in a fresh clone of HEAD, then builds and
# runs the tests again with AddressSanitizer and UndefinedBehaviorSanitizer,
# then runs the libFuzzer targets of the file readers for a bounded time,
# then (where the CUDA toolkit is found) the CUDA backend's op and model
# tests on the CPU emulator of its kernels (tests/gpu/emulate.sh; not a GPU
# run), then the GPU kit's build from its carried Debian packages with the
# system's hidden (tests/gpu/ci_bare_build.sh: as root with apt-get, as CI
# runs; elsewhere it says it was NOT run, and why).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
# install-deps.sh installed tokenizers: its tests fail here rather than skip.
export LLMT_REQUIRE_TOKENIZERS=1

jobs=$(nproc)
run_suite() { # build-dir cmake-args...
    local dir=$1
    shift
    cmake -S . -B "$dir" -DLLMT_WERROR=ON "$@"
    cmake --build "$dir" -j"$jobs"
    ctest --test-dir "$dir" --output-on-failure --timeout 900 # no test may hang CI
}

echo "== release build (CUDA backend built where nvcc is found) =="
# The plugin's device code for sm_80 only: the GPU kit's build below
# compiles it for sm_90 (its default off a GPU), so CI compiles each of the
# default architectures once, and runs neither (no GPU).
run_suite build/test -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=AUTO -DLLMT_CUDA_ARCHITECTURES=80-real
echo "== the README's first command from a fresh clone (tools/demo.sh --steps 3) =="
# A clone of HEAD, as a new user gets it (only committed files): the demo
# must build and train there, and leave the clone as clean as it found it
# (runs/ and build/ are ignored). Its fast tier is under /dev/shm.
fresh=$(mktemp -d)
fresh_fast() { sed -n 's/^fast tier: \(.*\), every.*/\1/p' "$fresh/demo.log" 2>/dev/null; }
trap 'fresh_fast | while read -r d; do rm -rf "$d"; done; rm -rf "$fresh"' EXIT
git clone -q "$PWD" "$fresh/llmt"
(cd "$fresh/llmt" && tools/demo.sh --steps 3) > "$fresh/demo.log" 2>&1 ||
    { tail -20 "$fresh/demo.log"; echo "tools/demo.sh failed in a fresh clone" >&2; exit 1; }
grep -q "^final held-out loss" "$fresh/demo.log" || { cat "$fresh/demo.log"; exit 1; }
[ -z "$(git -C "$fresh/llmt" status --porcelain)" ] ||
    { git -C "$fresh/llmt" status --short; echo "the demo left untracked files" >&2; exit 1; }
rm -rf "$fresh"
trap - EXIT
echo "== sanitizer build (ASan + UBSan, CPU backend) =="
run_suite build/test-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMT_SANITIZE=ON -DLLMT_CUDA=OFF
echo "== fuzzers (libFuzzer + ASan + UBSan, bounded time) =="
# 10 s a fuzzer (LLMT_FUZZ_SECONDS is 20 by default): the suite's time.
CC=clang cmake -S . -B build/test-fuzz -DLLMT_FUZZ=ON -DLLMT_CUDA=OFF -DLLMT_BUILD_EXAMPLES=OFF \
    -DLLMT_FUZZ_SECONDS=10
cmake --build build/test-fuzz -j"$jobs" --target fuzz_manifest fuzz_safetensors
ctest --test-dir build/test-fuzz --output-on-failure
# The release build found a CUDA compiler (and so built the plugin) or not.
if grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=/' build/test/CMakeCache.txt; then
    echo "== CUDA kernels on the CPU emulator (not a GPU run) =="
    tests/gpu/emulate.sh build/test
else
    echo "== no CUDA toolkit: the CUDA backend is neither built nor emulated =="
fi
# Where root and apt-get are (the CUDA plugin is part of it where nvcc is);
# elsewhere the step prints that it was NOT run, and why.
echo "== GPU kit: its build with the Debian packages hidden (tests/gpu/test_bare_build.sh) =="
tests/gpu/ci_bare_build.sh build/test-gpu-bare
echo "== all tests passed =="
