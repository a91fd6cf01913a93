#!/usr/bin/env bash
# Runs the CUDA backend's kernels on the CPU, for machines without a GPU:
# compiles the plugin's sources (cuda/*.cu, except the cuBLASLt GEMM and the
# description of the real runtime's libraries, cuda_describe.cu) with
# the host C++ compiler against the emulator in tests/gpu/emu (there
# cuda_attention_cudnn.cu, without LLMT_CUDA_HAVE_CUDNN, is its own stub that
# declines: attention runs on the fallback kernels; cuDNN is not emulated),
# and runs test_ops, test_accumulate and test_cuda_model with that "plugin"
# (LLMT_CUDA_PLUGIN).
#
# It checks the kernels' logic: indexing, masks, tiling, block-uniform
# barriers, reductions and their determinism, the scratch layouts and the
# host code around the launches. Where CMake found MPI it then runs
# test_dp_cuda at 2 and 3 ranks: data-parallel training with the sharded
# optimizer on the emulated backend, over an MPI communicator flagged as
# moving device memory (everything but NCCL's transport; the test's header
# says how), and llmt-train at 2 ranks on CUDA reaching its NCCL
# communicator (which this plugin lacks: refused on every rank). It does not
# check what only a GPU shows:
# cuBLASLt (the GEMM is a plain loop here), races between warps that the
# emulator's block-wide barriers hide, launch limits, or speed. Passing here
# is not a GPU run; tests/gpu/run.sh is.
#
#   tests/gpu/emulate.sh [build-dir]      (default build/emu; about 5 minutes)
#
# Needs nvcc's toolkit for its headers (the build is configured with
# LLMT_CUDA=ON so that libllmt loads plugins).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/emu}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=ON >/dev/null
targets=(test_ops test_accumulate test_cuda_model)
[ -d "$build/tests/mpi" ] && targets+=(test_dp_cuda llmt-train) # configured where MPI was found
cmake --build "$build" -j"$jobs" --target "${targets[@]}" >/dev/null

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
if [ ! -d "$build/tests/mpi" ]; then
    echo "== test_dp_cuda not run: CMake found no MPI (Debian: openmpi-bin libopenmpi-dev) =="
    exit 0
fi
# The MPI tests' environment (LLMT_MPI_TEST_ENV in CMakeLists.txt).
mpiexec=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")
for np in 2 3; do
    echo "== EMULATED on the CPU (not a GPU run): test_dp_cuda at $np ranks =="
    env OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader \
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        timeout 600 "$mpiexec" -n "$np" "$build/tests/mpi/test_dp_cuda"
done
# llmt-train's NCCL path at 2 ranks (examples/train_cli/nccl_comm.c): the
# emulated plugin has no NCCL engine, so each rank opens its context, rank
# 0's unique id is refused, and every rank says so (rank 1 naming rank 0);
# it fails before the (absent) data is opened.
echo "== EMULATED on the CPU (not a GPU run): llmt-train at 2 ranks on CUDA, no NCCL =="
train_out=$(mktemp -d)
rc=0
env OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout 120 "$mpiexec" -n 2 "$build/examples/llmt-train" --out "$train_out/run" \
    train.backend=cuda train.device=0 "data.train=$train_out/none_*.bin" > "$train_out/log" 2>&1 || rc=$?
for want in "rank 0: llmt-train: the NCCL communicator: not supported: llmt_comm_nccl_unique_id: the CUDA plugin was built without NCCL" \
    "rank 1: llmt-train: making the NCCL unique id failed on rank 0"; do
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -qF "$want" "$train_out/log"; then
        echo "FAIL: llmt-train at 2 ranks, no NCCL: exit $rc, no '$want' in:"
        cat "$train_out/log"
        rm -rf "$train_out"
        exit 1
    fi
done
rm -rf "$train_out"
echo "every rank reported the missing NCCL engine"
