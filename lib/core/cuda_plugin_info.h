/* What the CUDA plugin runs on, for tests and tools that hold a CUDA
 * context: the plugin's second exported symbol (cuda/cuda_describe.cu) fills
 * one line naming the plugin file, the device, the driver, the CUDA runtime
 * and the cuBLASLt library it loaded (version and file), so a run can show
 * which CUDA installation it used. Not public API: reached through the
 * context's plugin handle (core/context_internal.h). */
#ifndef LLMT_CORE_CUDA_PLUGIN_INFO_H
#define LLMT_CORE_CUDA_PLUGIN_INFO_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

#define LLMT_CUDA_PLUGIN_DESCRIBE "llmt_plugin_cuda_describe"

/* Writes the line into buf (size bytes, always NUL-terminated, truncated to
 * fit); returns the length of the whole line, like snprintf. Call it on a
 * thread that has the context's device current. */
typedef int (*llmt_plugin_describe_fn)(char *buf, size_t size);

/* The plugin's line for the plugin loaded as plugin_handle (a CUDA context's
 * plugin_handle), or a line saying why there is none. */
static inline void llmt_cuda_plugin_describe(void *plugin_handle, char *buf, size_t size)
{
    llmt_plugin_describe_fn fn =
        plugin_handle ? (llmt_plugin_describe_fn)dlsym(plugin_handle, LLMT_CUDA_PLUGIN_DESCRIBE)
                      : NULL;
    if (fn)
        fn(buf, size);
    else
        snprintf(buf, size, "%s", plugin_handle ? "the CUDA plugin has no " LLMT_CUDA_PLUGIN_DESCRIBE
                                                : "no CUDA plugin is loaded");
}

#endif
