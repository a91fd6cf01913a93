/* Op tests of the fused LM head and cross-entropy (descriptors used by test_ops.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/half.h"
#include "core/rng.h"
#include "test_rand.h"

/* Fused LM head and cross-entropy: three chunks (the last partial), ignored
 * targets, with and without gradient, logits copied out, and logits only;
 * then all rows as one chunk (the CUDA backend's usual case: the head's
 * gradient goes straight into dw) with gradient. Each backend's chunk and
 * the CUDA scratch are checked against hand-computed values. Variant v is
 * dtype dtypes[v % 3] and vocabulary ce_vocabs[v / 3]. */

enum { CM = 23, CCHUNK = 8, CD = 40, CE_VOCABS = 2 };
/* Both over twice the CUDA row kernel's 512 threads: three in-place tiles
 * per row, the last partial. 1103 is no multiple of 4: the CUDA op pads its
 * fp32 logits rows to 1104 floats, so the rows of a 16-bit gradient
 * (stride 2208) and the copied-out logits (stride 1103) differ from the
 * padded fp32 rows, and reading the padding would take in poison. */
static const int ce_vocabs[CE_VOCABS] = {1100, 1103};
static const float ce_scale = 0.37f;

typedef struct ce_in {
    int dt, vocab;
    float *h, *w, *dw0;
    int32_t targets[CM];
} ce_in;

static const char *ce_name(int v)
{
    static char buf[3 * CE_VOCABS][32];
    snprintf(buf[v], sizeof buf[v], "%s vocab %d", llmt_dtype_name(dtypes[v % 3]),
             ce_vocabs[v / 3]);
    return buf[v];
}

static int ce_dt(int v)
{
    return dtypes[v % 3];
}

static void *ce_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    ce_in *in = calloc(1, sizeof *in);
    in->dt = ce_dt(v);
    in->vocab = ce_vocabs[v / 3];
    const int V = in->vocab;
    in->h = randn(&s, CM * CD, 1.0, in->dt);
    in->w = randn(&s, V * CD, 0.3, in->dt);
    in->dw0 = randn(&s, V * CD, 1.0, in->dt);
    for (int i = 0; i < CM; i++)
        in->targets[i] = (int32_t)(trand_u64(&s) % V);
    in->targets[0] = in->targets[9] = in->targets[10] = in->targets[CM - 1] = -1;
    return in;
}

static void ce_free(void *p)
{
    ce_in *in = p;
    free(in->h);
    free(in->w);
    free(in->dw0);
    free(in);
}

/* The backend's preferred chunk, and on CUDA the scratch of these dims
 * (the LM head's need is the largest: 32 MiB of GEMM workspace, then each
 * region rounded up to 256 bytes, then 256 bytes of alignment slack; fp32
 * logits rows padded to a multiple of 4 floats). */
static void check_ce_sizes(backend *b, llmt_op_dims dims)
{
    const int odd = dims.vocab == 1103; /* else 1100 */
    if (b == &g_cpu) { /* 256 rows at most, whatever the vocabulary */
        assert_int_equal(b->ops->ce_chunk(CM, dims.vocab), CM);
        assert_int_equal(b->ops->ce_chunk(2048, 32000), 256);
        return;
    }
    /* All rows while their fp32 logits take at most 2^31 bytes: the ~1B
     * step (8 x 2048 rows of 32000) is one chunk, 16384 x 128000 bytes;
     * beyond, 2^31 / 128000 = 16777 rows, in whole 256s: 16640. Vocab
     * 699050 rows are padded to 699052 floats: 2^31 / 2796208 = 767.998
     * rows, 512 (unpadded 768.0007 would give 768). */
    assert_int_equal(b->ops->ce_chunk(CM, dims.vocab), CM);
    assert_int_equal(b->ops->ce_chunk(16384, 32000), 16384);
    assert_int_equal(b->ops->ce_chunk(16641, 32000), 16640);
    assert_int_equal(b->ops->ce_chunk(1 << 20, 32000), 16640);
    assert_int_equal(b->ops->ce_chunk(1 << 20, 699050), 512);
    const size_t ws = (size_t)32 << 20, slack = 256;
    /* One chunk of 23 rows: logits 23 x 1100 x 4 = 101200 -> 101376 (1103:
     * 23 x 1104 x 4 = 101568 -> 101632), row losses 184 -> 256, totals
     * 16 -> 256; no [vocab, d] fp32 head gradient. */
    dims.ce_chunk = CM;
    assert_int_equal(b->ops->scratch_bytes(&dims),
                     ws + (odd ? 101632 : 101376) + 256 + 256 + slack);
    /* Chunks of 8: logits 8 x 1100 x 4 = 35200 -> 35328 (1103: 8 x 1104
     * x 4 = 35328), row losses 64 -> 256, totals 256, and for a 16-bit
     * dtype the fp32 head gradient (unpadded), 1100 x 40 x 4 = 176000 ->
     * 176128 (1103: 176480 -> 176640). */
    dims.ce_chunk = CCHUNK;
    assert_int_equal(b->ops->scratch_bytes(&dims),
                     ws + 35328 + 256 + 256 +
                         (dims.dt == LLMT_DTYPE_F32 ? 0 : odd ? 176640 : 176128) + slack);
    /* GPT-2's vocabulary, 1000 rows in one chunk: logits 1000 x 50260 x 4
     * = 201040000 -> 201040128 (unpadded 201028000 -> 201028096), row
     * losses 8000 -> 8192, totals 256. */
    dims.seq = 1000, dims.vocab = 50257, dims.ce_chunk = 1000;
    assert_int_equal(b->ops->scratch_bytes(&dims), ws + 201040128 + 8192 + 256 + slack);
}

/* With gradient over all CM rows as one chunk: loss sum, dh and dw. */
static void ce_run_one_chunk(backend *b, const ce_in *in, llmt_op_dims dims, void *h, void *w,
                             void *tg, result *out)
{
    const int dt = in->dt, V = in->vocab;
    dims.ce_chunk = CM;
    void *scratch = scratch_alloc(b, dims, 0);
    void *dh = dalloc(b, CM * CD * llmt_dtype_size(dt)), *dw = dput(b, in->dw0, V * CD, dt);
    double loss = -1.0;
    int64_t count = -1;
    llmt_ce_args a = {
        .h = h, .w = w, .targets = tg, .m = CM, .d = CD, .vocab = V, .chunk = CM, .dt = dt,
        .want_grad = 1, .grad_scale = ce_scale, .dh = dh, .dw = dw, .scratch = scratch,
        .loss_sum = &loss, .count = &count,
    };
    OK(b->ops->lm_head_ce(b->dev, &a));
    assert_int_equal(count, CM - 4);
    add_scalar(out, "loss sum (1 chunk)", loss);
    add_dev(out, b, "dh (1 chunk)", dh, CM * CD, dt);
    add_dev(out, b, "dw (1 chunk)", dw, V * CD, dt);
    dfree(b, dh);
    dfree(b, dw);
    dfree(b, scratch);
}

static void ce_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const ce_in *in = p;
    const int dt = in->dt, V = in->vocab;
    const size_t e = llmt_dtype_size(dt);
    llmt_op_dims dims = {0};
    dims.batch = 1, dims.seq = CM, dims.hidden = CD, dims.vocab = V, dims.ce_chunk = CCHUNK;
    dims.dt = dt;
    check_ce_sizes(b, dims);
    void *scratch = scratch_alloc(b, dims, 0);
    void *h = dput(b, in->h, CM * CD, dt), *w = dput(b, in->w, V * CD, dt);
    void *tg = dput_raw(b, in->targets, sizeof in->targets);
    float *logits = malloc(CM * V * sizeof *logits);
    for (int variant = 0; variant < 3; variant++) {
        /* 0: gradient and logits; 1: loss only; 2: logits only */
        void *dh = dalloc(b, CM * CD * e), *dw = dput(b, in->dw0, V * CD, dt);
        double loss = -1.0;
        int64_t count = -1;
        memset(logits, 0xFF, CM * V * sizeof *logits);
        llmt_ce_args a = {
            .h = h, .w = w, .targets = variant == 2 ? NULL : tg, .m = CM, .d = CD, .vocab = V,
            .chunk = CCHUNK, .dt = dt, .want_grad = variant == 0, .grad_scale = ce_scale,
            .dh = dh, .dw = dw, .scratch = scratch, .loss_sum = &loss, .count = &count,
            .logits_out = variant == 1 ? NULL : logits,
        };
        OK(b->ops->lm_head_ce(b->dev, &a));
        char name[40];
        if (variant != 2) {
            snprintf(name, sizeof name, "loss sum (%s)", variant ? "no grad" : "grad");
            add_scalar(out, name, loss);
            snprintf(name, sizeof name, "count (%s)", variant ? "no grad" : "grad");
            add_scalar(out, name, (double)count);
        }
        if (variant == 0) {
            add_dev(out, b, "dh", dh, CM * CD, dt);
            add_dev(out, b, "dw", dw, V * CD, dt);
        }
        if (variant != 1) {
            snprintf(name, sizeof name, "logits (%s)", variant ? "logits only" : "grad");
            add_f(out, name, logits, CM * V);
        }
        dfree(b, dh);
        dfree(b, dw);
    }
    ce_run_one_chunk(b, in, dims, h, w, tg, out);
    free(logits);
    dfree(b, h);
    dfree(b, w);
    dfree(b, tg);
    dfree(b, scratch);
}

static void ce_ref(int v, const void *p, result *out)
{
    (void)v;
    const ce_in *in = p;
    const int V = in->vocab;
    double *logits = dzeros(CM * V), *g = dzeros(CM * V);
    double *dh = dzeros(CM * CD), *dw = dzeros(V * CD);
    double loss = 0;
    int64_t count = 0;
    for (int r = 0; r < CM; r++) {
        double mx = -INFINITY, sum = 0;
        for (int k = 0; k < V; k++) {
            double s = 0;
            for (int c = 0; c < CD; c++)
                s += (double)in->h[r * CD + c] * in->w[k * CD + c];
            logits[r * V + k] = s;
            mx = fmax(mx, s);
        }
        for (int k = 0; k < V; k++)
            sum += exp(logits[r * V + k] - mx);
        int t = in->targets[r];
        if (t < 0)
            continue;
        loss += mx + log(sum) - logits[r * V + t];
        count++;
        for (int k = 0; k < V; k++)
            g[r * V + k] = ce_scale * (exp(logits[r * V + k] - mx) / sum - (k == t));
    }
    for (int i = 0; i < V * CD; i++)
        dw[i] = in->dw0[i];
    for (int r = 0; r < CM; r++)
        for (int k = 0; k < V; k++)
            for (int c = 0; c < CD; c++) {
                dh[r * CD + c] += g[r * V + k] * in->w[k * CD + c];
                dw[k * CD + c] += g[r * V + k] * in->h[r * CD + c];
            }
    add_scalar(out, "loss sum (grad)", loss);
    add_scalar(out, "count (grad)", (double)count);
    add_d(out, "dh", dh, CM * CD);
    add_d(out, "dw", dw, V * CD);
    add_d(out, "logits (grad)", logits, CM * V);
    add_scalar(out, "loss sum (no grad)", loss);
    add_scalar(out, "count (no grad)", (double)count);
    add_d(out, "logits (logits only)", logits, CM * V);
    add_scalar(out, "loss sum (1 chunk)", loss);
    add_d(out, "dh (1 chunk)", dh, CM * CD);
    add_d(out, "dw (1 chunk)", dw, V * CD);
    free(logits);
    free(g);
    free(dh);
    free(dw);
}

const op_test ce_test = {"lm_head_ce", 3 * CE_VOCABS, ce_name, ce_dt, ce_make, ce_run, ce_ref,
                         ce_free, 1.0};

/* Many rows in one chunk (600: the CUDA total kernel's tiles of 256 rows,
 * the last partial), fp32, losses only, every seventh target ignored: the
 * count exactly and the loss sum against a double-precision reference (a
 * tile lost or counted twice moves it by a third or more). */
void check_ce_many_rows(backend *b)
{
    enum { M = 600, D = 8, V = 64 };
    uint64_t s = 77;
    float *h = randn(&s, M * D, 1.0, LLMT_DTYPE_F32), *w = randn(&s, V * D, 0.5, LLMT_DTYPE_F32);
    int32_t targets[M];
    double want = 0.0;
    int64_t want_count = 0;
    for (int i = 0; i < M; i++) {
        targets[i] = i % 7 == 3 ? -1 : (int32_t)(trand_u64(&s) % V);
        if (targets[i] < 0)
            continue;
        double logit[V], mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) {
            logit[v] = 0.0;
            for (int k = 0; k < D; k++)
                logit[v] += (double)h[i * D + k] * w[v * D + k];
            mx = logit[v] > mx ? logit[v] : mx;
        }
        for (int v = 0; v < V; v++)
            sum += exp(logit[v] - mx);
        want += mx + log(sum) - logit[targets[i]];
        want_count++;
    }
    llmt_op_dims dims = {0};
    dims.batch = 1, dims.seq = M, dims.hidden = D, dims.vocab = V, dims.ce_chunk = M;
    dims.heads = 1, dims.kv_heads = 1, dims.head_dim = D, dims.ffn = D;
    dims.dt = LLMT_DTYPE_F32, dims.num_threads = 2;
    void *scratch = scratch_alloc(b, dims, 0);
    void *dh_ = dput(b, h, M * D, LLMT_DTYPE_F32), *dw_ = dput(b, w, V * D, LLMT_DTYPE_F32);
    void *tg = dput_raw(b, targets, sizeof targets);
    double loss = -1.0;
    int64_t count = -1;
    llmt_ce_args a = {
        .h = dh_, .w = dw_, .targets = tg, .m = M, .d = D, .vocab = V, .chunk = M,
        .dt = LLMT_DTYPE_F32, .scratch = scratch, .loss_sum = &loss, .count = &count,
    };
    OK(b->ops->lm_head_ce(b->dev, &a));
    assert_int_equal(count, want_count);
    if (fabs(loss - want) > 1e-5 * fabs(want))
        fail_msg("%s: loss sum %.9g, reference %.9g", b->name, loss, want);
    dfree(b, tg);
    dfree(b, dh_);
    dfree(b, dw_);
    dfree(b, scratch);
    free(h);
    free(w);
}
