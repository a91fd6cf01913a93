/* The generator's forward pass over new positions: the training forward's
 * ops in the same order (lib/model/forward.c), except that the key and value
 * projections are written straight into the cache at their positions and
 * attention reads the whole cache (attention_kv_fwd). */
#include "core/error.h"
#include "model/generate_internal.h"

/* Advances *at past a buffer of bytes, rounded up to 64-byte alignment. */
static size_t take(size_t *at, size_t bytes)
{
    size_t off = *at;
    *at += (bytes + 63) & ~(size_t)63;
    return off;
}

void llmt_gen_layout_compute(const llmt_model *m, int64_t max_context, llmt_gen_layout *out)
{
    const llmt_dims *d = &m->dims;
    const int64_t rows = max_context < LLMT_GEN_CHUNK ? max_context : LLMT_GEN_CHUNK;
    const size_t es = llmt_dtype_size(m->dt), r = (size_t)rows;
    size_t at = 0;
    out->rows = rows;
    out->ids = take(&at, r * sizeof(int32_t));
    out->x = take(&at, r * (size_t)d->d * es);
    out->h = take(&at, r * (size_t)d->d * es);
    out->xmid = take(&at, r * (size_t)d->d * es);
    out->q = take(&at, r * (size_t)d->att_dim * es);
    out->att = take(&at, r * (size_t)d->att_dim * es);
    out->gu = take(&at, r * (size_t)(2 * d->ffn) * es);
    out->s = take(&at, r * (size_t)d->ffn * es);
    out->rstd = take(&at, r * sizeof(float));
    /* One scratch serves the ops, which run one at a time: the products of
     * a chunk of `rows` (the ops of a model with seq = rows), the LM head
     * (one row, chunk 1) and cached attention, which grows with the cache.
     * The head's chunk in the dims is the backend's for `rows` rows, as the
     * model's layout sizes it (layout.c): `rows` on both backends, so the
     * size covers the one-row call and carries no multi-chunk buffer (a
     * ce_chunk of 1 below batch x seq = rows made the CUDA size reserve an
     * fp32 [vocab, d] head gradient for 16-bit dtypes, which a call
     * without gradient never touches). */
    llmt_op_dims od = {1, rows, d->d, d->heads, d->kv_heads, d->head_dim, d->ffn, d->vocab,
                       m->ops->ce_chunk(rows, d->vocab), m->dt, m->dev->num_threads};
    llmt_attn_dims ad = {1, max_context, d->heads, d->kv_heads, d->head_dim};
    size_t ops = m->ops->scratch_bytes(&od),
           kv = m->ops->attention_kv_scratch_bytes(&ad, m->dev->num_threads);
    out->scratch = take(&at, ops > kv ? ops : kv);
    out->total = at;
}

static void *wk(const llmt_generator *g, size_t off)
{
    return (char *)g->work.ptr + off;
}

static void *w_at(const llmt_model *m, int64_t off)
{
    return llmt_model_at(m, &m->weights, off);
}

/* Layer l over n new rows in x: x becomes the layer's output. */
static int layer_forward(llmt_generator *g, int64_t l, int64_t n)
{
    const llmt_model *m = g->model;
    const llmt_dims *d = &m->dims;
    const llmt_layer_offsets *o = &m->layer[l];
    const llmt_backend_ops *ops = m->ops;
    const int dt = m->dt;
    const float eps = m->cfg.rms_norm_eps;
    void *x = wk(g, g->lay.x), *h = wk(g, g->lay.h), *xmid = wk(g, g->lay.xmid);
    void *q = wk(g, g->lay.q), *att = wk(g, g->lay.att), *scratch = wk(g, g->lay.scratch);
    float *rstd = wk(g, g->lay.rstd);
    void *cache = llmt_model_at(m, &g->kv, l * g->cfg.max_context * g->kv_row);
    void *kv_new = llmt_model_at(m, &g->kv, (l * g->cfg.max_context + g->pos) * g->kv_row);
    const float *cos_sin = (const float *)m->rope.ptr + g->pos * d->head_dim;

    LLMT_TRY(ops->rmsnorm_fwd(m->dev, h, rstd, x, w_at(m, o->ln1), n, d->d, eps, dt));
    /* The fused [q | k | v] weight: its q rows into q, its k and v rows into the cache. */
    LLMT_TRY(ops->gemm(m->dev, 0, 1, n, d->att_dim, d->d, 1.0f, h, d->d, w_at(m, o->wqkv), d->d,
                       0.0f, q, d->att_dim, dt, scratch));
    LLMT_TRY(ops->gemm(m->dev, 0, 1, n, g->kv_row, d->d, 1.0f, h, d->d,
                       w_at(m, o->wqkv + d->att_dim * d->d), d->d, 0.0f, kv_new, g->kv_row, dt,
                       scratch));
    /* Row r is at position pos + r: the table from pos on, with seq = n. */
    LLMT_TRY(ops->rope(m->dev, q, cos_sin, n, n, d->heads, d->head_dim, d->att_dim, 0, dt));
    LLMT_TRY(ops->rope(m->dev, kv_new, cos_sin, n, n, d->kv_heads, d->head_dim, g->kv_row, 0, dt));
    llmt_attn_dims ad = {1, g->pos + n, d->heads, d->kv_heads, d->head_dim};
    LLMT_TRY(ops->attention_kv_fwd(m->dev, att, q, cache, n, &ad, dt, scratch));
    /* xmid = x + att Wo^T: the residual add in the product's epilogue */
    LLMT_TRY(ops->gemm_cd(m->dev, 0, 1, n, d->d, d->att_dim, 1.0f, att, d->att_dim,
                          w_at(m, o->wo), d->att_dim, 1.0f, x, d->d, xmid, d->d, dt, scratch));
    void *gu = wk(g, g->lay.gu), *s = wk(g, g->lay.s);
    LLMT_TRY(ops->rmsnorm_fwd(m->dev, h, rstd, xmid, w_at(m, o->ln2), n, d->d, eps, dt));
    LLMT_TRY(ops->gemm(m->dev, 0, 1, n, 2 * d->ffn, d->d, 1.0f, h, d->d, w_at(m, o->wgu), d->d,
                       0.0f, gu, 2 * d->ffn, dt, scratch));
    LLMT_TRY(ops->swiglu_fwd(m->dev, s, gu, n, d->ffn, dt));
    /* x = xmid + s Wdown^T */
    return ops->gemm_cd(m->dev, 0, 1, n, d->d, d->ffn, 1.0f, s, d->ffn, w_at(m, o->wdown), d->ffn,
                        1.0f, xmid, d->d, x, d->d, dt, scratch);
}

int llmt_gen_forward_chunk(llmt_generator *g, const int32_t *tokens, int64_t n, float *logits)
{
    const llmt_model *m = g->model;
    const llmt_dims *d = &m->dims;
    int32_t *ids = wk(g, g->lay.ids);
    LLMT_TRY(m->ops->copy_to_device(m->dev, ids, tokens, (size_t)n * sizeof(int32_t)));
    LLMT_TRY(m->ops->embedding_fwd(m->dev, wk(g, g->lay.x), w_at(m, m->embed), ids, n, d->d,
                                   m->dt));
    for (int64_t l = 0; l < d->layers; l++)
        LLMT_TRY(layer_forward(g, l, n));
    if (!logits)
        return LLMT_OK;
    /* Final norm and LM head of the last row only. */
    void *h = wk(g, g->lay.h);
    const void *last = (char *)wk(g, g->lay.x) + (size_t)((n - 1) * d->d) * llmt_dtype_size(m->dt);
    LLMT_TRY(m->ops->rmsnorm_fwd(m->dev, h, wk(g, g->lay.rstd), last, w_at(m, m->norm), 1, d->d,
                                 m->cfg.rms_norm_eps, m->dt));
    llmt_ce_args ce = {.h = h, .w = w_at(m, m->lm_head), .m = 1, .d = d->d, .vocab = d->vocab,
                       .chunk = 1, .dt = m->dt, .scratch = wk(g, g->lay.scratch),
                       .logits_out = logits};
    return m->ops->lm_head_ce(m->dev, &ce);
}
