#!/usr/bin/env bash
# The GPU check kit: one command for a machine with a CUDA GPU, made for the
# device tool's H200 (no network, 16 cores, CUDA 13, PyTorch in python3) and
# its first call. Every stage runs under a time limit, inside an overall
# budget of LLMT_GPU_KIT_BUDGET_S seconds (default 470, under 8 minutes), in
# this order (most valuable first; a failed stage does not stop the next):
#
#   device      GPU, driver, nvcc, compiler, OS and glibc, tools present
#   deps        unpack .gpu-deps/ (tests/gpu/prepare.sh, run beforehand on a
#               machine with Debian's apt) into a private prefix (gpu_deps.sh)
#   configure   CUDA on, for the GPU's own architecture (sm_90 on an H200),
#               LLMT_WERROR=OFF: an untried compiler's new warnings are
#               counted in the summary, not fatal (CI builds with -Werror)
#   build
#   plugin      the plugin has SASS for that architecture, and its RUNPATH
#               resolves libcublasLt (ldd)
#   cpu-smoke   CPU tests using OpenBLAS, libyaml, xxHash, CMocka from the prefix
#   ops         test_ops_cuda: every op on CUDA against the CPU, twice;
#               test_accumulate_cuda: the fp32 gradient sum against the host
#   model       test_cuda_model: gradients, training, determinism, recompute
#               and slicing bit-identity, safetensors through pinned staging
#   attention-cudnn gpu_attention_cudnn: cuDNN's fused attention against the
#               plugin's fp32 kernels (BF16, F16, GQA, hd 64 and 128, T up to
#               2048; backward bitwise run to run), then test_ops_cuda with
#               LLMT_CUDA_ATTENTION=cudnn and =fallback (either path passes)
#   offload     test_cuda_model's offload tests alone (test_offload_*):
#               optimizer state, alone or with the gradients, on the host
#               (whole, a fraction, moved mid-run) gives the device
#               optimizer's bits in all four precision modes; gradients
#               stored on the copy stream while backward runs, accumulated
#               over two micro-batches, give the device's bits; an ordered
#               slicer's sum split across them too
#   nccl-world1 gpu_nccl_world1: an NCCL communicator of one rank, every
#               collective on device buffers (tests/gpu/test_nccl_world1.c)
#   nccl-sharded gpu_nccl_sharded: the sharded optimizer over that
#               communicator takes bitwise the steps of an unsharded one
#               (bf16_mixed), also with its state of the embedding and
#               layer 0 on the host, and with their gradients too
#               (tests/gpu/test_nccl_sharded.c)
#   nccl-train  llmt-train --data-parallel on CUDA, one rank over NCCL: the
#               loss falls, a sharded checkpoint resumes to the bytes of an
#               uninterrupted run, and so does a run with optimizer+grads
#               offloaded (tests/gpu/train_nccl_world1.sh)
#   bench       bench_gpu_step on the ~1B LLaMA, T=2048, BF16_MIXED
#   torch       the same model and batch in PyTorch (torch_side_by_side.py)
#   memcheck    compute-sanitizer memcheck over the op tests (test_ops cuda)
#   racecheck   compute-sanitizer racecheck over the op tests
#   suite       the rest of the CTest suite
#
# LLMT_REQUIRE_CUDA=1 throughout: a CUDA test or the benchmark that cannot
# open a device FAILS instead of skipping, so nothing passes without the GPU.
# When the op tests find no device, the later GPU stages are recorded as not
# run.
#
#   tests/gpu/run.sh [--build-only] [build-dir]      (default build/gpu)
#
# --build-only stops after cpu-smoke (tests/gpu/test_bare_build.sh uses it);
# where nvcc is not found it builds without CUDA, the plugin stage "not
# applicable".
# Results: gpu-run.log (everything printed) and gpu-summary.json (each
# stage's status, seconds and note, the host, and the benchmark's and
# PyTorch's figures) in $OUT when set, else in <build-dir>/gpu-kit.
# The summary is written by python3 (tests/gpu/summary.py); without it there
# is none, and that counts as one more failure.
# Exit status: the number of stages that did not pass (0: all passed).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
root=$PWD
build_only=0
if [ "${1:-}" = --build-only ]; then
    build_only=1
    shift
fi
build=${1:-build/gpu}
budget=${LLMT_GPU_KIT_BUDGET_S:-470}
if [ $# -gt 1 ] || [[ $build == -* ]]; then
    echo "usage: tests/gpu/run.sh [--build-only] [build-dir]" >&2
    exit 2
fi
if ! [[ $budget =~ ^[0-9]+$ ]]; then
    echo "run.sh: LLMT_GPU_KIT_BUDGET_S must be whole seconds, not '$budget'" >&2
    exit 2
fi
case $build in /*) ;; *) build=$root/$build ;; esac
out=${OUT:-$build/gpu-kit}
mkdir -p "$out" "$build"
log=$out/gpu-run.log
summary=$out/gpu-summary.json
jobs=$(nproc 2>/dev/null || echo 4)
t0=$(date +%s)
exec > >(tee "$log") 2>&1
tee_pid=$!
export LLMT_REQUIRE_CUDA=1 CMOCKA_MESSAGE_OUTPUT=stdout
ld_path_before=${LD_LIBRARY_PATH:-} # for PyTorch, which must not see the prefix's libraries

# ---- stage bookkeeping

names=() states=() secs=() notes=()
record() { # name status seconds note
    names+=("$1")
    states+=("$2")
    secs+=("$3")
    notes+=("$4")
    echo "=== $1: $2 ($3 s)${4:+: $4}"
}

header() { # name limit
    echo
    echo "=== $1 (at $(($(date +%s) - t0)) s, limit $2 s) ==="
}

# Seconds left in the budget, less a margin for the summary.
left() { echo $((budget - ($(date +%s) - t0) - 5)); }

# run_stage NAME LIMIT COMMAND...: runs COMMAND under the smaller of LIMIT and
# what is left of the budget, its output also in $build/stage-NAME.log, and
# records pass, fail or timeout. $stage_note, if set, is added to the note.
run_stage() {
    local name=$1 limit=$2 rc start
    shift 2
    local rest
    rest=$(left)
    if [ "$rest" -lt 15 ]; then
        record "$name" "not run" 0 "the kit's time budget (${budget} s) is spent"
        return 1
    fi
    [ "$limit" -gt "$rest" ] && limit=$rest
    header "$name" "$limit"
    start=$(date +%s)
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$build/stage-$name.log"
    rc=${PIPESTATUS[0]}
    local d=$(($(date +%s) - start))
    if [ "$rc" -eq 0 ]; then
        record "$name" pass "$d" "${stage_note:-}"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        record "$name" timeout "$d" "stopped at its limit of $limit s${stage_note:+; $stage_note}"
    else
        record "$name" fail "$d" "exit status $rc${stage_note:+; $stage_note}"
    fi
    stage_note=
    return "$rc"
}
stage_note=

# Writes the summary and the closing table, and exits with the count of
# stages that did not pass ("not built yet" features and "not applicable"
# stages are listed, not counted).
finish() {
    local failed=0 i args=()
    for i in "${!names[@]}"; do
        case ${states[$i]} in pass | "not built yet" | "not applicable") ;; *) failed=$((failed + 1)) ;; esac
    done
    for i in "${!host_keys[@]}"; do args+=("${host_keys[$i]}" "${host_vals[$i]}"); done
    for i in "${!names[@]}"; do args+=("${names[$i]}" "${states[$i]}" "${secs[$i]}" "${notes[$i]}"); done
    # python3 writes the JSON (any text escaped); without it there is none.
    if ! python3 tests/gpu/summary.py "$summary" "$([ $build_only = 1 ] && echo build-only || echo full)" \
        "$budget" "$(($(date +%s) - t0))" "$failed" "$build/gpu-bench.json" "$build/gpu-torch.json" \
        "${#host_keys[@]}" "${args[@]}"; then
        echo "=== run.sh: python3 could not write $summary"
        rm -f "$summary"
        failed=$((failed + 1))
    fi
    echo
    echo "=== summary ($summary, log $log) ==="
    for i in "${!names[@]}"; do
        printf '%-11s %-14s %4d s  %s\n' "${names[$i]}" "${states[$i]}" "${secs[$i]}" \
            "$(printf '%s' "${notes[$i]}" | cut -c1-150)"
    done
    [ -s "$build/stage-bench.log" ] && grep -E "^(CUDA|1b|model|  +peak)" "$build/stage-bench.log"
    [ -s "$build/stage-torch.log" ] && grep -E "^(torch|eager|compile)" "$build/stage-torch.log"
    echo "=== $failed stage(s) did not pass; $(($(date +%s) - t0)) s"
    exec >&- 2>&- # let tee finish the log before the caller collects it
    wait "$tee_pid"
    exit "$failed"
}

# ---- device: what this machine has

host_keys=() host_vals=()
host() { # key value
    host_keys+=("$1")
    host_vals+=("$2")
    printf '%-18s %s\n' "$1" "$2"
}
header device 20
start=$(date +%s)
gpu=$(timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
    --format=csv,noheader 2>&1 | head -1)
gpu_ok=$?
host gpu "$gpu"
host os "$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
host glibc "$(getconf GNU_LIBC_VERSION 2>&1)"
host nvcc "$(nvcc --version 2>&1 | grep -i release | head -1)"
host cc "$(cc --version 2>&1 | head -1)"
host cmake "$(cmake --version 2>&1 | head -1)"
host compute_sanitizer "$(command -v compute-sanitizer || ls "$(dirname "$(command -v nvcc)")"/compute-sanitizer 2>/dev/null || echo absent)"
host python3 "$(command -v python3) $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -1)"
# The GPU's architecture: compute_cap 9.0 -> 90; 90 when nvidia-smi cannot say.
arch=$(echo "$gpu" | awk -F', ' '{print $4}' | tr -d '.')
[[ $arch =~ ^[0-9]+$ ]] || arch=90
host cuda_arch "sm_$arch"
# The driver's library, where the loader's cache lacks it (a mounted driver).
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        if [ -e "$d/libcuda.so.1" ]; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            ld_path_before=$LD_LIBRARY_PATH
            host libcuda "$d/libcuda.so.1 (not in ldconfig's cache: added to LD_LIBRARY_PATH)"
            break
        fi
    done
fi
if [ $gpu_ok -eq 0 ] && [ -n "$gpu" ]; then
    record device pass $(($(date +%s) - start)) "$gpu"
else
    record device fail $(($(date +%s) - start)) "nvidia-smi: ${gpu:-no output}"
fi

# ---- deps: the Debian packages, unpacked into a private prefix

header deps 60
start=$(date +%s)
# shellcheck source=tests/gpu/gpu_deps.sh
. tests/gpu/gpu_deps.sh
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$glibc" ] && [ "$(printf '%s\n2.34\n' "$glibc" | sort -V | head -1)" != 2.34 ]; then
    record deps fail 0 "glibc $glibc is older than the 2.34 the Debian 12 libraries need"
    finish
fi
if gpu_deps_unpack "$root/.gpu-deps" "$build/deps-prefix"; then
    record deps pass $(($(date +%s) - start)) "$(find .gpu-deps -name '*.deb' | wc -l) .debs from .gpu-deps"
else
    record deps fail $(($(date +%s) - start)) "could not unpack .gpu-deps (tests/gpu/prepare.sh, carried?)"
    finish
fi

# ---- configure and build

# cuBLASLt from the toolkit; from a pip wheel's nvidia/*/lib when the toolkit
# has none (then its headers too).
cmake_cuda=()
toolkit=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
if ! ls "$toolkit"/lib64/libcublasLt.so* "$toolkit"/targets/*/lib/libcublasLt.so* >/dev/null 2>&1; then
    wheel_lt=$(python3 -c 'import glob, nvidia
print(next(iter(sorted(f for p in nvidia.__path__ for f in glob.glob(p + "/*/lib/libcublasLt.so.*"))), ""))' 2>/dev/null)
    if [ -n "$wheel_lt" ]; then
        cmake_cuda+=(-DCUDA_cublasLt_LIBRARY="$wheel_lt"
                     "-DCMAKE_CUDA_FLAGS=-I$(dirname "$(dirname "$wheel_lt")")/include")
        host cublaslt_source "pip wheel: $wheel_lt"
    fi
fi
# NCCL (dlopened by the plugin, not linked) from the nvidia-nccl pip wheel
# when the toolkit has none: its nccl.h, and its lib/ in the plugin's RUNPATH.
if ! ls "$toolkit"/lib*/libnccl.so.2 "$toolkit"/targets/*/lib/libnccl.so.2 >/dev/null 2>&1; then
    wheel_nccl=$(python3 -c 'import glob, nvidia
print(next(iter(sorted(f for p in nvidia.__path__ for f in glob.glob(p + "/nccl/lib/libnccl.so.2"))), ""))' 2>/dev/null)
    if [ -n "$wheel_nccl" ]; then
        cmake_cuda+=(-DNCCL_LIBRARY="$wheel_nccl" -DNCCL_INCLUDE_DIR="$(dirname "$(dirname "$wheel_nccl")")/include")
        host nccl_source "pip wheel: $wheel_nccl"
    fi
fi
# cuDNN (dlopened by the plugin's attention, not linked) from the
# nvidia-cudnn pip wheel when the toolkit has none: its cudnn.h, and its lib/
# in the plugin's RUNPATH. The frontend's headers are in .gpu-deps.
if ! ls "$toolkit"/lib*/libcudnn.so.9 "$toolkit"/targets/*/lib/libcudnn.so.9 >/dev/null 2>&1; then
    wheel_cudnn=$(python3 -c 'import glob, nvidia
print(next(iter(sorted(f for p in nvidia.__path__ for f in glob.glob(p + "/*/lib/libcudnn.so.9"))), ""))' 2>/dev/null)
    if [ -n "$wheel_cudnn" ]; then
        cmake_cuda+=(-DCUDNN_LIBRARY="$wheel_cudnn" -DCUDNN_INCLUDE_DIR="$(dirname "$(dirname "$wheel_cudnn")")/include")
        host cudnn_source "pip wheel: $wheel_cudnn"
    fi
fi
generator=() # Ninja where there is one, unless the build directory has another
[ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null && generator=(-G Ninja)
# The CUDA plugin is built where nvcc is, and always outside --build-only
# (there a missing nvcc fails the configure stage).
cuda=ON
if [ $build_only = 1 ] && [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
    cuda=OFF
fi
run_stage configure 120 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DLLMT_CUDA=$cuda -DLLMT_WERROR=OFF -DLLMT_CUDA_ARCHITECTURES="$arch-real" \
    -DPKG_CONFIG_EXECUTABLE="$GPU_DEPS_PKG_CONFIG" -DLLMT_ONEDNN_INCLUDE_DIR="$GPU_DEPS_ONEDNN_INCLUDE_DIR" \
    -DLLMT_ONEDNN_LIBRARY="$GPU_DEPS_ONEDNN_LIBRARY" "${cmake_cuda[@]}" || finish
run_stage build 300 cmake --build "$build" -j"$jobs"
build_rc=$?
cp "$build/stage-build.log" "$out/gpu-build.log"
last=$((${#notes[@]} - 1))
notes[last]="${notes[last]:+${notes[last]}; }$(grep -c 'warning:' "$build/stage-build.log") compiler warnings (LLMT_WERROR=OFF here; gpu-build.log)"
[ $build_rc -eq 0 ] || finish

plugin=$(ls "$build"/lib/libllmt-cuda.so.0 2>/dev/null)
# shellcheck disable=SC2317 # check_plugin and sanitize run through bash -c (export -f)
check_plugin() {
    readelf -d "$plugin" | grep -E 'RUNPATH|RPATH'
    ldd "$plugin" | grep -E 'cublasLt|not found'
    ! ldd "$plugin" | grep -q 'not found' || { echo "a library of the plugin is not found"; return 1; }
    if command -v cuobjdump >/dev/null; then
        cuobjdump --list-elf "$plugin" | sed -n 's/.*\.\(sm_[0-9a-z]*\)\.cubin$/\1/p' |
            sort | uniq -c
        cuobjdump --list-elf "$plugin" | grep -q "sm_$arch" || { echo "no sm_$arch code"; return 1; }
    else
        echo "cuobjdump absent: the architecture is not checked"
    fi
}
export -f check_plugin
export plugin arch
if [ $cuda = OFF ]; then
    record plugin "not applicable" 0 "no nvcc: built without the CUDA plugin (--build-only)"
else
    stage_note="$(ldd "$plugin" 2>/dev/null | awk '/cublasLt/ {print "libcublasLt: " $3}')"
    run_stage plugin 30 bash -c check_plugin
fi

# The CPU half of the op tests (OpenBLAS), the config parser (libyaml),
# safetensors (xxHash): the prefix's libraries load and work here.
run_stage cpu-smoke 120 ctest --test-dir "$build" --output-on-failure --timeout 100 \
    -R '^(test_ops|test_config|test_safetensors)$'
[ $build_only = 1 ] && finish

# ---- on the GPU

gpu_stage() { # like run_stage, unless no CUDA device opened in the op tests
    if [ -n "${no_device:-}" ]; then
        record "$1" "not run" 0 "no CUDA device: $no_device"
        return 1
    fi
    run_stage "$@"
}
run_stage ops 150 ctest --test-dir "$build" -V --timeout 140 -R '^test_(ops|accumulate)_cuda$'
no_device=$(grep -m1 -o 'LLMT_REQUIRE_CUDA=1, but no CUDA backend: .*' "$build/stage-ops.log" |
    sed 's/^LLMT_REQUIRE_CUDA=1, but no CUDA backend: //')
if [ -n "$no_device" ]; then
    echo "=== FAILED at the first GPU stage: the CUDA backend does not open: $no_device"
fi
# The plugin's line (ctest -V puts the test's number before it).
backend_line=$(grep -m1 -o 'CUDA backend: plugin .*' "$build/stage-ops.log" | cut -c15-)
[ -n "$backend_line" ] && host cuda_backend "$backend_line"
gpu_stage model 200 ctest --test-dir "$build" -V --timeout 190 -R '^test_cuda_model$'
# shellcheck disable=SC2317 # runs through bash -c (export -f)
attention_cudnn() { # the comparison, then the op tests on either path
    ctest --test-dir "$build" -V --timeout 100 -R '^gpu_attention_cudnn$' || return 1
    local mode
    for mode in cudnn fallback; do
        echo "--- test_ops_cuda with LLMT_CUDA_ATTENTION=$mode"
        LLMT_CUDA_ATTENTION=$mode ctest --test-dir "$build" --output-on-failure --timeout 100 \
            -R '^test_ops_cuda$' || return 1
    done
}
export -f attention_cudnn
export build
gpu_stage attention-cudnn 150 bash -c attention_cudnn
gpu_stage offload 90 env LLMT_CUDA_PLUGIN="$plugin" "$build/tests/test_cuda_model" \
    'test_offload_*'
gpu_stage nccl-world1 60 ctest --test-dir "$build" -V --timeout 50 -R '^gpu_nccl_world1$'
gpu_stage nccl-sharded 60 ctest --test-dir "$build" -V --timeout 50 -R '^gpu_nccl_sharded$'
gpu_stage nccl-train 90 tests/gpu/train_nccl_world1.sh "$build/examples/llmt-train"

sanitizer=$(command -v compute-sanitizer || echo "$toolkit/bin/compute-sanitizer")
# shellcheck disable=SC2317
sanitize() { # tool: the CUDA op tests under compute-sanitizer
    [ -x "$sanitizer" ] || { echo "compute-sanitizer not found ($sanitizer)"; return 1; }
    LLMT_CUDA_PLUGIN=$plugin "$sanitizer" --tool "$1" --error-exitcode 99 "${@:2}" \
        "$build/tests/test_ops" cuda
}
export -f sanitize
export sanitizer build
# The figures before the sanitizers: under the budget they are what a
# short GPU session most needs, and the sanitizers the likeliest to be cut.
gpu_stage bench 180 "$build/tests/bench/bench_gpu_step" 5 1b "$build/gpu-bench.json"
gpu_stage torch 240 env LD_LIBRARY_PATH="$ld_path_before" PYTHONUNBUFFERED=1 \
    python3 tests/gpu/torch_side_by_side.py --steps 5 --json "$build/gpu-torch.json"
gpu_stage memcheck 150 bash -c 'sanitize memcheck --leak-check no'
gpu_stage racecheck 120 bash -c 'sanitize racecheck --racecheck-report hazard'

# The rest of the suite (the CPU tests, the tools, the API checks), less
# the check of prepare.sh, which runs where the .debs are fetched. The
# Python binding's tests run under /usr/bin/python3 (tests/CMakeLists.txt):
# left out, and said so, only where that interpreter has no pytest.
exclude='test_ops_cuda|test_accumulate_cuda|test_cuda_model|gpu_nccl_world1|gpu_nccl_sharded|gpu_attention_cudnn|gpu_require_cuda|gpu_prepare_no_lists'
if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import pytest' 2>/dev/null; then
    exclude+='|python_binding'
    stage_note="python_binding not run: /usr/bin/python3 has no pytest"
fi
run_stage suite 400 ctest --test-dir "$build" --output-on-failure -j"$((jobs < 8 ? jobs : 8))" \
    --timeout 200 -E "^($exclude)\$"

finish
