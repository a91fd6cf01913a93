/* The forward pass: embedding, layers, final norm, fused LM head and loss.
 * Activations go where the layout puts them: kept ones into the activation
 * arena, dropped ones into one-layer recompute slots of the workspace. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/grad_place.h"
#include "model/model_internal.h"

void *llmt_act_ptr(const llmt_model *m, int64_t l, int which)
{
    const llmt_layout *lay = &m->layout;
    if (l == m->dims.layers) /* the residual stream after the last layer */
        return (char *)m->acts.ptr + lay->x_final;
    size_t off = lay->off[l * ACT_COUNT + which];
    if (off != LLMT_NO_OFFSET)
        return (char *)m->acts.ptr + off;
    if (lay->slot[which] == LLMT_NO_OFFSET)
        return NULL; /* attention state that attention recomputes */
    return (char *)m->work.ptr + lay->slot[which];
}

/* Weight and gradient addresses of layer l. */
static void *w_at(const llmt_model *m, int64_t off)
{
    return llmt_model_at(m, &m->weights, off);
}

int llmt_layer_forward(llmt_model *m, int64_t l, int from, int want_next)
{
    const llmt_dims *d = &m->dims;
    const llmt_layer_offsets *o = &m->layer[l];
    const llmt_backend_ops *ops = m->ops;
    const int dt = m->dt;
    const int64_t M = m->run_batch * m->run_seq;
    void *scratch = (char *)m->work.ptr + m->layout.scratch;
    void *x = llmt_act_ptr(m, l, ACT_X), *xmid = llmt_act_ptr(m, l, ACT_XMID);
    void *gu = llmt_act_ptr(m, l, ACT_GU), *s = llmt_act_ptr(m, l, ACT_S);

    if (from == FWD_LAYER) {
        void *h1 = llmt_act_ptr(m, l, ACT_H1), *qkv = llmt_act_ptr(m, l, ACT_QKV);
        void *att = llmt_act_ptr(m, l, ACT_ATT);
        LLMT_TRY(ops->rmsnorm_fwd(m->dev, h1, llmt_act_ptr(m, l, ACT_RSTD1), x, w_at(m, o->ln1), M,
                             d->d, m->cfg.rms_norm_eps, dt));
        LLMT_TRY(ops->gemm(m->dev, 0, 1, M, d->qkv_dim, d->d, 1.0f, h1, d->d, w_at(m, o->wqkv), d->d,
                      0.0f, qkv, d->qkv_dim, dt, scratch));
        LLMT_TRY(ops->rope(m->dev, qkv, m->rope.ptr, M, m->run_seq, d->heads + d->kv_heads,
                      d->head_dim, d->qkv_dim, 0, dt));
        llmt_attn_dims ad = {m->run_batch, m->run_seq, d->heads, d->kv_heads, d->head_dim};
        LLMT_TRY(ops->attention_fwd(m->dev, att, llmt_act_ptr(m, l, ACT_ATTN), qkv, &ad, dt, scratch));
        /* xmid = x + att Wo^T: the residual add in the product's epilogue */
        LLMT_TRY(ops->gemm_cd(m->dev, 0, 1, M, d->d, d->att_dim, 1.0f, att, d->att_dim,
                              w_at(m, o->wo), d->att_dim, 1.0f, x, d->d, xmid, d->d, dt, scratch));
    }
    if (from <= FWD_FFN) {
        void *h2 = llmt_act_ptr(m, l, ACT_H2);
        LLMT_TRY(ops->rmsnorm_fwd(m->dev, h2, llmt_act_ptr(m, l, ACT_RSTD2), xmid, w_at(m, o->ln2), M,
                             d->d, m->cfg.rms_norm_eps, dt));
        LLMT_TRY(ops->gemm(m->dev, 0, 1, M, 2 * d->ffn, d->d, 1.0f, h2, d->d, w_at(m, o->wgu), d->d,
                      0.0f, gu, 2 * d->ffn, dt, scratch));
    }
    LLMT_TRY(ops->swiglu_fwd(m->dev, s, gu, M, d->ffn, dt));
    if (want_next) { /* x_next = xmid + s Wdown^T */
        void *x_next = llmt_act_ptr(m, l + 1, ACT_X);
        LLMT_TRY(ops->gemm_cd(m->dev, 0, 1, M, d->d, d->ffn, 1.0f, s, d->ffn, w_at(m, o->wdown),
                              d->ffn, 1.0f, xmid, d->d, x_next, d->d, dt, scratch));
    }
    return LLMT_OK;
}

/* Whether the arena, laid out for the current flags, holds batch x seq.
 * Every buffer is indexed by the call's own dimensions from a base offset,
 * so a smaller call fits inside a larger layout. */
static int arena_fits(const llmt_model *m, int64_t batch, int64_t seq)
{
    return m->have_arena && m->layout.batch >= batch && m->layout.seq >= seq &&
           memcmp(m->arena_flags, m->rc_flags, (size_t)m->dims.layers) == 0;
}

void llmt_model_release_arena(llmt_model *m)
{
    llmt_buf_free(m->ctx, &m->acts);
    llmt_buf_free(m->ctx, &m->work);
    llmt_layout_free(&m->layout);
    m->have_arena = 0;
}

int llmt_model_prepare(llmt_model *m, int64_t batch, int64_t seq)
{
    return arena_fits(m, batch, seq) ? LLMT_OK : llmt_model_allocate_arena(m, batch, seq);
}

int llmt_model_allocate_arena(llmt_model *m, int64_t batch, int64_t seq)
{
    llmt_model_release_arena(m); /* before allocating: the peak never holds both */
    LLMT_TRY(llmt_layout_compute(&m->cfg, m->rc_flags, batch, seq, m->dev->num_threads, m->ops, 1,
                            &m->layout));
    int rc = llmt_buf_alloc(m->ctx, &m->acts, LLMT_MEM_ACTIVATIONS, m->layout.act_bytes,
                            "activation arena");
    if (!rc)
        rc = llmt_buf_alloc(m->ctx, &m->work, LLMT_MEM_WORKSPACE, m->layout.work_bytes,
                            "model workspace");
    if (rc) {
        llmt_model_release_arena(m);
        return rc;
    }
    memcpy(m->arena_flags, m->rc_flags, (size_t)m->dims.layers);
    m->have_arena = 1;
    return LLMT_OK;
}

/* Embedding and every layer, leaving the final residual stream in the arena. */
static int forward_layers(llmt_model *m, const int32_t *tokens)
{
    const int64_t M = m->run_batch * m->run_seq;
    int32_t *ids = (int32_t *)((char *)m->acts.ptr + m->layout.tokens);
    LLMT_TRY(m->ops->copy_to_device(m->dev, ids, tokens, (size_t)M * sizeof(int32_t)));
    LLMT_TRY(m->ops->embedding_fwd(m->dev, llmt_act_ptr(m, 0, ACT_X), w_at(m, m->embed), ids, M,
                              m->dims.d, m->dt));
    for (int64_t l = 0; l < m->dims.layers; l++)
        LLMT_TRY(llmt_layer_forward(m, l, FWD_LAYER, 1));
    return LLMT_OK;
}

int llmt_model_forward_hidden(llmt_model *m, const int32_t *tokens, int64_t batch, int64_t seq)
{
    LLMT_TRY(llmt_model_prepare(m, batch, seq));
    m->run_batch = batch;
    m->run_seq = seq;
    LLMT_TRY(forward_layers(m, tokens));
    const int64_t M = batch * seq;
    return m->ops->rmsnorm_fwd(m->dev, (char *)m->work.ptr + m->layout.hf,
                               (float *)((char *)m->work.ptr + m->layout.rstdf),
                               llmt_act_ptr(m, m->dims.layers, ACT_X), w_at(m, m->norm), M,
                               m->dims.d, m->cfg.rms_norm_eps, m->dt);
}

/* The fused LM head over the final norm output already in the workspace. */
static int run_head(llmt_model *m, const int32_t *targets_dev, int want_grad,
                    float row_grad_scale, double *loss_sum, int64_t *count, float *logits_out)
{
    const int64_t M = m->run_batch * m->run_seq;
    /* The LM head's gradient: the embedding's bucket when tied, the tail's
     * (final norm and LM head) when not. */
    void *dw = NULL;
    if (want_grad)
        LLMT_TRY(llmt_grads_at(m, m->lm_head == m->embed ? 0 : llmt_grad_bucket_count(m) - 1,
                               m->lm_head, &dw));
    llmt_ce_args ce = {
        .h = (char *)m->work.ptr + m->layout.hf,
        .w = w_at(m, m->lm_head),
        .targets = targets_dev,
        .m = M,
        .d = m->dims.d,
        .vocab = m->dims.vocab,
        .chunk = m->ops->ce_chunk(M, m->dims.vocab), /* as the layout sized scratch */
        .dt = m->dt,
        .want_grad = want_grad,
        .grad_scale = row_grad_scale,
        .dh = (char *)m->work.ptr + m->layout.g_h,
        .dw = dw,
        .scratch = (char *)m->work.ptr + m->layout.scratch,
        .loss_sum = loss_sum,
        .count = count,
        .logits_out = logits_out,
    };
    return m->ops->lm_head_ce(m->dev, &ce);
}

int llmt_model_run(llmt_model *m, const int32_t *tokens, const int32_t *targets, int64_t batch,
                   int64_t seq, int want_grad, float row_grad_scale, double *loss_sum,
                   int64_t *count)
{
    int rc = llmt_model_forward_hidden(m, tokens, batch, seq);
    int32_t *tgt = rc ? NULL : (int32_t *)((char *)m->acts.ptr + m->layout.targets);
    if (!rc)
        rc = m->ops->copy_to_device(m->dev, tgt, targets, (size_t)(batch * seq) * sizeof(int32_t));
    if (!rc)
        rc = run_head(m, tgt, want_grad, row_grad_scale, loss_sum, count, NULL);
    if (!rc && want_grad)
        rc = llmt_model_backward(m);
    /* No bucket stays held between calls, even after a failure (the
     * gradients then are what the failed pass left), but in an overlapped
     * pass: its bucket_final caller sends the bucket a failure left loaded
     * from its slot (storing it would make host room the step does not
     * keep, grad_place.h's llmt_grads_home_on_demand). */
    int flushed = m->bucket_final ? LLMT_OK : llmt_grads_flush(m);
    return rc ? rc : flushed;
}

int llmt_model_run_logits(llmt_model *m, const int32_t *tokens, int64_t batch, int64_t seq,
                          float *out)
{
    LLMT_TRY(llmt_model_forward_hidden(m, tokens, batch, seq));
    return run_head(m, NULL, 0, 0.0f, NULL, NULL, out);
}
