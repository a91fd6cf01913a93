#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, builds with
# warnings as errors and runs every test, then does the same again with
# AddressSanitizer and UndefinedBehaviorSanitizer, then runs the libFuzzer
# targets of the file readers for a bounded time.
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
echo "== all tests passed =="
