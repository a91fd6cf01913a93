/* The CPU backend's op table and constructor. */
#include <stdlib.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

/* Scratch is shared by the ops (they run one at a time): the largest need. */
static size_t cpu_scratch_bytes(const llmt_op_dims *d)
{
    size_t need[4] = {(size_t)d->num_threads * (size_t)d->hidden * sizeof(float),
                      llmt_cpu_attention_scratch(d), llmt_cpu_ce_scratch(d),
                      llmt_cpu_gemm_scratch(d)};
    size_t most = 0;
    for (int i = 0; i < 4; i++)
        most = need[i] > most ? need[i] : most;
    return most;
}

/* Rows of the LM head's cross-entropy the CPU computes at once, whatever
 * the batch: a chunk's fp32 logits stay small enough to be reused from
 * cache by the backward products. */
#define CPU_CE_CHUNK 256

static int64_t cpu_ce_chunk(int64_t m, int64_t vocab)
{
    (void)vocab;
    return m < CPU_CE_CHUNK ? m : CPU_CE_CHUNK;
}

static const llmt_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .mem_alloc = llmt_cpu_mem_alloc,
    .mem_free = llmt_cpu_mem_free,
    .copy_to_device = llmt_cpu_copy,
    .copy_to_host = llmt_cpu_copy,
    .copy_on_device = llmt_cpu_copy,
    .mem_zero = llmt_cpu_mem_zero,
    .mem_info = llmt_cpu_mem_info,
    .synchronize = llmt_cpu_synchronize,
    .copy_to_host_async = NULL, /* host memory: every copy is synchronous */
    .wait_fence = NULL,
    .copy_to_device_async = NULL,
    .fence_sync = NULL,
    .destroy = llmt_cpu_destroy,
    .scratch_bytes = cpu_scratch_bytes,
    .gemm = llmt_cpu_gemm,
    .gemm_cd = llmt_cpu_gemm_cd,
    .embedding_fwd = llmt_cpu_embedding_fwd,
    .embedding_bwd = llmt_cpu_embedding_bwd,
    .rmsnorm_fwd = llmt_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = llmt_cpu_rmsnorm_bwd,
    .rope = llmt_cpu_rope,
    .attention_saved_bytes = llmt_cpu_attention_saved_bytes,
    .attention_fwd = llmt_cpu_attention_fwd,
    .attention_bwd = llmt_cpu_attention_bwd,
    .swiglu_fwd = llmt_cpu_swiglu_fwd,
    .swiglu_bwd = llmt_cpu_swiglu_bwd,
    .cast = llmt_cpu_cast,
    .add = llmt_cpu_add,
    .lm_head_ce = llmt_cpu_lm_head_ce,
    .ce_chunk = cpu_ce_chunk,
    .optim_scratch_bytes = 0,
    .grad_stats = llmt_cpu_grad_stats,
    .grad_stats_blocks = llmt_cpu_grad_stats_blocks,
    .adamw = llmt_cpu_adamw,
    .attention_kv_fwd = llmt_cpu_attention_kv_fwd,
    .attention_kv_scratch_bytes = llmt_cpu_attention_kv_scratch,
    .accumulate = llmt_cpu_accumulate,
};

int llmt_cpu_backend_create(int num_threads, llmt_device **out)
{
    llmt_cpu_device *cpu = calloc(1, sizeof *cpu);
    if (!cpu)
        return llmt_fail(LLMT_ENOMEM, "cpu backend: out of host memory");
    cpu->base.ops = &cpu_ops;
    cpu->base.num_threads = num_threads;
    cpu->onednn_thread = calloc((size_t)num_threads, sizeof *cpu->onednn_thread);
    int rc = cpu->onednn_thread ? llmt_onednn_create(&cpu->onednn)
                                : llmt_fail(LLMT_ENOMEM, "cpu backend: out of host memory");
    for (int t = 0; rc == LLMT_OK && t < num_threads; t++)
        rc = llmt_onednn_create(&cpu->onednn_thread[t]);
    if (rc != LLMT_OK) {
        llmt_cpu_destroy(&cpu->base);
        return rc;
    }
    for (int dt = 0; dt < 3; dt++)
        cpu->gemm_native[dt] = llmt_onednn_native(dt);
    *out = &cpu->base;
    return LLMT_OK;
}
