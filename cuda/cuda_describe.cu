/* llmt_plugin_cuda_describe: one line saying what the plugin runs on
 * (lib/core/cuda_plugin_info.h). The files come from the dynamic loader
 * (dladdr), so the line shows which libcublasLt the plugin's RUNPATH or the
 * library search path resolved, and which libcuda the runtime opened. */
#include <dlfcn.h>
#include <stdio.h>

#include "core/cuda_plugin_info.h"
#include "cuda_backend.h"

/* The file that defines the code or data at addr, or "?". */
static const char *file_of(const void *addr)
{
    Dl_info info;
    return addr && dladdr(addr, &info) && info.dli_fname ? info.dli_fname : "?";
}

/* The file of the driver library (libcuda.so.1) the runtime opened, or "?"
 * when it is not loaded. */
static const char *driver_file(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return "?";
    const char *file = file_of(dlsym(h, "cuInit"));
    dlclose(h); /* drops the reference RTLD_NOLOAD took; the runtime keeps its own */
    return file;
}

extern "C" __attribute__((visibility("default"))) int llmt_plugin_cuda_describe(char *buf,
                                                                                 size_t size)
{
    int device = -1, driver = 0, runtime = 0;
    cudaDeviceProp prop = {};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, device) != cudaSuccess)
        snprintf(prop.name, sizeof prop.name, "?");
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    size_t lt = cublasLtGetVersion();
    return snprintf(buf, size,
                    "plugin %s; device %d: %s (sm_%d%d); driver CUDA %d.%d (%s); runtime %d.%d "
                    "(static); cuBLASLt %zu (%s)",
                    file_of((const void *)&llmt_plugin_cuda_describe), device, prop.name,
                    prop.major, prop.minor, driver / 1000, driver % 1000 / 10, driver_file(),
                    runtime / 1000, runtime % 1000 / 10, lt,
                    file_of((const void *)&cublasLtGetVersion));
}
