/* Loading the CUDA backend. It lives in its own shared object
 * (libllmt-cuda.so.0), loaded only when a context asks for CUDA, so libllmt
 * itself needs no CUDA library and runs on machines without a GPU or driver.
 * The plugin is opened with RTLD_NODELETE: unloading the CUDA runtime while
 * the process runs is not safe, so dlclose only drops the handle. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/cuda_plugin_ops.h"
#include "core/error.h"

#ifdef LLMT_HAVE_CUDA_PLUGIN

#define PLUGIN_NAME "libllmt-cuda.so.0"

/* The plugin next to the object this code is linked into, or NULL. */
static void *open_beside_self(void)
{
    Dl_info info;
    if (!dladdr((void *)&llmt_cuda_plugin_load, &info) || !info.dli_fname)
        return NULL;
    char path[PATH_MAX];
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash)
        return NULL;
    int n = snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                     PLUGIN_NAME);
    if (n < 0 || (size_t)n >= sizeof path)
        return NULL;
    return dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
}

static const llmt_plugin_host host = {LLMT_BACKEND_ABI, llmt_fail};

/* The plugin: $LLMT_CUDA_PLUGIN if set, else the one beside this object, else
 * through the loader's search path. NULL (dlerror() says why) on failure; *name
 * is what was opened or tried, for messages. */
static void *open_plugin(const char **name)
{
    const char *override = getenv("LLMT_CUDA_PLUGIN");
    *name = override ? override : PLUGIN_NAME;
    void *handle = override ? dlopen(override, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) : open_beside_self();
    if (!handle && !override)
        handle = dlopen(PLUGIN_NAME, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    return handle;
}

int llmt_cuda_plugin_load(llmt_context *ctx, int device, int num_threads)
{
    const char *name;
    void *handle = open_plugin(&name);
    if (!handle)
        return llmt_fail(LLMT_EUNSUPPORTED, "CUDA backend: cannot load %s: %s", name, dlerror());
    llmt_plugin_open_fn open_fn = (llmt_plugin_open_fn)dlsym(handle, LLMT_CUDA_PLUGIN_ENTRY);
    if (!open_fn) {
        dlclose(handle);
        return llmt_fail(LLMT_EUNSUPPORTED, "CUDA backend: %s lacks %s", PLUGIN_NAME,
                         LLMT_CUDA_PLUGIN_ENTRY);
    }
    int rc = open_fn(&host, device, num_threads, &ctx->backend);
    if (rc) {
        dlclose(handle);
        return rc;
    }
    ctx->plugin_handle = handle;
    return LLMT_OK;
}

int llmt_cuda_plugin_ops(const llmt_backend_ops **out)
{
    /* RTLD_NODELETE keeps the table mapped after dlclose. */
    const char *name;
    void *handle = open_plugin(&name);
    if (!handle)
        return llmt_fail(LLMT_EUNSUPPORTED, "CUDA backend: cannot load %s: %s", name, dlerror());
    llmt_plugin_ops_fn ops_fn = (llmt_plugin_ops_fn)dlsym(handle, LLMT_CUDA_PLUGIN_OPS_ENTRY);
    int rc = ops_fn ? ops_fn(&host, out)
                    : llmt_fail(LLMT_EUNSUPPORTED, "CUDA backend: %s lacks %s", name,
                                LLMT_CUDA_PLUGIN_OPS_ENTRY);
    if (rc == LLMT_EVERSION)
        rc = llmt_fail(LLMT_EVERSION, "CUDA backend: %s is from another build of libllmt "
                       "(backend ABI %d expected)", name, LLMT_BACKEND_ABI);
    dlclose(handle);
    return rc;
}

#else

int llmt_cuda_plugin_load(llmt_context *ctx, int device, int num_threads)
{
    (void)ctx;
    (void)num_threads;
    return llmt_fail(LLMT_EUNSUPPORTED,
                     "llmt_context_create: cfg->backend = CUDA (device %d), but this build of "
                     "libllmt has no CUDA backend (configure with -DLLMT_CUDA=ON)",
                     device);
}

int llmt_cuda_plugin_ops(const llmt_backend_ops **out)
{
    (void)out;
    return llmt_fail(LLMT_EUNSUPPORTED, "CUDA backend: this build of libllmt has none "
                     "(configure with -DLLMT_CUDA=ON)");
}

#endif
