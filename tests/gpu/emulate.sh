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
# host code around the launches. Where CMake found MPI the plugin also gets
# its NCCL engine (cuda/comm_nccl.cu, compiled against the stand-in
# tests/gpu/emu/nccl/nccl.h), and a stand-in libnccl.so.2 over MPI
# (tests/gpu/emu/nccl/fake_nccl.c, a test double) is built into
# $build/emu/nccl and put first on LD_LIBRARY_PATH, where the engine's
# dlopen finds it; then test_dp_cuda runs at 2 and 3 ranks (data-parallel
# training with the sharded optimizer over the engine, bitwise against one
# process; the test's header says what it covers), test_nccl_world1 and
# test_nccl_sharded at world 1 (the GPU kit's nccl-world1 and nccl-sharded
# stages), and llmt-train trains 3
# steps at 2 ranks over the engine and as one process with --data-parallel
# (NCCL world 1, without MPI), to the same model bytes, and the GPU kit's
# nccl-train stage (tests/gpu/train_nccl_world1.sh) runs. It does not check
# what only a GPU shows: cuBLASLt (the GEMM is a plain loop here), races
# between warps that the emulator's block-wide barriers hide, NCCL's own
# transport, launch limits, or speed. Passing here is not a GPU run;
# tests/gpu/run.sh is.
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
have_mpi=0
if [ -d "$build/tests/mpi" ]; then # configured where MPI was found
    have_mpi=1
    targets+=(test_dp_cuda test_nccl_world1 test_nccl_sharded llmt-train)
fi
cmake --build "$build" -j"$jobs" --target "${targets[@]}" >/dev/null

obj="$build/emu"
mkdir -p "$obj"
flags=(-std=c++17 -O2 -g -fPIC -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas
       -Iinclude -Ilib -Icuda -I"$cuda_home/include")
pids=()
# With MPI: the engine against the stand-in nccl.h (its directory before
# the toolkit's, which may hold NCCL's), and the stand-in libnccl.so.2.
nccl_flags=()
if [ $have_mpi = 1 ]; then
    nccl_flags=(-Itests/gpu/emu/nccl -DLLMT_CUDA_HAVE_NCCL)
    mpicc=$(sed -n 's/^MPI_C_COMPILER:FILEPATH=//p' "$build/CMakeCache.txt")
    mkdir -p "$obj/nccl"
    "${mpicc:-mpicc}" -std=c11 -O2 -g -fPIC -Wall -Wextra -Werror -shared -Itests/gpu/emu/nccl \
        -I"$cuda_home/include" tests/gpu/emu/nccl/fake_nccl.c -Wl,-soname,libnccl.so.2 \
        -Wl,--no-undefined -o "$obj/nccl/libnccl.so.2" &
    pids+=($!)
fi
for src in cuda/*.cu; do
    extra=()
    case $(basename "$src") in # emu_gemm.cpp stands in for the GEMM; nothing describes the emulator
    cuda_gemm.cu | cuda_describe.cu) continue ;;
    comm_nccl.cu) extra=(${nccl_flags[@]+"${nccl_flags[@]}"}) ;;
    esac
    c++ ${extra[@]+"${extra[@]}"} "${flags[@]}" -x c++ -include tests/gpu/emu/cuda_emu.h \
        -c "$src" -o "$obj/$(basename "$src").o" &
    pids+=($!)
done
for src in tests/gpu/emu/*.cpp; do
    c++ "${flags[@]}" -c "$src" -o "$obj/$(basename "$src").o" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
c++ -shared -o "$obj/libllmt-cuda-emu.so" "$obj"/*.o -Wl,--version-script=cuda/plugin.map \
    -Wl,--no-undefined

export LLMT_CUDA_PLUGIN="$obj/libllmt-cuda-emu.so" CMOCKA_MESSAGE_OUTPUT=stdout
# The emulator runs a kernel on one OS thread, so the op tests and each case
# of test_cuda_model (its argument: cmocka's filter, here one case's name)
# run as separate processes, $jobs at a time; each one's output is printed
# after all, in this order. A case must report exactly one test passed: a
# name that matches none would pass silently otherwise.
model_src=tests/unit/test_cuda_model.c
mapfile -t cases < <(sed -n 's/^ *cmocka_unit_test(\(test_[A-Za-z0-9_]*\)),$/\1/p' "$model_src")
if [ ${#cases[@]} -eq 0 ] || [ ${#cases[@]} -ne "$(grep -c 'cmocka_unit_test' "$model_src")" ]; then
    echo "FAIL: could not read every case of $model_src (cmocka_unit_test(test_x), a line each)"
    exit 1
fi
runs=("test_ops cuda")
for c in "${cases[@]}"; do runs+=("test_cuda_model $c"); done
runs+=("test_accumulate cuda")
logs="$obj/logs"
rm -rf "$logs" && mkdir -p "$logs"
running=0
for i in "${!runs[@]}"; do
    if [ $running -ge "$jobs" ]; then
        wait -n || true # each run's status is in its .rc file
        running=$((running - 1))
    fi
    read -r -a argv <<< "${runs[$i]}"
    (rc=0; "$build/tests/${argv[0]}" "${argv[@]:1}" > "$logs/$i.log" 2>&1 || rc=$?
     echo $rc > "$logs/$i.rc") &
    running=$((running + 1))
done
wait
failed=0
for i in "${!runs[@]}"; do
    echo "== EMULATED on the CPU (not a GPU run): ${runs[$i]} =="
    cat "$logs/$i.log"
    rc=$(cat "$logs/$i.rc")
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: ${runs[$i]}: exit $rc"
        failed=1
    elif [[ ${runs[$i]} == test_cuda_model* ]] && ! grep -q '^\[  PASSED  \] 1 test(s)\.$' "$logs/$i.log"; then
        echo "FAIL: ${runs[$i]}: not exactly one test passed"
        failed=1
    fi
done
[ $failed -eq 0 ] || exit 1
if [ $have_mpi = 0 ]; then
    echo "== test_dp_cuda not run: CMake found no MPI (Debian: openmpi-bin libopenmpi-dev) =="
    exit 0
fi
# The MPI tests' environment (LLMT_MPI_TEST_ENV in CMakeLists.txt), and the
# stand-in libnccl.so.2 before any other.
mpiexec=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
LD_LIBRARY_PATH="$(cd "$obj/nccl" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
for np in 2 3; do
    echo "== EMULATED on the CPU (not a GPU run): test_dp_cuda at $np ranks over NCCL =="
    timeout 600 "$mpiexec" -n "$np" "$build/tests/mpi/test_dp_cuda"
done
# The GPU kit's nccl-world1 stage over the stand-in (a communicator of one
# rank without MPI).
echo "== EMULATED on the CPU (not a GPU run): test_nccl_world1 (world 1 over NCCL) =="
LLMT_REQUIRE_CUDA=1 timeout 120 "$build/tests/test_nccl_world1"

# The GPU kit's nccl-sharded stage at world 1 over the stand-in: its
# gradient offload in several uploads of the offloaded gradients included.
echo "== EMULATED on the CPU (not a GPU run): test_nccl_sharded (world 1 over NCCL) =="
LLMT_REQUIRE_CUDA=1 timeout 300 "$mpiexec" -n 1 "$build/tests/test_nccl_sharded"

# llmt-train on CUDA over the NCCL engine (examples/train_cli/nccl_comm.c):
# 3 steps of a tiny model (heads of 32 elements, as the CUDA kernels take)
# on a hand-made shard at 2 ranks, and as one process with --data-parallel
# (NCCL world 1: the stand-in without MPI); deterministic mode gives both
# the same losses and the same final model.safetensors bytes (compared as
# tests/tools/test_llmt_train_mpi.sh does).
echo "== EMULATED on the CPU (not a GPU run): llmt-train at 2 ranks on CUDA over NCCL =="
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: llmt-train on emulated CUDA over NCCL: $*"; exit 1; }
. tests/tools/shard_v1.sh
write_text_shard "$tmp/d"
cat > "$tmp/tiny.yaml" <<EOF
model: {vocab_size: 110, hidden_size: 32, num_layers: 1, num_heads: 1, num_kv_heads: 1,
        ffn_size: 64, max_seq_len: 8}
batch: {batch_size: 4, micro_batch: 1, seq_len: 8}
data: {train: "$tmp/d/t_*.bin", val: "$tmp/d/t_*.bin"}
train: {steps: 3, eval_batches: 1, log_every: 1, seed: 7, threads: 1, backend: cuda, device: 0}
checkpoint: {every: 0, fast_every: 0}
EOF
timeout 120 "$mpiexec" -n 2 "$build/examples/llmt-train" --config "$tmp/tiny.yaml" \
    --out "$tmp/np2" > "$tmp/np2.log" 2>&1 || fail "2 ranks: exit $?: $(cat "$tmp/np2.log")"
timeout 120 "$build/examples/llmt-train" --config "$tmp/tiny.yaml" --out "$tmp/dp1" \
    --data-parallel > "$tmp/dp1.log" 2>&1 || fail "--data-parallel: exit $?: $(cat "$tmp/dp1.log")"
cat "$tmp/np2.log"
grep -q "tiny.yaml, 2 ranks over NCCL; starting at step 0 of 3" "$tmp/np2.log" ||
    fail "2 ranks: the header does not say 2 ranks over NCCL"
grep -q "tiny.yaml, 1 rank over NCCL; starting at step 0 of 3" "$tmp/dp1.log" ||
    fail "--data-parallel: the header does not say 1 rank over NCCL: $(cat "$tmp/dp1.log")"
losses() { sed -n 's/^\(step .*loss [0-9.]*\) .*/\1/p; s/^\(final held-out loss .*\)/\1/p' "$1"; }
[ "$(losses "$tmp/np2.log" | grep -c '^step ')" -eq 3 ] || fail "2 ranks: not 3 steps logged"
[ "$(losses "$tmp/np2.log")" = "$(losses "$tmp/dp1.log")" ] ||
    fail "losses differ: 2 ranks: $(losses "$tmp/np2.log"); one: $(losses "$tmp/dp1.log")"
cmp "$tmp/np2/checkpoints/step-00000003/model.safetensors" \
    "$tmp/dp1/checkpoints/step-00000003/model.safetensors" ||
    fail "model.safetensors of step 3 differs between 2 ranks and one (deterministic mode)"
echo "llmt-train over NCCL: 2 ranks and one with --data-parallel, the same losses and model bytes"

# The GPU kit's nccl-train stage as the kit runs it (NCCL world 1, here the
# stand-in without MPI), so that what it trains runs on the CUDA kernels
# before a GPU run: with optimizer+grads it sends the offloaded buckets
# from the gradient bucket's slots.
echo "== EMULATED on the CPU (not a GPU run): the GPU kit's nccl-train stage =="
timeout 300 sh tests/gpu/train_nccl_world1.sh "$build/examples/llmt-train"
