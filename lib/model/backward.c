/* The backward pass. The LM head's gradient was computed during the forward
 * (fused cross-entropy), leaving dL/d(final norm output) in g_h; from there
 * the final norm, each layer in reverse (recomputing what its flags dropped),
 * and the embedding. Weight gradients are accumulated (beta = 1), so several
 * micro-batches add up. Each part's gradients are written through its bucket
 * (llmt_grads_acquire), in device memory also where they are offloaded. */
#include "core/error.h"
#include "model/grad_place.h"
#include "model/model_internal.h"

/* Tells m->bucket_final, if any, that bucket b's gradients are final. */
static int bucket_final(llmt_model *m, int32_t b)
{
    return m->bucket_final ? m->bucket_final(m->bucket_final_user, b) : LLMT_OK;
}

/* Recomputes what layer l's flags dropped, from its kept inputs. */
static int recompute(llmt_model *m, int64_t l)
{
    uint8_t flags = m->rc_flags[l];
    if (flags & LLMT_RECOMPUTE_FULL)
        return llmt_layer_forward(m, l, FWD_LAYER, 0);
    if (flags & LLMT_RECOMPUTE_FFN)
        return llmt_layer_forward(m, l, FWD_FFN, 0);
    if (flags & LLMT_RECOMPUTE_FFN_ACT)
        return llmt_layer_forward(m, l, FWD_SWIGLU, 0);
    return LLMT_OK; /* ATTN_CORE alone: attention_bwd recomputes the probabilities */
}

/* Layer l's backward: on entry g_res holds dL/d(layer output), on return
 * dL/d(layer input). */
static int layer_backward(llmt_model *m, int64_t l)
{
    const llmt_dims *d = &m->dims;
    const llmt_layer_offsets *o = &m->layer[l];
    const llmt_backend_ops *ops = m->ops;
    const int dt = m->dt;
    const int64_t M = m->run_batch * m->run_seq;
    char *work = m->work.ptr;
    void *scratch = work + m->layout.scratch;
    void *g_res = work + m->layout.g_res, *g_h = work + m->layout.g_h;
    void *g_wide = work + m->layout.g_wide, *g_mid = work + m->layout.g_mid;
    const size_t es = llmt_dtype_size(dt);
    char *g_layer = NULL; /* the layer's bucket: its first element is ln1's */
#define W(off) llmt_model_at(m, &m->weights, (off))
#define G(off) (g_layer + (size_t)((off) - o->ln1) * es)

    LLMT_TRY(recompute(m, l));
    LLMT_TRY(llmt_grads_acquire(m, (int32_t)(1 + l), &g_layer));

    /* FFN: out = xmid + s Wdown^T, s = swiglu(gu), gu = h2 Wgu^T, h2 = norm(xmid) */
    void *s = llmt_act_ptr(m, l, ACT_S), *gu = llmt_act_ptr(m, l, ACT_GU);
    void *h2 = llmt_act_ptr(m, l, ACT_H2), *xmid = llmt_act_ptr(m, l, ACT_XMID);
    LLMT_TRY(ops->gemm(m->dev, 0, 0, M, d->ffn, d->d, 1.0f, g_res, d->d, W(o->wdown), d->ffn, 0.0f,
                  g_mid, d->ffn, dt, scratch));
    LLMT_TRY(ops->gemm(m->dev, 1, 0, d->d, d->ffn, M, 1.0f, g_res, d->d, s, d->ffn, 1.0f,
                  G(o->wdown), d->ffn, dt, scratch));
    LLMT_TRY(ops->swiglu_bwd(m->dev, g_wide, g_mid, gu, M, d->ffn, dt));
    LLMT_TRY(ops->gemm(m->dev, 0, 0, M, d->d, 2 * d->ffn, 1.0f, g_wide, 2 * d->ffn, W(o->wgu), d->d,
                  0.0f, g_h, d->d, dt, scratch));
    LLMT_TRY(ops->gemm(m->dev, 1, 0, 2 * d->ffn, d->d, M, 1.0f, g_wide, 2 * d->ffn, h2, d->d, 1.0f,
                  G(o->wgu), d->d, dt, scratch));
    LLMT_TRY(ops->rmsnorm_bwd(m->dev, g_res, G(o->ln2), g_h, xmid, W(o->ln2),
                         llmt_act_ptr(m, l, ACT_RSTD2), M, d->d, 1, dt, scratch));

    /* Attention: xmid = x + att Wo^T, att = attention(rope(h1 Wqkv^T)), h1 = norm(x) */
    void *att = llmt_act_ptr(m, l, ACT_ATT), *qkv = llmt_act_ptr(m, l, ACT_QKV);
    void *h1 = llmt_act_ptr(m, l, ACT_H1), *x = llmt_act_ptr(m, l, ACT_X);
    LLMT_TRY(ops->gemm(m->dev, 0, 0, M, d->att_dim, d->d, 1.0f, g_res, d->d, W(o->wo), d->att_dim,
                  0.0f, g_mid, d->att_dim, dt, scratch));
    LLMT_TRY(ops->gemm(m->dev, 1, 0, d->d, d->att_dim, M, 1.0f, g_res, d->d, att, d->att_dim, 1.0f,
                  G(o->wo), d->att_dim, dt, scratch));
    llmt_attn_dims ad = {m->run_batch, m->run_seq, d->heads, d->kv_heads, d->head_dim};
    LLMT_TRY(ops->attention_bwd(m->dev, g_wide, g_mid, qkv, llmt_act_ptr(m, l, ACT_ATTN), att, &ad,
                           dt, scratch));
    LLMT_TRY(ops->rope(m->dev, g_wide, m->rope.ptr, M, m->run_seq, d->heads + d->kv_heads,
                  d->head_dim, d->qkv_dim, 1, dt));
    LLMT_TRY(ops->gemm(m->dev, 0, 0, M, d->d, d->qkv_dim, 1.0f, g_wide, d->qkv_dim, W(o->wqkv), d->d,
                  0.0f, g_h, d->d, dt, scratch));
    LLMT_TRY(ops->gemm(m->dev, 1, 0, d->qkv_dim, d->d, M, 1.0f, g_wide, d->qkv_dim, h1, d->d, 1.0f,
                  G(o->wqkv), d->d, dt, scratch));
    LLMT_TRY(ops->rmsnorm_bwd(m->dev, g_res, G(o->ln1), g_h, x, W(o->ln1),
                         llmt_act_ptr(m, l, ACT_RSTD1), M, d->d, 1, dt, scratch));
#undef W
#undef G
    return LLMT_OK;
}

int llmt_model_backward(llmt_model *m)
{
    const int64_t M = m->run_batch * m->run_seq;
    char *work = m->work.ptr;
    void *g_norm = NULL, *g_embed = NULL;
    /* Final norm: g_res = norm_bwd(g_h) */
    LLMT_TRY(llmt_grads_at(m, llmt_grad_bucket_count(m) - 1, m->norm, &g_norm));
    LLMT_TRY(m->ops->rmsnorm_bwd(m->dev, work + m->layout.g_res, g_norm, work + m->layout.g_h,
                            llmt_act_ptr(m, m->dims.layers, ACT_X),
                            llmt_model_at(m, &m->weights, m->norm),
                            (const float *)(work + m->layout.rstdf), M, m->dims.d, 0, m->dt,
                            work + m->layout.scratch));
    /* The tail (final norm, an untied head written during the forward) is final. */
    LLMT_TRY(bucket_final(m, llmt_grad_bucket_count(m) - 1));
    for (int64_t l = m->dims.layers - 1; l >= 0; l--) {
        LLMT_TRY(layer_backward(m, l));
        LLMT_TRY(bucket_final(m, (int32_t)(1 + l)));
    }
    const int32_t *ids = (const int32_t *)((char *)m->acts.ptr + m->layout.tokens);
    LLMT_TRY(llmt_grads_at(m, 0, m->embed, &g_embed));
    LLMT_TRY(m->ops->embedding_bwd(m->dev, g_embed, work + m->layout.g_res, ids, M, m->dims.d,
                                   m->dt));
    return bucket_final(m, 0);
}
