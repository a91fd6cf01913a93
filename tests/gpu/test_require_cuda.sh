#!/usr/bin/env bash
# CTest's gpu_require_cuda: LLMT_REQUIRE_CUDA=1 makes the CUDA tests fail
# where they would skip, at the level of ctest itself (tests/gpu/run.sh
# relies on it so that a GPU run cannot pass without the GPU).
#
#   test_require_cuda.sh CTEST TESTS_BUILD_DIR BENCH_GPU_STEP
#
# Without a usable CUDA device (the usual CI machine): plain ctest reports
# test_ops_cuda and test_cuda_model skipped and succeeds; with
# LLMT_REQUIRE_CUDA=1 it reports both failed, with the reason, and fails;
# bench_gpu_step exits 77, and 1 under LLMT_REQUIRE_CUDA=1. With a device,
# both ctest runs pass (the benchmark is tests/gpu/run.sh's). The inner
# ctest runs in the tests/ build directory, so its Testing/ logs do not meet
# those of the ctest running this.
set -uo pipefail
ctest=$1 dir=$2 bench=$3
fail() {
    echo "FAIL: $*"
    exit 1
}

cuda_ctest() { # LLMT_REQUIRE_CUDA value
    LLMT_REQUIRE_CUDA=$1 "$ctest" --test-dir "$dir" --output-on-failure \
        -R '^(test_ops_cuda|test_cuda_model)$' 2>&1
}
plain=$(cuda_ctest 0)
plain_rc=$?
required=$(cuda_ctest 1)
required_rc=$?
printf '%s\n--- LLMT_REQUIRE_CUDA=1:\n%s\n' "$plain" "$required"

echo "$plain" | grep -q 'out of 2$' || fail "ctest did not run the two CUDA tests"
skipped=$(echo "$plain" | grep -cE '(test_ops_cuda|test_cuda_model) .*\*\*\*Skipped')
case $skipped in
2) # no device
    [ "$plain_rc" -eq 0 ] || fail "without LLMT_REQUIRE_CUDA, skipped tests made ctest fail"
    [ "$required_rc" -ne 0 ] || fail "LLMT_REQUIRE_CUDA=1 ctest passed without a CUDA device"
    [ "$(echo "$required" | grep -cE '(test_ops_cuda|test_cuda_model) .*\*\*\*Failed')" -eq 2 ] ||
        fail "LLMT_REQUIRE_CUDA=1: both CUDA tests should be reported failed"
    echo "$required" | grep -q 'LLMT_REQUIRE_CUDA=1, but no CUDA backend: ' ||
        fail "LLMT_REQUIRE_CUDA=1: the failure does not give the reason"
    LLMT_REQUIRE_CUDA=0 "$bench" 1 1b >/dev/null
    rc=$?
    [ "$rc" -eq 77 ] || fail "bench_gpu_step without a device: exit $rc, expected 77"
    LLMT_REQUIRE_CUDA=1 "$bench" 1 1b >/dev/null
    rc=$?
    [ "$rc" -eq 1 ] || fail "LLMT_REQUIRE_CUDA=1 bench_gpu_step without a device: exit $rc, expected 1"
    echo "PASS: no CUDA device: skipped without LLMT_REQUIRE_CUDA, failed with it"
    ;;
0) # a device
    if [ "$plain_rc" -ne 0 ] || [ "$required_rc" -ne 0 ]; then
        fail "the CUDA tests fail on this device"
    fi
    echo "PASS: a CUDA device: the CUDA tests pass, with and without LLMT_REQUIRE_CUDA=1"
    ;;
*) fail "one CUDA test skipped and the other did not" ;;
esac
