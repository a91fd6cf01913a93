/* llmt_comm over NCCL: the library's side. The engine is the CUDA plugin's
 * (cuda/comm_nccl.cu), reached through the plugin's handle in the context
 * (lib/dist/comm_nccl_plugin.h); libllmt itself links neither CUDA nor NCCL. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "dist/comm_internal.h"
#include "dist/comm_nccl_plugin.h"

static const llmt_plugin_host host = {LLMT_BACKEND_ABI, llmt_fail};

/* The plugin's NCCL table for a context on the CUDA backend; fn names the
 * caller in messages. */
static int nccl_api(llmt_context *ctx, const char *fn, const llmt_nccl_api **api)
{
    if (ctx->cfg.backend != LLMT_BACKEND_CUDA)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: ctx is on the %s backend; NCCL needs a context "
                         "on the CUDA backend", fn, llmt_ops(ctx)->name);
    llmt_plugin_nccl_fn entry =
        ctx->plugin_handle ? (llmt_plugin_nccl_fn)dlsym(ctx->plugin_handle, LLMT_CUDA_PLUGIN_NCCL)
                           : NULL;
    if (!entry)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: the CUDA plugin has no %s (a plugin from "
                         "another build of libllmt?)", fn, LLMT_CUDA_PLUGIN_NCCL);
    int rc = entry(&host, LLMT_NCCL_API_VERSION, api);
    if (rc == LLMT_EVERSION)
        return llmt_fail(LLMT_EVERSION, "%s: the CUDA plugin is from another build of libllmt "
                         "(backend ABI %d, NCCL table %d expected)", fn, LLMT_BACKEND_ABI,
                         LLMT_NCCL_API_VERSION);
    return rc ? llmt_fail_prefix(rc, "%s", fn) : LLMT_OK;
}

int llmt_comm_nccl_unique_id(llmt_context *ctx, uint8_t id[LLMT_COMM_NCCL_ID_BYTES])
{
    const char *fn = "llmt_comm_nccl_unique_id";
    if (!ctx || !id)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, ctx ? "id" : "ctx");
    const llmt_nccl_api *api = NULL;
    LLMT_TRY(nccl_api(ctx, fn, &api));
    int rc = api->unique_id(&host, id);
    return rc ? llmt_fail_prefix(rc, "%s", fn) : LLMT_OK;
}

int llmt_comm_create_nccl(llmt_comm **out, llmt_context *ctx,
                          const uint8_t id[LLMT_COMM_NCCL_ID_BYTES], int32_t rank, int32_t size)
{
    const char *fn = "llmt_comm_create_nccl";
    if (!out)
        return llmt_fail(LLMT_EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (!ctx || !id)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, ctx ? "id" : "ctx");
    if (size < 1 || rank < 0 || rank >= size)
        return llmt_fail(LLMT_EINVAL, "%s: rank = %d, size = %d (need 0 <= rank < size)", fn,
                         rank, size);
    const llmt_nccl_api *api = NULL;
    LLMT_TRY(nccl_api(ctx, fn, &api));
    llmt_comm_ops ops = LLMT_COMM_OPS_INIT;
    int rc = api->create(ctx->backend, id, rank, size, &ops);
    if (rc)
        return llmt_fail_prefix(rc, "%s", fn);
    rc = llmt_comm_adopt(out, &ops, api->destroy, ctx->backend);
    if (rc)
        return llmt_fail_prefix(rc, "%s", fn);
    (*out)->alltoallv_add = api->alltoallv_add;
    (*out)->join = api->join;
    return LLMT_OK;
}
