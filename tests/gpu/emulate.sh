#!/usr/bin/env bash
# Runs the CUDA backend's kernels on the CPU, for machines without a GPU:
# compiles the plugin's sources (cuda/*.cu, except the cuBLASLt GEMM and the
# description of the real runtime's libraries, cuda_describe.cu) with
# the host C++ compiler against the emulator in tests/gpu/emu, and runs
# test_ops, test_accumulate and test_cuda_model with that "plugin" (LLMT_CUDA_PLUGIN).
#
# It checks the kernels' logic: indexing, masks, tiling, block-uniform
# barriers, reductions and their determinism, the scratch layouts and the
# host code around the launches. It does not check what only a GPU shows:
# cuBLASLt (the GEMM is a plain loop here), races between warps that the
# emulator's block-wide barriers hide, launch limits, or speed. Passing here
# is not a GPU run; tests/gpu/run.sh is.
#
#   tests/gpu/emulate.sh [build-dir]      (default build/emu; about 4 minutes)
#
# Needs nvcc's toolkit for its headers (the build is configured with
# LLMT_CUDA=ON so that libllmt loads plugins).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/emu}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=ON >/dev/null
cmake --build "$build" -j"$jobs" --target test_ops test_accumulate test_cuda_model >/dev/null

obj="$build/emu"
mkdir -p "$obj"
flags=(-std=c++17 -O2 -g -fPIC -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas
       -Iinclude -Ilib -Icuda -I"$cuda_home/include")
pids=()
for src in cuda/*.cu; do
    case $(basename "$src") in # emu_gemm.cpp stands in for the GEMM; nothing describes the emulator
    cuda_gemm.cu | cuda_describe.cu) continue ;;
    esac
    c++ "${flags[@]}" -x c++ -include tests/gpu/emu/cuda_emu.h -c "$src" \
        -o "$obj/$(basename "$src").o" &
    pids+=($!)
done
for src in tests/gpu/emu/*.cpp; do
    c++ "${flags[@]}" -c "$src" -o "$obj/$(basename "$src").o" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
c++ -shared -o "$obj/libllmt-cuda-emu.so" "$obj"/*.o -Wl,--version-script=cuda/plugin.map \
    -Wl,--no-undefined

echo "== EMULATED on the CPU (not a GPU run): test_ops cuda =="
export LLMT_CUDA_PLUGIN="$obj/libllmt-cuda-emu.so" CMOCKA_MESSAGE_OUTPUT=stdout
"$build/tests/test_ops" cuda
echo "== EMULATED on the CPU (not a GPU run): test_accumulate cuda =="
"$build/tests/test_accumulate" cuda
echo "== EMULATED on the CPU (not a GPU run): test_cuda_model =="
"$build/tests/test_cuda_model"
