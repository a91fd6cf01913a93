#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, builds with
# warnings as errors and runs every test, then does the same again with
# AddressSanitizer and UndefinedBehaviorSanitizer, then runs the libFuzzer
# targets of the file readers for a bounded time, then (where the CUDA
# toolkit is found) the CUDA backend's op and model tests on the CPU
# emulator of its kernels (tests/gpu/emulate.sh; not a GPU run).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh

jobs=$(nproc)
run_suite() { # build-dir cmake-args...
    local dir=$1
    shift
    cmake -S . -B "$dir" -DLLMT_WERROR=ON "$@"
    cmake --build "$dir" -j"$jobs"
    ctest --test-dir "$dir" --output-on-failure
}

echo "== release build (CUDA backend built where nvcc is found) =="
run_suite build/test -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=AUTO
echo "== sanitizer build (ASan + UBSan, CPU backend) =="
run_suite build/test-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMT_SANITIZE=ON -DLLMT_CUDA=OFF
echo "== fuzzers (libFuzzer + ASan + UBSan, bounded time) =="
CC=clang cmake -S . -B build/test-fuzz -DLLMT_FUZZ=ON -DLLMT_CUDA=OFF -DLLMT_BUILD_EXAMPLES=OFF
cmake --build build/test-fuzz -j"$jobs" --target fuzz_manifest fuzz_safetensors
ctest --test-dir build/test-fuzz --output-on-failure
# The release build found a CUDA compiler (and so built the plugin) or not.
if grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=/' build/test/CMakeCache.txt; then
    echo "== CUDA kernels on the CPU emulator (not a GPU run) =="
    tests/gpu/emulate.sh build/test
else
    echo "== no CUDA toolkit: the CUDA backend is neither built nor emulated =="
fi
echo "== all tests passed =="
