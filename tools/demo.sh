#!/usr/bin/env bash
# The main job: builds libllmt and llmt-train, then trains the default model
# (3M parameters, byte-level) on the licence texts of this Debian system, with
# checkpoints, in runs/demo. Run it again to resume; Ctrl-C saves and stops.
# Extra arguments go to llmt-train (--steps N, --out DIR, --config FILE,
# KEY=VALUE configuration overrides, ...; llmt-train --help).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build/demo -DCMAKE_BUILD_TYPE=Release -DLLMT_BUILD_TESTS=OFF
cmake --build build/demo -j"$(nproc)" --target llmt-train
# OpenBLAS 0.3.21 does not recognise recent CPUs and falls back to its SSE3
# kernels; where AVX2 and FMA are present, its Haswell kernels are 2.5x
# faster (docs/PERFORMANCE.md). A value already set is left alone.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
fi
exec build/demo/examples/llmt-train "$@"
