#!/usr/bin/env bash
# The GPU checks, as one script for a machine with a CUDA GPU (made for one
# H100/H200; about 4 minutes expected, every stage under a timeout): build
# with the CUDA plugin into its own directory, run the op tests (test_ops,
# test_ops_cuda) and test_cuda_model with their output in full, then the
# rest of the suite, then the step benchmark, whose table ends
# the output.
#
#   tests/gpu/run.sh [build-dir]      (default build/gpu)
#
# Exit status: 0 when every stage passed, else the number of failed stages.
# Nothing here needs the network.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/gpu}
jobs=$(nproc 2>/dev/null || echo 4)
failed=0
t0=$(date +%s)

stage() { # name: prints a header with the elapsed time
    echo
    echo "=== $1 ($(($(date +%s) - t0)) s) ==="
}

stage "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
nvcc --version 2>&1 | tail -1 || true

stage "build ($build, CUDA on, warnings are errors)"
mkdir -p "$build"
if ! timeout 300 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=ON \
        -DLLMT_WERROR=ON >"$build/configure.log" 2>&1; then
    cat "$build/configure.log"
    echo "configure failed"
    exit 1
fi
timeout 360 cmake --build "$build" -j"$jobs" >"$build/build.log" 2>&1
rc=$?
grep -E "error:|warning:|Error [0-9]" "$build/build.log" | head -40
if [ $rc -ne 0 ]; then
    tail -60 "$build/build.log"
    echo "build failed"
    exit 1
fi

stage "CUDA op tests (test_ops: CPU vs double reference; test_ops_cuda: CUDA vs CPU)"
timeout 150 ctest --test-dir "$build" -R '^test_ops(_cuda)?$' -V --timeout 120 ||
    failed=$((failed + 1))

stage "CUDA model tests (test_cuda_model: gradients, 50 AdamW steps, determinism)"
timeout 200 ctest --test-dir "$build" -R '^test_cuda_model$' -V --timeout 180 ||
    failed=$((failed + 1))

stage "the whole suite"
timeout 240 ctest --test-dir "$build" --output-on-failure -j"$((jobs < 8 ? jobs : 8))" \
    --timeout 200 -E '^(test_ops|test_ops_cuda|test_cuda_model)$' || failed=$((failed + 1))

stage "step benchmark (bench_gpu_step)"
timeout 240 "$build/tests/bench/bench_gpu_step" 3 all || failed=$((failed + 1))

stage "done: $failed failed stage(s)"
exit $failed
