/* Op tests of causal attention with GQA (descriptors used by test_ops.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/half.h"
#include "core/rng.h"
#include "test_rand.h"

/* Attention forward and backward with grouped-query heads; sequence lengths
 * that are not multiples of any tile; backward with the saved state and
 * with recompute (which must give the same bits). */

typedef struct attn_case {
    int batch, seq, heads, kv_heads, head_dim;
} attn_case;

static const attn_case attn_cases[] = {
    {2, 77, 4, 2, 32}, /* GQA, two query blocks, three key tiles */
    {1, 40, 2, 1, 64}, /* MQA */
    {1, 33, 2, 2, 128},
    {1, 200, 4, 1, 64}, /* four query blocks, group of four heads */
};
#define ATTN_CASES ((int)(sizeof attn_cases / sizeof attn_cases[0]))

typedef struct attn_in {
    int dt;
    attn_case c;
    float *qkv, *dout;
} attn_in;

static const char *attn_name(int v)
{
    static char buf[ATTN_CASES * 3][64];
    const attn_case *c = &attn_cases[v % ATTN_CASES];
    snprintf(buf[v], sizeof buf[v], "%s B%d T%d H%d/%d hd%d",
             llmt_dtype_name(dtypes[v / ATTN_CASES]), c->batch, c->seq, c->heads, c->kv_heads,
             c->head_dim);
    return buf[v];
}

static int attn_dt(int v)
{
    return dtypes[v / ATTN_CASES];
}

static int64_t attn_ld(const attn_case *c)
{
    return (int64_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
}

static void *attn_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    attn_in *in = calloc(1, sizeof *in);
    in->dt = attn_dt(v);
    in->c = attn_cases[v % ATTN_CASES];
    const int64_t m = (int64_t)in->c.batch * in->c.seq;
    in->qkv = randn(&s, m * attn_ld(&in->c), 1.0, in->dt);
    in->dout = randn(&s, m * in->c.heads * in->c.head_dim, 1.0, in->dt);
    return in;
}

static void attn_free(void *p)
{
    attn_in *in = p;
    free(in->qkv);
    free(in->dout);
    free(in);
}

static void attn_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const attn_in *in = p;
    const int dt = in->dt;
    const attn_case *c = &in->c;
    const size_t e = llmt_dtype_size(dt);
    const int64_t m = (int64_t)c->batch * c->seq, ld = attn_ld(c);
    const int64_t od = (int64_t)c->heads * c->head_dim;
    llmt_attn_dims ad = {c->batch, c->seq, c->heads, c->kv_heads, c->head_dim};
    llmt_op_dims dims = {0};
    dims.batch = c->batch, dims.seq = c->seq, dims.hidden = od, dims.heads = c->heads;
    dims.kv_heads = c->kv_heads, dims.head_dim = c->head_dim, dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, 0);
    void *qkv = dput(b, in->qkv, m * ld, dt), *dout = dput(b, in->dout, m * od, dt);
    void *o = dalloc(b, (size_t)(m * od) * e);
    void *saved = dalloc(b, b->ops->attention_saved_bytes(&ad));
    void *dqkv = dalloc(b, (size_t)(m * ld) * e), *dqkv2 = dalloc(b, (size_t)(m * ld) * e);
    OK(b->ops->attention_fwd(b->dev, o, saved, qkv, &ad, dt, scratch));
    OK(b->ops->attention_bwd(b->dev, dqkv, dout, qkv, saved, o, &ad, dt, scratch));
    OK(b->ops->attention_bwd(b->dev, dqkv2, dout, qkv, NULL, o, &ad, dt, scratch));
    add_dev(out, b, "out", o, m * od, dt);
    add_dev(out, b, "dqkv", dqkv, m * ld, dt);
    /* Recompute gives the bits of the saved state. */
    void *h1 = malloc((size_t)(m * ld) * e), *h2 = malloc((size_t)(m * ld) * e);
    OK(b->ops->copy_to_host(b->dev, h1, dqkv, (size_t)(m * ld) * e));
    OK(b->ops->copy_to_host(b->dev, h2, dqkv2, (size_t)(m * ld) * e));
    if (memcmp(h1, h2, (size_t)(m * ld) * e) != 0)
        fail_msg("attention %s on %s: backward with recompute differs from backward with the "
                 "saved state", attn_name(v), b->name);
    free(h1);
    free(h2);
    dfree(b, qkv);
    dfree(b, dout);
    dfree(b, o);
    dfree(b, saved);
    dfree(b, dqkv);
    dfree(b, dqkv2);
    dfree(b, scratch);
}

static void attn_ref(int v, const void *p, result *out)
{
    (void)v;
    const attn_in *in = p;
    const attn_case *c = &in->c;
    const int T = c->seq, H = c->heads, hd = c->head_dim, group = c->heads / c->kv_heads;
    const int64_t m = (int64_t)c->batch * T, ld = attn_ld(c), od = (int64_t)H * hd;
    const double scale = 1.0 / sqrt((double)hd);
    double *o = dzeros(m * od), *dqkv = dzeros(m * ld);
    double *pr = dzeros((int64_t)T * T), *dp = dzeros((int64_t)T * T);
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < H; h++) {
            const int g = h / group;
            const float *base = in->qkv + (int64_t)b * T * ld;
#define Q(i, k) base[(int64_t)(i) * ld + h * hd + (k)]
#define K(j, k) base[(int64_t)(j) * ld + (H + g) * hd + (k)]
#define V(j, k) base[(int64_t)(j) * ld + (H + c->kv_heads + g) * hd + (k)]
#define DO(i, k) in->dout[((int64_t)b * T + (i)) * od + h * hd + (k)]
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int k = 0; k < hd; k++)
                        s += (double)Q(i, k) * K(j, k);
                    pr[i * T + j] = s * scale;
                    mx = fmax(mx, s * scale);
                }
                for (int j = 0; j <= i; j++)
                    sum += (pr[i * T + j] = exp(pr[i * T + j] - mx));
                for (int j = 0; j <= i; j++)
                    pr[i * T + j] /= sum;
                for (int k = 0; k < hd; k++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++)
                        acc += pr[i * T + j] * V(j, k);
                    o[((int64_t)b * T + i) * od + h * hd + k] = acc;
                }
            }
            for (int i = 0; i < T; i++) {
                double dsum = 0; /* D_i = sum_j P_ij dP_ij */
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int k = 0; k < hd; k++)
                        s += (double)DO(i, k) * V(j, k);
                    dp[i * T + j] = s;
                    dsum += pr[i * T + j] * s;
                }
                double *dq = dqkv + ((int64_t)b * T + i) * ld + h * hd;
                for (int j = 0; j <= i; j++) {
                    double ds = pr[i * T + j] * (dp[i * T + j] - dsum);
                    double *dk = dqkv + ((int64_t)b * T + j) * ld + (H + g) * hd;
                    double *dv = dqkv + ((int64_t)b * T + j) * ld + (H + c->kv_heads + g) * hd;
                    for (int k = 0; k < hd; k++) {
                        dq[k] += scale * ds * K(j, k);
                        dk[k] += scale * ds * Q(i, k);
                        dv[k] += pr[i * T + j] * DO(i, k);
                    }
                }
            }
#undef Q
#undef K
#undef V
#undef DO
        }
    add_d(out, "out", o, m * od);
    add_d(out, "dqkv", dqkv, m * ld);
    free(o);
    free(dqkv);
    free(pr);
    free(dp);
}

const op_test attn_test = {"attention", 3 * ATTN_CASES, attn_name, attn_dt, attn_make,
                                  attn_run, attn_ref, attn_free, 1.0};
