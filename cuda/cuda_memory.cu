/* CUDA backend: device memory, copies on the context's stream, and the
 * plugin entry point. */
#include <stdlib.h>

#include "llmt/common.h"
#include "cuda_backend.h"

static int cuda_mem_alloc(llmt_device *dev, size_t bytes, void **out)
{
    LLMT_CUDA_CHECK(dev, cudaMalloc(out, bytes), "cudaMalloc");
    return LLMT_OK;
}

static void cuda_mem_free(llmt_device *dev, void *ptr)
{
    (void)dev;
    cudaFree(ptr);
}

static int cuda_copy(llmt_device *dev, void *dst, const void *src, size_t bytes,
                     cudaMemcpyKind kind, const char *op)
{
    cudaStream_t stream = llmt_cuda(dev)->stream;
    LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, kind, stream), op);
    if (kind != cudaMemcpyDeviceToDevice)
        LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(stream), op);
    return LLMT_OK;
}

static int cuda_copy_to_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, cudaMemcpyHostToDevice, "copy to device");
}

static int cuda_copy_to_host(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, cudaMemcpyDeviceToHost, "copy to host");
}

static int cuda_copy_on_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, cudaMemcpyDeviceToDevice, "copy on device");
}

static int cuda_mem_zero(llmt_device *dev, void *dst, size_t bytes)
{
    LLMT_CUDA_CHECK(dev, cudaMemsetAsync(dst, 0, bytes, llmt_cuda(dev)->stream), "memset");
    return LLMT_OK;
}

static int cuda_mem_info(llmt_device *dev, uint64_t *total, uint64_t *free_now)
{
    size_t t = 0, f = 0;
    LLMT_CUDA_CHECK(dev, cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *total = t;
    *free_now = f;
    return LLMT_OK;
}

static int cuda_synchronize(llmt_device *dev)
{
    LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(llmt_cuda(dev)->stream), "synchronize");
    return LLMT_OK;
}

static void cuda_destroy(llmt_device *dev)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (cb->stream)
        cudaStreamDestroy(cb->stream);
    free(cb);
}

/* The op table. The numeric ops are not implemented on CUDA yet (they stay
 * NULL): the model refuses a backend whose table lacks them. */
static llmt_backend_ops make_cuda_ops(void)
{
    llmt_backend_ops o = {};
    o.name = "cuda";
    o.mem_alloc = cuda_mem_alloc;
    o.mem_free = cuda_mem_free;
    o.copy_to_device = cuda_copy_to_device;
    o.copy_to_host = cuda_copy_to_host;
    o.copy_on_device = cuda_copy_on_device;
    o.mem_zero = cuda_mem_zero;
    o.mem_info = cuda_mem_info;
    o.synchronize = cuda_synchronize;
    o.destroy = cuda_destroy;
    return o;
}

static const llmt_backend_ops cuda_ops = make_cuda_ops();

/* The plugin's one exported function: opens `device` and returns a backend. */
extern "C" __attribute__((visibility("default"))) int llmt_plugin_cuda_open(
    const llmt_plugin_host *host, int device, int num_threads, llmt_device **out)
{
    if (!host || host->abi != LLMT_BACKEND_ABI)
        return LLMT_EVERSION;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
        return host->fail(LLMT_ECUDA, "CUDA backend: no usable device: %s (%s)",
                          cudaGetErrorString(err), cudaGetErrorName(err));
    if (device >= count)
        return host->fail(LLMT_EINVAL, "llmt_context_create: cfg->device = %d, but %d CUDA "
                          "device(s) are present", device, count);
    err = cudaSetDevice(device);
    if (err != cudaSuccess)
        return host->fail(LLMT_ECUDA, "CUDA backend: cudaSetDevice(%d): %s", device,
                          cudaGetErrorString(err));
    llmt_cuda_backend *cb = (llmt_cuda_backend *)calloc(1, sizeof *cb);
    if (!cb)
        return host->fail(LLMT_ENOMEM, "CUDA backend: out of host memory");
    cb->base.ops = &cuda_ops;
    cb->base.num_threads = num_threads;
    cb->host = host;
    cb->device = device;
    err = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        free(cb);
        return host->fail(LLMT_ECUDA, "CUDA backend: cudaStreamCreate: %s",
                          cudaGetErrorString(err));
    }
    *out = &cb->base;
    return LLMT_OK;
}
