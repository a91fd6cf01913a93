/* The op profiler: a wrapping op table (see op_profile.h). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include "op_profile.h"

#include <string.h>

#include "bench_util.h"
#include "core/context_internal.h"

/* The installed profiler: the wrappers' only way to it, since an op gets
 * the backend's device, not the table it was called through. */
static op_profile *g_prof;

/* Before a call: while recording, waits for the device's earlier work so
 * that only the call is timed, and notes the time in *t0. */
static int call_begin(llmt_device *dev, double *t0)
{
    if (!g_prof->recording)
        return LLMT_OK;
    int rc = g_prof->inner->synchronize(dev);
    *t0 = bench_now();
    return rc;
}

/* After a call that returned rc: while recording and when it succeeded,
 * waits for it to finish and adds it to family f. Returns the first failure. */
static int call_end(llmt_device *dev, int rc, int f, op_cost cost, double t0)
{
    if (rc != LLMT_OK || !g_prof->recording)
        return rc;
    rc = g_prof->inner->synchronize(dev);
    g_prof->family[f].seconds += bench_now() - t0;
    op_cost_add(&g_prof->family[f].cost, cost);
    return rc;
}

/* The body of a wrapper: `call` on the inner table, timed into family f. */
#define TIMED(f, cost, call)                                   \
    do {                                                       \
        double t0_ = 0.0;                                      \
        int rc_ = call_begin(dev, &t0_);                       \
        if (rc_ == LLMT_OK)                                    \
            rc_ = g_prof->inner->call;                         \
        return call_end(dev, rc_, (f), (cost), t0_);           \
    } while (0)

static int p_copy_to_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    TIMED(OP_COPY, op_cost_bytes((double)bytes), copy_to_device(dev, dst, src, bytes));
}

static int p_copy_to_host(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    TIMED(OP_COPY, op_cost_bytes((double)bytes), copy_to_host(dev, dst, src, bytes));
}

static int p_copy_on_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    TIMED(OP_COPY, op_cost_bytes(2.0 * (double)bytes), copy_on_device(dev, dst, src, bytes));
}

static int p_mem_zero(llmt_device *dev, void *dst, size_t bytes)
{
    TIMED(OP_COPY, op_cost_bytes((double)bytes), mem_zero(dev, dst, bytes));
}

/* The model's forward products are all X W^T (B transposed); its backward
 * ones dY W and dY^T X are not (lib/model/forward.c, backward.c). */
static int p_gemm(llmt_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c,
                  int64_t ldc, int dt, void *scratch)
{
    TIMED(tb ? OP_GEMM_FWD : OP_GEMM_BWD,
          op_cost_gemm(m, n, k, beta != 0.0f, (int64_t)llmt_dtype_size(dt)),
          gemm(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, scratch));
}

/* gemm with a separate output (the residual adds): C read, D written, the
 * bytes of an accumulated product. */
static int p_gemm_cd(llmt_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k,
                     float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                     float beta, const void *c, int64_t ldc, void *d, int64_t ldd, int dt,
                     void *scratch)
{
    TIMED(tb ? OP_GEMM_FWD : OP_GEMM_BWD,
          op_cost_gemm(m, n, k, beta != 0.0f, (int64_t)llmt_dtype_size(dt)),
          gemm_cd(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, d, ldd, dt, scratch));
}

static int p_embedding_fwd(llmt_device *dev, void *out, const void *table, const int32_t *ids,
                           int64_t m, int64_t d, int dt)
{
    TIMED(OP_EMBEDDING, op_cost_embedding(m, d, 0, (int64_t)llmt_dtype_size(dt)),
          embedding_fwd(dev, out, table, ids, m, d, dt));
}

static int p_embedding_bwd(llmt_device *dev, void *dtable, const void *dout, const int32_t *ids,
                           int64_t m, int64_t d, int dt)
{
    TIMED(OP_EMBEDDING, op_cost_embedding(m, d, 1, (int64_t)llmt_dtype_size(dt)),
          embedding_bwd(dev, dtable, dout, ids, m, d, dt));
}

static int p_rmsnorm_fwd(llmt_device *dev, void *out, float *rstd, const void *x, const void *w,
                         int64_t m, int64_t d, float eps, int dt)
{
    TIMED(OP_RMSNORM, op_cost_rmsnorm(m, d, 0, 0, (int64_t)llmt_dtype_size(dt)),
          rmsnorm_fwd(dev, out, rstd, x, w, m, d, eps, dt));
}

static int p_rmsnorm_bwd(llmt_device *dev, void *dx, void *dw, const void *dout, const void *x,
                         const void *w, const float *rstd, int64_t m, int64_t d, int accumulate,
                         int dt, void *scratch)
{
    TIMED(OP_RMSNORM, op_cost_rmsnorm(m, d, 1, accumulate, (int64_t)llmt_dtype_size(dt)),
          rmsnorm_bwd(dev, dx, dw, dout, x, w, rstd, m, d, accumulate, dt, scratch));
}

static int p_rope(llmt_device *dev, void *x, const float *cos_sin, int64_t m, int64_t seq,
                  int64_t heads, int64_t head_dim, int64_t row_stride, int inverse, int dt)
{
    TIMED(OP_ROPE, op_cost_rope(m, seq, heads, head_dim, (int64_t)llmt_dtype_size(dt)),
          rope(dev, x, cos_sin, m, seq, heads, head_dim, row_stride, inverse, dt));
}

static int p_attention_fwd(llmt_device *dev, void *out, void *saved, const void *qkv,
                           const llmt_attn_dims *a, int dt, void *scratch)
{
    TIMED(OP_ATTN_FWD, op_cost_attention(a, 0, (int64_t)llmt_dtype_size(dt)),
          attention_fwd(dev, out, saved, qkv, a, dt, scratch));
}

static int p_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                           const void *saved, const void *out, const llmt_attn_dims *a, int dt,
                           void *scratch)
{
    TIMED(OP_ATTN_BWD, op_cost_attention(a, 1, (int64_t)llmt_dtype_size(dt)),
          attention_bwd(dev, dqkv, dout, qkv, saved, out, a, dt, scratch));
}

static int p_swiglu_fwd(llmt_device *dev, void *out, const void *gate_up, int64_t m, int64_t f,
                        int dt)
{
    TIMED(OP_SWIGLU, op_cost_swiglu(m, f, 0, (int64_t)llmt_dtype_size(dt)),
          swiglu_fwd(dev, out, gate_up, m, f, dt));
}

static int p_swiglu_bwd(llmt_device *dev, void *dgate_up, const void *dout, const void *gate_up,
                        int64_t m, int64_t f, int dt)
{
    TIMED(OP_SWIGLU, op_cost_swiglu(m, f, 1, (int64_t)llmt_dtype_size(dt)),
          swiglu_bwd(dev, dgate_up, dout, gate_up, m, f, dt));
}

static int p_cast(llmt_device *dev, void *dst, int dst_dt, const void *src, int src_dt, int64_t n)
{
    TIMED(OP_ELEMENTWISE,
          op_cost_cast(n, (int64_t)llmt_dtype_size(src_dt), (int64_t)llmt_dtype_size(dst_dt)),
          cast(dev, dst, dst_dt, src, src_dt, n));
}

static int p_add(llmt_device *dev, void *y, const void *x, int64_t n, int dt)
{
    TIMED(OP_ELEMENTWISE, op_cost_bytes(3.0 * (double)n * (double)llmt_dtype_size(dt)),
          add(dev, y, x, n, dt));
}

static int p_accumulate(llmt_device *dev, float *sum, const void *x, int64_t n, int dt)
{
    TIMED(OP_ELEMENTWISE, op_cost_accumulate(n, (int64_t)llmt_dtype_size(dt)),
          accumulate(dev, sum, x, n, dt));
}

static int p_lm_head_ce(llmt_device *dev, const llmt_ce_args *a)
{
    TIMED(OP_LM_HEAD_CE,
          op_cost_lm_head_ce(a->m, a->d, a->vocab, a->want_grad, (int64_t)llmt_dtype_size(a->dt)),
          lm_head_ce(dev, a));
}

static int p_grad_stats(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                        double *sumsq, int64_t *nonfinite, void *scratch)
{
    TIMED(OP_OPTIMIZER, op_cost_grad_stats(n, (int64_t)llmt_dtype_size(dt)),
          grad_stats(dev, g, n, dt, factor, sumsq, nonfinite, scratch));
}

static int p_grad_stats_blocks(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                               int64_t block, double *partials, int64_t *nonfinite,
                               void *scratch)
{
    TIMED(OP_OPTIMIZER, op_cost_grad_stats(n, (int64_t)llmt_dtype_size(dt)),
          grad_stats_blocks(dev, g, n, dt, factor, block, partials, nonfinite, scratch));
}

static int p_adamw(llmt_device *dev, const llmt_adamw_args *a)
{
    TIMED(OP_OPTIMIZER,
          op_cost_adamw(a->n, (int64_t)llmt_dtype_size(a->w_dt), a->master != NULL,
                        (int64_t)llmt_dtype_size(a->state_dt)),
          adamw(dev, a));
}

/* t->op = wrapper where the backend has the op. */
#define WRAP(op) (t->op = t->op ? p_##op : NULL)

int op_profile_install(op_profile *p, llmt_context *ctx)
{
    if (!p || !ctx || g_prof)
        return -1;
    memset(p, 0, sizeof *p);
    p->inner = ctx->backend->ops;
    p->table = *p->inner;
    llmt_backend_ops *t = &p->table;
    WRAP(copy_to_device);
    WRAP(copy_to_host);
    WRAP(copy_on_device);
    WRAP(mem_zero);
    WRAP(gemm);
    WRAP(gemm_cd);
    WRAP(embedding_fwd);
    WRAP(embedding_bwd);
    WRAP(rmsnorm_fwd);
    WRAP(rmsnorm_bwd);
    WRAP(rope);
    WRAP(attention_fwd);
    WRAP(attention_bwd);
    WRAP(swiglu_fwd);
    WRAP(swiglu_bwd);
    WRAP(cast);
    WRAP(add);
    WRAP(accumulate);
    WRAP(lm_head_ce);
    WRAP(grad_stats);
    WRAP(grad_stats_blocks);
    WRAP(adamw);
    g_prof = p;
    ctx->backend->ops = &p->table;
    return 0;
}

void op_profile_uninstall(op_profile *p, llmt_context *ctx)
{
    if (!p || !ctx || g_prof != p)
        return;
    ctx->backend->ops = p->inner;
    g_prof = NULL;
}

void op_profile_reset(op_profile *p)
{
    memset(p->family, 0, sizeof p->family);
}
