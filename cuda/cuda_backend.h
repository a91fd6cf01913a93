/* State of the CUDA backend instance and helpers shared by its files. */
#ifndef LLMT_CUDA_BACKEND_H
#define LLMT_CUDA_BACKEND_H

#include <cuda_runtime.h>

#include "llmt/common.h"
#include "ops/ops.h"

typedef struct llmt_cuda_backend {
    llmt_device base; /* first: the library sees an llmt_device */
    const llmt_plugin_host *host;
    int device;
    cudaStream_t stream;
} llmt_cuda_backend;

static inline llmt_cuda_backend *llmt_cuda(llmt_device *dev)
{
    return (llmt_cuda_backend *)dev;
}

/* Turns a CUDA error into LLMT_ECUDA with the CUDA text and the failing op. */
#define LLMT_CUDA_CHECK(dev, call, op)                                                      \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess)                                                           \
            return llmt_cuda(dev)->host->fail(LLMT_ECUDA, "CUDA %s: %s (%s)", op,         \
                                              cudaGetErrorString(err_),                    \
                                              cudaGetErrorName(err_));                     \
    } while (0)

#endif
