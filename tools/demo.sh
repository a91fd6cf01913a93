#!/usr/bin/env bash
# The main job. For now (the trainer is not built yet) it builds the library
# and runs the context demo, which prints the memory accounting.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build/demo -DCMAKE_BUILD_TYPE=Release -DLLMT_BUILD_TESTS=OFF
cmake --build build/demo -j"$(nproc)"
build/demo/examples/llmt-context-demo
