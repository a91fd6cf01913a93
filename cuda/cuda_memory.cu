/* CUDA backend: device memory, pinned host memory for staging, and copies
 * on the context's stream. Copies that involve the host wait for the stream;
 * everything else is queued.
 *
 * Copies let the runtime tell host from device pointers (cudaMemcpyDefault,
 * unified addressing): the library hands STAGING buffers, which are pinned
 * host memory here, to the copy functions like device memory (a model load
 * fills one with copy_to_device and moves it with copy_on_device). */
#include "cuda_backend.h"

int llmt_cuda_mem_alloc(llmt_device *dev, size_t bytes, void **out)
{
    LLMT_CUDA_CHECK(dev, cudaMalloc(out, bytes), "cudaMalloc");
    return LLMT_OK;
}

void llmt_cuda_mem_free(llmt_device *dev, void *ptr)
{
    (void)dev;
    cudaFree(ptr);
}

int llmt_cuda_host_alloc(llmt_device *dev, size_t bytes, void **out)
{
    LLMT_CUDA_CHECK(dev, cudaMallocHost(out, bytes), "cudaMallocHost");
    return LLMT_OK;
}

void llmt_cuda_host_free(llmt_device *dev, void *ptr)
{
    /* A copy queued from or to it may still be running. */
    cudaStreamSynchronize(llmt_cuda(dev)->stream);
    cudaFreeHost(ptr);
}

/* Queues a copy; with wait, returns when it is done (the host side may be
 * reused or freed as soon as the call returns). */
static int cuda_copy(llmt_device *dev, void *dst, const void *src, size_t bytes, int wait,
                     const char *op)
{
    if (bytes == 0)
        return LLMT_OK;
    cudaStream_t stream = llmt_cuda(dev)->stream;
    LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), op);
    if (wait)
        LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(stream), op);
    return LLMT_OK;
}

int llmt_cuda_copy_to_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, 1, "copy to device");
}

int llmt_cuda_copy_to_host(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, 1, "copy to host");
}

int llmt_cuda_copy_on_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, 0, "copy on device");
}

int llmt_cuda_mem_zero(llmt_device *dev, void *dst, size_t bytes)
{
    if (bytes == 0)
        return LLMT_OK;
    LLMT_CUDA_CHECK(dev, cudaMemsetAsync(dst, 0, bytes, llmt_cuda(dev)->stream), "memset");
    return LLMT_OK;
}

int llmt_cuda_mem_info(llmt_device *dev, uint64_t *total, uint64_t *free_now)
{
    size_t t = 0, f = 0;
    LLMT_CUDA_CHECK(dev, cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *total = t;
    *free_now = f;
    return LLMT_OK;
}

int llmt_cuda_synchronize(llmt_device *dev)
{
    LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(llmt_cuda(dev)->stream), "synchronize");
    return LLMT_OK;
}
