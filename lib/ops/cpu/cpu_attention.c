/* CPU causal attention with grouped-query heads.
 *
 * Work is cut into blocks of ATTN_QB query rows. For the block of rows
 * [i0, i1) only keys [0, i1) can be seen, so each block is a few small
 * single-threaded GEMMs on [i1]-wide rows and the masked upper triangle is
 * mostly skipped (the GEMMs are oneDNN's, on the thread's own state:
 * llmt_cpu_gemm_serial). Forward tasks are (sequence, head); backward tasks are
 * (sequence, kv head), so the key and value gradients a kv head collects from
 * its query heads are summed by one thread in a fixed order. The
 * probabilities are computed by one function whether they are kept for
 * backward or recomputed there, so recompute gives the same bits.
 *
 * The products' operands: fp32 for F32; for 16-bit dtypes, fp32 copies of
 * the head's slices, except where the device's GEMMs in that dtype run
 * natively (llmt_cpu_gemm_native: bf16 on AVX512_BF16). There the scores
 * Q K^T and all four backward products take Q, K, V, O and dO as stored,
 * with the probabilities and their gradient (computed in fp32) rounded to
 * the dtype for the products that take them; fp32 accumulation, scores and
 * key/value gradients in fp32, dQ rounded once. Forward's P V stays fp32 (V
 * copied), so that the output is the one the KV-cache attention of
 * generation (cpu_attention_kv.c, fp32) computes: rounding P there moved a
 * tiny bf16 model's cached logits 2% of the largest away from a full
 * recompute (test_generate), where they are otherwise bit-equal. It is one
 * product of six in a training step's attention. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_signals.h"

#define ATTN_QB 64

/* A matrix view: rows of ld elements of dtype dt (F32, or the storage
 * dtype where products in it run natively). */
typedef struct mview {
    void *p;
    int64_t ld;
    int dt;
} mview;

/* The view from row r on. */
static mview from_row(mview v, int64_t r)
{
    return (mview){at(v.p, v.dt, r * v.ld), v.ld, v.dt};
}

/* C = alpha op(A) op(B) + beta C on the calling thread; A and B of one dtype. */
static int product(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, mview a, mview b, float beta, mview c)
{
    return llmt_cpu_gemm_serial(dev, trans_a, trans_b, m, n, k, alpha, a.p, a.ld, b.p, b.ld, beta,
                                c.p, c.ld, a.dt, c.dt);
}

/* Per-thread scratch: probability and gradient blocks, and fp32 copies of
 * one head's Q, K, V, O, dO, dQ, dK, dV for 16-bit dtypes (native: V in
 * forward, dK and dV in backward only). */
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
 * a product operand: the slice itself for F32 or where dt is native, else an
 * fp32 copy in buf. */
static mview load_slice(const void *src, int64_t seq, int64_t hd, int64_t ld, int dt, int native,
                        float *buf)
{
    if (dt == LLMT_DTYPE_F32 || native)
        return (mview){(void *)src, ld, dt};
    for (int64_t t = 0; t < seq; t++)
        for (int64_t i = 0; i < hd; i++)
            buf[t * hd + i] = get(src, dt, t * ld + i);
    return (mview){buf, hd, LLMT_DTYPE_F32};
}

/* Where to compute an output slice: dst itself for F32 or, with direct (a
 * slice written once, by products that round their result), where dt is
 * native; else fp32 in buf. */
static mview out_slice(void *dst, int64_t ld, int dt, int direct, float *buf, int64_t hd)
{
    if (dt == LLMT_DTYPE_F32 || direct)
        return (mview){dst, ld, dt};
    return (mview){buf, hd, LLMT_DTYPE_F32};
}

/* Stores a slice computed in fp32 in buf into dst, of 16-bit dtype dt
 * (nothing to do where it was computed in place). */
LLMT_CLONES static void store_slice(void *dst, int64_t ld, mview v, int64_t seq, int64_t hd,
                                    int dt)
{
    if (v.p == dst)
        return;
    for (int64_t t = 0; t < seq; t++)
        round_to_16bit((uint16_t *)dst + t * ld, (const float *)v.p + t * v.ld, hd, dt);
}

/* Rows [0, rows) x columns [0, cols) of fp32 src (row stride seq) rounded to
 * 16-bit dtype dt into dst, row r at dst + 2 r seq elements: the first half
 * of src's own row r where dst is src (rounded in place). Each block is read
 * before memcpy overwrites any of it, and the 16-bit slots written lie below
 * the fp32 elements still to be read. */
#define ROUND_BLOCK 64
LLMT_CLONES static void round_rows_into(void *dst, const float *src, int64_t seq, int64_t rows,
                                        int64_t cols, int dt)
{
    uint16_t tmp[ROUND_BLOCK];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j += ROUND_BLOCK) {
            int64_t len = cols - j < ROUND_BLOCK ? cols - j : ROUND_BLOCK;
            round_to_16bit(tmp, src + r * seq + j, len, dt);
            memcpy((uint16_t *)dst + 2 * r * seq + j, tmp, (size_t)len * sizeof *tmp);
        }
}

static mview round_rows(void *dst, const float *src, int64_t seq, int64_t rows, int64_t cols,
                        int dt)
{
    round_rows_into(dst, src, seq, rows, cols, dt);
    return (mview){dst, 2 * seq, dt};
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
static int probs_block(llmt_device *dev, float *p, int64_t seq, mview q, mview k, int64_t hd,
                       float scale, int64_t i0, int64_t i1)
{
    LLMT_TRY(product(dev, 0, 1, i1 - i0, i1, hd, scale, from_row(q, i0), k, 0.0f,
                     (mview){p, seq, LLMT_DTYPE_F32}));
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
    const int native = dt != LLMT_DTYPE_F32 && llmt_cpu_gemm_native(dev, dt);
    region_error failed = {LLMT_OK, ""};
#pragma omp parallel num_threads(threads_for(dev, tasks * T * T * hd / 64))
    {
        llmt_cpu_signals_hold(); /* many products: once for them all */
        float *mine = (float *)scratch + per_thread_floats(T, hd) * (size_t)omp_get_thread_num();
        float *pblk = mine, *cq = mine + 2 * ATTN_QB * T, *ck = cq + T * hd, *cv = ck + T * hd,
              *co = cv + T * hd;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t b = task / H, h = task % H;
            head_ptrs hp = head_of(qkv, a, b, h, dt);
            mview q = load_slice(hp.q, T, hd, hp.ld, dt, native, cq);
            mview k = load_slice(hp.k, T, hd, hp.ld, dt, native, ck);
            /* P V in fp32, native or not (head of the file) */
            mview v = load_slice(hp.v, T, hd, hp.ld, dt, 0, cv);
            void *o_dst = at(out, dt, b * T * H * hd + h * hd);
            mview o = out_slice(o_dst, H * hd, dt, 0, co, hd);
            for (int64_t i0 = 0; i0 < T; i0 += ATTN_QB) {
                int64_t i1 = i0 + ATTN_QB < T ? i0 + ATTN_QB : T;
                float *p = probs ? (float *)probs + (task * T + i0) * T : pblk;
                int rc = probs_block(dev, p, T, q, k, hd, scale, i0, i1);
                if (rc == LLMT_OK)
                    rc = product(dev, 0, 0, i1 - i0, hd, i1, 1.0f, (mview){p, T, LLMT_DTYPE_F32},
                                 v, 0.0f, from_row(o, i0));
                note_failure(&failed, rc);
            }
            store_slice(o_dst, H * hd, o, T, hd, dt);
        }
        llmt_cpu_signals_release();
    }
    return region_status(&failed);
}

/* dS = P * (dP - D) with D[r] = dO[r] . O[r], over columns [0, i1); dO
 * and O of one dtype and row stride. */
LLMT_CLONES static void softmax_bwd_rows(float *ds, const float *p, int64_t seq, int64_t rows,
                                         int64_t i1, mview dout, mview o, int64_t hd)
{
    for (int64_t r = 0; r < rows; r++) {
        float d = 0.0f;
        for (int64_t i = 0; i < hd; i++)
            d += get(dout.p, dout.dt, r * dout.ld + i) * get(o.p, o.dt, r * o.ld + i);
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
    const int native = dt != LLMT_DTYPE_F32 && llmt_cpu_gemm_native(dev, dt);
    region_error failed = {LLMT_OK, ""};
#pragma omp parallel num_threads(threads_for(dev, a->batch * H * T * T * hd / 64))
    {
        llmt_cpu_signals_hold(); /* many products: once for them all */
        float *mine = (float *)scratch + per_thread_floats(T, hd) * (size_t)omp_get_thread_num();
        float *ds = mine, *pblk = mine + ATTN_QB * T;
        float *cq = mine + 2 * ATTN_QB * T, *ck = cq + T * hd, *cv = ck + T * hd,
              *co = cv + T * hd, *cdo = co + T * hd, *cdq = cdo + T * hd, *cdk = cdq + T * hd,
              *cdv = cdk + T * hd;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t b = task / KV, g = task % KV;
            head_ptrs hp0 = head_of(qkv, a, b, g * group, dt);
            mview k = load_slice(hp0.k, T, hd, hp0.ld, dt, native, ck);
            mview v = load_slice(hp0.v, T, hd, hp0.ld, dt, native, cv);
            void *dk_dst = at(dqkv, dt, b * T * hp0.ld + (H + g) * hd);
            void *dv_dst = at(dqkv, dt, b * T * hp0.ld + (H + KV + g) * hd);
            /* accumulated over blocks and heads: fp32 */
            mview dk = out_slice(dk_dst, hp0.ld, dt, 0, cdk, hd);
            mview dv = out_slice(dv_dst, hp0.ld, dt, 0, cdv, hd);
            for (int64_t t = 0; t < T; t++) {
                memset((float *)dk.p + t * dk.ld, 0, (size_t)hd * sizeof(float));
                memset((float *)dv.p + t * dv.ld, 0, (size_t)hd * sizeof(float));
            }
            const mview ds_f32 = {ds, T, LLMT_DTYPE_F32};
            for (int64_t h = g * group; h < (g + 1) * group; h++) {
                head_ptrs hp = head_of(qkv, a, b, h, dt);
                mview q = load_slice(hp.q, T, hd, hp.ld, dt, native, cq);
                int64_t o_off = b * T * H * hd + h * hd;
                mview o = load_slice(cat(out, dt, o_off), T, hd, H * hd, dt, native, co);
                mview dO = load_slice(cat(dout, dt, o_off), T, hd, H * hd, dt, native, cdo);
                void *dq_dst = at(dqkv, dt, b * T * hp.ld + h * hd);
                mview dq = out_slice(dq_dst, hp.ld, dt, native, cdq, hd);
                for (int64_t i0 = 0; i0 < T; i0 += ATTN_QB) {
                    int64_t i1 = i0 + ATTN_QB < T ? i0 + ATTN_QB : T, rows = i1 - i0;
                    const float *p = probs ? (const float *)probs + ((b * H + h) * T + i0) * T
                                           : pblk;
                    int rc = probs ? LLMT_OK : probs_block(dev, pblk, T, q, k, hd, scale, i0, i1);
                    /* dP = dO V^T, then dS in place */
                    if (rc == LLMT_OK)
                        rc = product(dev, 0, 1, rows, i1, hd, 1.0f, from_row(dO, i0), v, 0.0f,
                                     ds_f32);
                    if (rc != LLMT_OK) {
                        note_failure(&failed, rc);
                        continue;
                    }
                    softmax_bwd_rows(ds, p, T, rows, i1, from_row(dO, i0), from_row(o, i0), hd);
                    /* native: dS rounded in place, P into pblk (in place when recomputed) */
                    mview dsv = native ? round_rows(ds, ds, T, rows, i1, dt) : ds_f32;
                    mview pv = native ? round_rows(pblk, p, T, rows, i1, dt)
                                      : (mview){(float *)p, T, LLMT_DTYPE_F32};
                    /* dQ = scale dS K; dK += scale dS^T Q; dV += P^T dO */
                    rc = product(dev, 0, 0, rows, hd, i1, scale, dsv, k, 0.0f, from_row(dq, i0));
                    if (rc == LLMT_OK)
                        rc = product(dev, 1, 0, i1, hd, rows, scale, dsv, from_row(q, i0), 1.0f,
                                     dk);
                    if (rc == LLMT_OK)
                        rc = product(dev, 1, 0, i1, hd, rows, 1.0f, pv, from_row(dO, i0), 1.0f,
                                     dv);
                    note_failure(&failed, rc);
                }
                store_slice(dq_dst, hp.ld, dq, T, hd, dt);
            }
            store_slice(dk_dst, hp0.ld, dk, T, hd, dt);
            store_slice(dv_dst, hp0.ld, dv, T, hd, dt);
        }
        llmt_cpu_signals_release();
    }
    return region_status(&failed);
}
