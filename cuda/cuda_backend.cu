/* The CUDA backend's op table, its scratch size and the plugin entry point.
 * Every op runs on the backend's stream, but copy_to_host_async, which runs
 * on the copy stream (cuda_memory.cu); only ops that hand values back to
 * the host (lm_head_ce, grad_stats, grad_stats_blocks, the other copies to
 * and from the host, synchronize) wait for it. */
#include <stdlib.h>

#include "core/cuda_plugin_ops.h"
#include "cuda_attention_cudnn.h"
#include "cuda_backend.h"

/* Scratch is shared by the ops (they run one after another on the stream):
 * the largest need. */
static size_t cuda_scratch_bytes(const llmt_op_dims *d)
{
    size_t need[4] = {llmt_cuda_gemm_scratch(), llmt_cuda_rmsnorm_scratch(d),
                      llmt_cuda_attention_scratch(d), llmt_cuda_ce_scratch(d)};
    size_t most = 0;
    for (int i = 0; i < 4; i++)
        most = need[i] > most ? need[i] : most;
    return most;
}

static void cuda_destroy(llmt_device *dev)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (cb->stream)
        cudaStreamSynchronize(cb->stream);
    if (cb->copy_stream)
        cudaStreamSynchronize(cb->copy_stream);
    llmt_cudnn_attention_release(dev);
    for (int f = 0; f < LLMT_COPY_FENCES; f++)
        if (cb->fence[f])
            cudaEventDestroy(cb->fence[f]);
    if (cb->queued)
        cudaEventDestroy(cb->queued);
    if (cb->copy_stream)
        cudaStreamDestroy(cb->copy_stream);
    if (cb->lt)
        cublasLtDestroy(cb->lt);
    if (cb->stream)
        cudaStreamDestroy(cb->stream);
    free(cb);
}

/* The copy stream of the async copies and its events (ordering only: no
 * timing); on failure those made are released by cuda_destroy. */
static cudaError_t make_copy_stream(llmt_cuda_backend *cb)
{
    cudaError_t err = cudaStreamCreateWithFlags(&cb->copy_stream, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&cb->queued, cudaEventDisableTiming);
    for (int f = 0; f < LLMT_COPY_FENCES && err == cudaSuccess; f++)
        err = cudaEventCreateWithFlags(&cb->fence[f], cudaEventDisableTiming);
    LLMT_CUDA_EMU_COPY_STREAM(cb->copy_stream);
    return err;
}

static llmt_backend_ops make_cuda_ops(void)
{
    llmt_backend_ops o = {};
    o.name = "cuda";
    o.host_memory = 0;
    o.mem_alloc = llmt_cuda_mem_alloc;
    o.mem_free = llmt_cuda_mem_free;
    o.host_alloc = llmt_cuda_host_alloc;
    o.host_free = llmt_cuda_host_free;
    o.copy_to_device = llmt_cuda_copy_to_device;
    o.copy_to_host = llmt_cuda_copy_to_host;
    o.copy_on_device = llmt_cuda_copy_on_device;
    o.mem_zero = llmt_cuda_mem_zero;
    o.mem_info = llmt_cuda_mem_info;
    o.synchronize = llmt_cuda_synchronize;
    o.copy_to_host_async = llmt_cuda_copy_to_host_async;
    o.wait_fence = llmt_cuda_wait_fence;
    o.copy_to_device_async = llmt_cuda_copy_to_device_async;
    o.fence_sync = llmt_cuda_fence_sync;
    o.destroy = cuda_destroy;
    o.scratch_bytes = cuda_scratch_bytes;
    o.gemm = llmt_cuda_gemm;
    o.gemm_cd = llmt_cuda_gemm_cd;
    o.embedding_fwd = llmt_cuda_embedding_fwd;
    o.embedding_bwd = llmt_cuda_embedding_bwd;
    o.rmsnorm_fwd = llmt_cuda_rmsnorm_fwd;
    o.rmsnorm_bwd = llmt_cuda_rmsnorm_bwd;
    o.rope = llmt_cuda_rope;
    o.attention_saved_bytes = llmt_cuda_attention_saved_bytes;
    o.attention_fwd = llmt_cuda_attention_fwd;
    o.attention_bwd = llmt_cuda_attention_bwd;
    o.swiglu_fwd = llmt_cuda_swiglu_fwd;
    o.swiglu_bwd = llmt_cuda_swiglu_bwd;
    o.cast = llmt_cuda_cast;
    o.add = llmt_cuda_add;
    o.lm_head_ce = llmt_cuda_lm_head_ce;
    o.ce_chunk = llmt_cuda_ce_chunk;
    o.optim_scratch_bytes = llmt_cuda_optim_scratch_bytes;
    o.grad_stats = llmt_cuda_grad_stats;
    o.grad_stats_blocks = llmt_cuda_grad_stats_blocks;
    o.adamw = llmt_cuda_adamw;
    o.accumulate = llmt_cuda_accumulate;
    return o;
}

/* Built on first use: optim_scratch_bytes is a constant of another file. */
static const llmt_backend_ops *cuda_ops(void)
{
    static const llmt_backend_ops ops = make_cuda_ops();
    return &ops;
}

/* The plugin's one exported function: opens `device` and returns a backend
 * with its own stream and cuBLASLt handle. */
extern "C" __attribute__((visibility("default"))) int llmt_plugin_cuda_open(
    const llmt_plugin_host *host, int device, int num_threads, llmt_device **out)
{
    if (!host || host->abi != LLMT_BACKEND_ABI)
        return LLMT_EVERSION;
    int attn_mode;
    int rc = llmt_cuda_attention_mode(host, &attn_mode);
    if (rc)
        return rc;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
        return host->fail(LLMT_ECUDA, "llmt_context_create: CUDA backend: no usable device: "
                          "%s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
    if (device >= count)
        return host->fail(LLMT_EINVAL, "llmt_context_create: cfg->device = %d, but %d CUDA "
                          "device(s) are present", device, count);
    err = cudaSetDevice(device);
    if (err != cudaSuccess)
        return host->fail(LLMT_ECUDA, "llmt_context_create: CUDA backend: cudaSetDevice(%d): %s",
                          device, cudaGetErrorString(err));
    llmt_cuda_backend *cb = (llmt_cuda_backend *)calloc(1, sizeof *cb);
    if (!cb)
        return host->fail(LLMT_ENOMEM, "llmt_context_create: CUDA backend: out of host memory");
    cb->base.ops = cuda_ops();
    cb->base.num_threads = num_threads;
    cb->host = host;
    cb->device = device;
    cb->attn_mode = attn_mode;
    err = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        free(cb);
        return host->fail(LLMT_ECUDA, "llmt_context_create: CUDA backend: cudaStreamCreate: %s",
                          cudaGetErrorString(err));
    }
    cublasStatus_t st = cublasLtCreate(&cb->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cb->lt = NULL;
        cuda_destroy(&cb->base);
        return host->fail(LLMT_ECUDA, "llmt_context_create: CUDA backend: cublasLtCreate: %s",
                          cublasLtGetStatusString(st));
    }
    err = make_copy_stream(cb);
    if (err != cudaSuccess) {
        cuda_destroy(&cb->base);
        return host->fail(LLMT_ECUDA, "llmt_context_create: CUDA backend: copy stream and its "
                          "events: %s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
    }
    *out = &cb->base;
    return LLMT_OK;
}

/* The op table without a device, for planning (lib/core/cuda_plugin_ops.h):
 * building it calls no CUDA function, and neither do its size functions. */
extern "C" __attribute__((visibility("default"))) int llmt_plugin_cuda_ops(
    const llmt_plugin_host *host, const llmt_backend_ops **out)
{
    if (!host || host->abi != LLMT_BACKEND_ABI)
        return LLMT_EVERSION;
    *out = cuda_ops();
    return LLMT_OK;
}
