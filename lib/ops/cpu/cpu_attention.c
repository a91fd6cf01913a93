/* CPU causal attention with grouped-query heads.
 *
 * Work is cut into blocks of ATTN_QB query rows. For the block of rows
 * [i0, i1) only keys [0, i1) can be seen, so each block is a few small
 * single-threaded sgemms on [i1]-wide rows and the masked upper triangle is
 * mostly skipped (the sgemms are oneDNN's, on the thread's own state:
 * llmt_cpu_sgemm_serial). Forward tasks are (sequence, head); backward tasks are
 * (sequence, kv head), so the key and value gradients a kv head collects from
 * its query heads are summed by one thread in a fixed order. The
 * probabilities are computed by one function whether they are kept for
 * backward or recomputed there, so recompute gives the same bits. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

#define ATTN_QB 64

/* A [rows, cols] fp32 matrix view. */
typedef struct fview {
    float *p;
    int64_t ld;
} fview;

/* Per-thread scratch: probability and gradient blocks, and fp32 copies of
 * one head's Q, K, V, O, dO, dQ, dK, dV for 16-bit dtypes. */
static size_t per_thread_floats(int64_t seq, int64_t head_dim)
{
    return (size_t)(2 * ATTN_QB * seq + 8 * seq * head_dim);
}

size_t llmt_cpu_attention_saved_bytes(const llmt_attn_dims *a)
{
    /* The probabilities, fp32, full [seq, seq] per head (zero above the diagonal). */
    return (size_t)(a->batch * a->heads) * (size_t)a->seq * (size_t)a->seq * sizeof(float);
}

size_t llmt_cpu_attention_scratch(const llmt_op_dims *d)
{
    return per_thread_floats(d->seq, d->head_dim) * sizeof(float) * (size_t)d->num_threads;
}

/* A head's [seq, head_dim] slice starting at src (row stride ld, dtype dt) as
 * an fp32 view: the slice itself for F32, else a converted copy in buf. */
static fview load_slice(const void *src, int64_t seq, int64_t hd, int64_t ld, int dt, float *buf)
{
    if (dt == LLMT_DTYPE_F32)
        return (fview){(float *)src, ld};
    for (int64_t t = 0; t < seq; t++)
        for (int64_t i = 0; i < hd; i++)
            buf[t * hd + i] = get(src, dt, t * ld + i);
    return (fview){buf, hd};
}

/* Where to compute an output slice: dst itself for F32, else buf. */
static fview out_slice(void *dst, int64_t ld, int dt, float *buf, int64_t hd)
{
    return dt == LLMT_DTYPE_F32 ? (fview){dst, ld} : (fview){buf, hd};
}

/* Stores an fp32 slice computed in buf into dst (nothing to do for F32). */
static void store_slice(void *dst, int64_t ld, fview v, int64_t seq, int64_t hd, int dt)
{
    if (dt == LLMT_DTYPE_F32)
        return;
    for (int64_t t = 0; t < seq; t++)
        for (int64_t i = 0; i < hd; i++)
            put(dst, dt, t * ld + i, v.p[t * v.ld + i]);
}

/* Causal softmax of rows [i0, i1) of scale * Q K^T into p (row stride seq),
 * columns [0, i1); entries past the diagonal are zero. */
LLMT_CLONES static void softmax_rows(float *p, int64_t seq, int64_t i0, int64_t i1)
{
    for (int64_t r = 0; r < i1 - i0; r++) {
        float *row = p + r * seq;
        int64_t n = i0 + r + 1; /* visible keys */
        float inv = 1.0f / exp_sum(row, n, row_max(row, n), 1);
        for (int64_t k = 0; k < n; k++)
            row[k] *= inv;
        for (int64_t k = n; k < i1; k++)
            row[k] = 0.0f;
    }
}

/* Probabilities of query rows [i0, i1) of one head into p (stride seq). */
static int probs_block(llmt_device *dev, float *p, int64_t seq, fview q, fview k, int64_t hd,
                       float scale, int64_t i0, int64_t i1)
{
    LLMT_TRY(llmt_cpu_sgemm_serial(dev, 0, 1, i1 - i0, i1, hd, scale, q.p + i0 * q.ld, q.ld, k.p,
                                   k.ld, 0.0f, p, seq));
    softmax_rows(p, seq, i0, i1);
    return LLMT_OK;
}

/* The first failure of a parallel region's threads: its status and the
 * message the failing thread set (messages are per thread). */
typedef struct region_error {
    int code; /* LLMT_OK: none yet */
    char message[512];
} region_error;

/* Records status rc of the calling thread's product unless it succeeded or
 * another thread's failure was recorded first. */
static void note_failure(region_error *e, int rc)
{
    if (rc == LLMT_OK)
        return;
#pragma omp critical(llmt_attention_failure)
    if (e->code == LLMT_OK) {
        e->code = rc;
        snprintf(e->message, sizeof e->message, "%s", llmt_error_last());
    }
}

/* The region's status, its failing thread's message restated on the caller's. */
static int region_status(const region_error *e)
{
    return e->code == LLMT_OK ? LLMT_OK : llmt_fail(e->code, "cpu attention: %s", e->message);
}

typedef struct head_ptrs {
    const void *q, *k, *v; /* first row of the head's slices in qkv */
    int64_t ld;            /* qkv row stride */
} head_ptrs;

static head_ptrs head_of(const void *qkv, const llmt_attn_dims *a, int64_t b, int64_t h, int dt)
{
    int64_t group = a->heads / a->kv_heads, g = h / group;
    int64_t ld = (a->heads + 2 * a->kv_heads) * a->head_dim;
    const void *row0 = cat(qkv, dt, b * a->seq * ld);
    return (head_ptrs){cat(row0, dt, h * a->head_dim), cat(row0, dt, (a->heads + g) * a->head_dim),
                       cat(row0, dt, (a->heads + a->kv_heads + g) * a->head_dim), ld};
}

int llmt_cpu_attention_fwd(llmt_device *dev, void *out, void *probs, const void *qkv,
                           const llmt_attn_dims *a, int dt, void *scratch)
{
    const int64_t T = a->seq, hd = a->head_dim, H = a->heads;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t tasks = a->batch * H;
    region_error failed = {LLMT_OK, ""};
#pragma omp parallel num_threads(threads_for(dev, tasks * T * T * hd / 64))
    {
        float *mine = (float *)scratch + per_thread_floats(T, hd) * (size_t)omp_get_thread_num();
        float *pblk = mine, *cq = mine + 2 * ATTN_QB * T, *ck = cq + T * hd, *cv = ck + T * hd,
              *co = cv + T * hd;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t b = task / H, h = task % H;
            head_ptrs hp = head_of(qkv, a, b, h, dt);
            fview q = load_slice(hp.q, T, hd, hp.ld, dt, cq);
            fview k = load_slice(hp.k, T, hd, hp.ld, dt, ck);
            fview v = load_slice(hp.v, T, hd, hp.ld, dt, cv);
            void *o_dst = at(out, dt, b * T * H * hd + h * hd);
            fview o = out_slice(o_dst, H * hd, dt, co, hd);
            for (int64_t i0 = 0; i0 < T; i0 += ATTN_QB) {
                int64_t i1 = i0 + ATTN_QB < T ? i0 + ATTN_QB : T;
                float *p = probs ? (float *)probs + (task * T + i0) * T : pblk;
                int rc = probs_block(dev, p, T, q, k, hd, scale, i0, i1);
                if (rc == LLMT_OK)
                    rc = llmt_cpu_sgemm_serial(dev, 0, 0, i1 - i0, hd, i1, 1.0f, p, T, v.p, v.ld,
                                               0.0f, o.p + i0 * o.ld, o.ld);
                note_failure(&failed, rc);
            }
            store_slice(o_dst, H * hd, o, T, hd, dt);
        }
    }
    return region_status(&failed);
}

/* dS = P * (dP - D) with D[r] = dO[r] . O[r], over columns [0, i1). */
LLMT_CLONES static void softmax_bwd_rows(float *ds, const float *p, int64_t seq, int64_t rows,
                                         int64_t i1, const float *dout, const float *o,
                                         int64_t ld_o, int64_t hd)
{
    for (int64_t r = 0; r < rows; r++) {
        float d = 0.0f;
        for (int64_t i = 0; i < hd; i++)
            d += dout[r * ld_o + i] * o[r * ld_o + i];
        float *dsr = ds + r * seq;
        const float *pr = p + r * seq;
        for (int64_t j = 0; j < i1; j++)
            dsr[j] = pr[j] * (dsr[j] - d);
    }
}

int llmt_cpu_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                           const void *probs, const void *out, const llmt_attn_dims *a, int dt,
                           void *scratch)
{
    const int64_t T = a->seq, hd = a->head_dim, H = a->heads, KV = a->kv_heads;
    const int64_t group = H / KV;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t tasks = a->batch * KV;
    region_error failed = {LLMT_OK, ""};
#pragma omp parallel num_threads(threads_for(dev, a->batch * H * T * T * hd / 64))
    {
        float *mine = (float *)scratch + per_thread_floats(T, hd) * (size_t)omp_get_thread_num();
        float *ds = mine, *pblk = mine + ATTN_QB * T;
        float *cq = mine + 2 * ATTN_QB * T, *ck = cq + T * hd, *cv = ck + T * hd,
              *co = cv + T * hd, *cdo = co + T * hd, *cdq = cdo + T * hd, *cdk = cdq + T * hd,
              *cdv = cdk + T * hd;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t b = task / KV, g = task % KV;
            head_ptrs hp0 = head_of(qkv, a, b, g * group, dt);
            fview k = load_slice(hp0.k, T, hd, hp0.ld, dt, ck);
            fview v = load_slice(hp0.v, T, hd, hp0.ld, dt, cv);
            void *dk_dst = at(dqkv, dt, b * T * hp0.ld + (H + g) * hd);
            void *dv_dst = at(dqkv, dt, b * T * hp0.ld + (H + KV + g) * hd);
            fview dk = out_slice(dk_dst, hp0.ld, dt, cdk, hd);
            fview dv = out_slice(dv_dst, hp0.ld, dt, cdv, hd);
            for (int64_t t = 0; t < T; t++) {
                memset(dk.p + t * dk.ld, 0, (size_t)hd * sizeof(float));
                memset(dv.p + t * dv.ld, 0, (size_t)hd * sizeof(float));
            }
            for (int64_t h = g * group; h < (g + 1) * group; h++) {
                head_ptrs hp = head_of(qkv, a, b, h, dt);
                fview q = load_slice(hp.q, T, hd, hp.ld, dt, cq);
                int64_t o_off = b * T * H * hd + h * hd;
                fview o = load_slice(cat(out, dt, o_off), T, hd, H * hd, dt, co);
                fview dO = load_slice(cat(dout, dt, o_off), T, hd, H * hd, dt, cdo);
                void *dq_dst = at(dqkv, dt, b * T * hp.ld + h * hd);
                fview dq = out_slice(dq_dst, hp.ld, dt, cdq, hd);
                for (int64_t i0 = 0; i0 < T; i0 += ATTN_QB) {
                    int64_t i1 = i0 + ATTN_QB < T ? i0 + ATTN_QB : T, rows = i1 - i0;
                    const float *p = probs ? (const float *)probs + ((b * H + h) * T + i0) * T
                                           : pblk;
                    int rc = probs ? LLMT_OK : probs_block(dev, pblk, T, q, k, hd, scale, i0, i1);
                    /* dP = dO V^T, then dS in place */
                    if (rc == LLMT_OK)
                        rc = llmt_cpu_sgemm_serial(dev, 0, 1, rows, i1, hd, 1.0f, dO.p + i0 * dO.ld,
                                                   dO.ld, v.p, v.ld, 0.0f, ds, T);
                    if (rc != LLMT_OK) {
                        note_failure(&failed, rc);
                        continue;
                    }
                    softmax_bwd_rows(ds, p, T, rows, i1, dO.p + i0 * dO.ld, o.p + i0 * o.ld,
                                     o.ld, hd);
                    /* dQ = scale dS K; dK += scale dS^T Q; dV += P^T dO */
                    rc = llmt_cpu_sgemm_serial(dev, 0, 0, rows, hd, i1, scale, ds, T, k.p, k.ld,
                                               0.0f, dq.p + i0 * dq.ld, dq.ld);
                    if (rc == LLMT_OK)
                        rc = llmt_cpu_sgemm_serial(dev, 1, 0, i1, hd, rows, scale, ds, T,
                                                   q.p + i0 * q.ld, q.ld, 1.0f, dk.p, dk.ld);
                    if (rc == LLMT_OK)
                        rc = llmt_cpu_sgemm_serial(dev, 1, 0, i1, hd, rows, 1.0f, p, T,
                                                   dO.p + i0 * dO.ld, dO.ld, 1.0f, dv.p, dv.ld);
                    note_failure(&failed, rc);
                }
                store_slice(dq_dst, hp.ld, dq, T, hd, dt);
            }
            store_slice(dk_dst, hp0.ld, dk, T, hd, dt);
            store_slice(dv_dst, hp0.ld, dv, T, hd, dt);
        }
    }
    return region_status(&failed);
}
