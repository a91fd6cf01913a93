/* The backend op table: every operation the library performs on device
 * memory. The model, optimizer and trainer are written once against it; the
 * CPU backend (lib/ops/cpu) is the reference, the CUDA backend (cuda/) a
 * second implementation loaded as a plugin.
 *
 * Pointers named "device" point into memory the backend allocated; the host
 * never dereferences them except through these functions. Functions returning
 * int report failures with llmt_fail semantics: a negative LLMT_E* code and a
 * message set through the host's error function. */
#ifndef LLMT_OPS_OPS_H
#define LLMT_OPS_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever llmt_backend_ops or llmt_plugin_host changes, so a CUDA
 * plugin from another build is refused instead of misused. */
#define LLMT_BACKEND_ABI 1

typedef struct llmt_device llmt_device;

typedef struct llmt_backend_ops {
    const char *name;

    /* Memory. mem_alloc returns raw device memory (the context accounts it). */
    int (*mem_alloc)(llmt_device *dev, size_t bytes, void **out);
    void (*mem_free)(llmt_device *dev, void *ptr);
    int (*copy_to_device)(llmt_device *dev, void *dst, const void *host_src, size_t bytes);
    int (*copy_to_host)(llmt_device *dev, void *host_dst, const void *src, size_t bytes);
    int (*copy_on_device)(llmt_device *dev, void *dst, const void *src, size_t bytes);
    int (*mem_zero)(llmt_device *dev, void *dst, size_t bytes);
    /* Device memory in all and free now; 0 and 0 where unknown. */
    int (*mem_info)(llmt_device *dev, uint64_t *total, uint64_t *free_now);
    /* Waits for all work queued on the backend's stream. */
    int (*synchronize)(llmt_device *dev);

    /* Releases the backend instance. */
    void (*destroy)(llmt_device *dev);
} llmt_backend_ops;

/* A backend instance; each backend embeds this first in its own state. */
struct llmt_device {
    const llmt_backend_ops *ops;
    int num_threads; /* CPU threads for host-side work */
};

/* What libllmt hands a plugin backend: its error function (the plugin cannot
 * reach libllmt's internal symbols). */
typedef struct llmt_plugin_host {
    uint32_t abi; /* LLMT_BACKEND_ABI */
    int (*fail)(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
} llmt_plugin_host;

/* The one symbol a CUDA plugin exports. */
#define LLMT_CUDA_PLUGIN_ENTRY "llmt_plugin_cuda_open"
typedef int (*llmt_plugin_open_fn)(const llmt_plugin_host *host, int device, int num_threads,
                                   llmt_device **out);

/* Creates the CPU backend. */
int llmt_cpu_backend_create(int num_threads, llmt_device **out);

#endif
