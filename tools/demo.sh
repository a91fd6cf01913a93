#!/usr/bin/env bash
# The main job: builds libllmt and llmt-train, then trains the default model
# (3M parameters, byte-level) on the licence texts of this Debian system, with
# checkpoints, in runs/demo. Run it again to resume; Ctrl-C saves and stops.
# Extra arguments go to llmt-train (--steps N, --out DIR, --config FILE,
# KEY=VALUE configuration overrides, ...; llmt-train --help).
# The CUDA backend (train.backend=cuda) is built where a GPU is visible and
# nvcc is found; LLMT_CUDA=AUTO|ON|OFF in the environment decides instead.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
if [ -z "${LLMT_CUDA:-}" ]; then
    LLMT_CUDA=OFF
    if [ -e /dev/nvidiactl ] || nvidia-smi -L > /dev/null 2>&1; then
        LLMT_CUDA=AUTO
    fi
fi
cmake -S . -B build/demo -DCMAKE_BUILD_TYPE=Release -DLLMT_BUILD_TESTS=OFF -DLLMT_CUDA="$LLMT_CUDA"
cmake --build build/demo -j"$(nproc)" --target llmt-train
exec build/demo/examples/llmt-train "$@"
