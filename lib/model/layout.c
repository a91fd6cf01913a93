/* The activation arena's layout: which activations a layer keeps under its
 * recompute flags, and the byte offset of each. The model allocates what this
 * computes and the planner reports it, so a plan is exact by construction. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model_internal.h"

#define ARENA_ALIGN 64

int llmt_act_kept(uint8_t flags, int which)
{
    switch (which) {
    case ACT_X: return 1; /* the layer input is always kept */
    case ACT_ATTN: return !(flags & (LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FULL));
    case ACT_S: return !(flags & (LLMT_RECOMPUTE_FFN_ACT | LLMT_RECOMPUTE_FFN | LLMT_RECOMPUTE_FULL));
    case ACT_RSTD2:
    case ACT_H2:
    case ACT_GU: return !(flags & (LLMT_RECOMPUTE_FFN | LLMT_RECOMPUTE_FULL));
    default: return !(flags & LLMT_RECOMPUTE_FULL);
    }
}

/* Bytes of one layer's activation `which`. */
static size_t act_bytes(const llmt_dims *d, const llmt_backend_ops *ops, size_t e, int64_t batch,
                        int64_t seq, int which)
{
    size_t m = (size_t)(batch * seq);
    const llmt_attn_dims ad = {batch, seq, d->heads, d->kv_heads, d->head_dim};
    switch (which) {
    case ACT_RSTD1:
    case ACT_RSTD2: return m * sizeof(float);
    case ACT_QKV: return m * (size_t)d->qkv_dim * e;
    case ACT_ATTN: return ops->attention_saved_bytes(&ad);
    case ACT_ATT: return m * (size_t)d->att_dim * e;
    case ACT_GU: return m * 2 * (size_t)d->ffn * e;
    case ACT_S: return m * (size_t)d->ffn * e;
    default: return m * (size_t)d->d * e; /* X, H1, XMID, H2 */
    }
}

/* Reserves bytes at the end of an arena, 64-byte aligned; returns the offset. */
static size_t take(size_t *end, size_t bytes)
{
    size_t at = (*end + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    *end = at + bytes;
    return at;
}

static size_t max2(size_t a, size_t b)
{
    return a > b ? a : b;
}

int llmt_layout_compute(const llmt_model_config *cfg, const uint8_t *rc_flags, int64_t batch,
                        int64_t seq, int num_threads, const llmt_backend_ops *ops,
                        int want_offsets, llmt_layout *out)
{
    llmt_dims d;
    llmt_dims_from_config(cfg, &d);
    size_t e = llmt_dtype_size(llmt_precision_dtype(cfg->precision));
    size_t m = (size_t)(batch * seq);
    memset(out, 0, sizeof *out);
    out->batch = batch;
    out->seq = seq;
    if (want_offsets) {
        out->off = malloc((size_t)d.layers * ACT_COUNT * sizeof *out->off);
        if (!out->off)
            return llmt_fail(LLMT_ENOMEM, "activation layout: out of host memory");
    }

    size_t act = 0, work = 0;
    out->tokens = take(&act, m * sizeof(int32_t));
    out->targets = take(&act, m * sizeof(int32_t));
    int need_slot[ACT_COUNT] = {0};
    for (int64_t l = 0; l < d.layers; l++) {
        uint8_t flags = rc_flags ? rc_flags[l] : 0;
        for (int w = 0; w < ACT_COUNT; w++) {
            size_t at = LLMT_NO_OFFSET;
            if (llmt_act_kept(flags, w))
                at = take(&act, act_bytes(&d, ops, e, batch, seq, w));
            else if (w != ACT_ATTN) /* attention recomputes its own */
                need_slot[w] = 1;
            if (out->off)
                out->off[l * ACT_COUNT + w] = at;
        }
    }
    out->x_final = take(&act, m * (size_t)d.d * e);

    for (int w = 0; w < ACT_COUNT; w++)
        out->slot[w] =
            need_slot[w] ? take(&work, act_bytes(&d, ops, e, batch, seq, w)) : LLMT_NO_OFFSET;
    out->hf = take(&work, m * (size_t)d.d * e);
    out->rstdf = take(&work, m * sizeof(float));
    out->g_res = take(&work, m * (size_t)d.d * e);
    out->g_h = take(&work, m * (size_t)d.d * e);
    out->g_wide = take(&work, m * max2((size_t)d.qkv_dim, 2 * (size_t)d.ffn) * e);
    out->g_mid = take(&work, m * max2((size_t)d.att_dim, (size_t)d.ffn) * e);
    /* The LM head's chunk is the one the forward passes (run_head). */
    llmt_op_dims od = {batch, seq, d.d, d.heads, d.kv_heads, d.head_dim, d.ffn, d.vocab,
                       ops->ce_chunk((int64_t)m, d.vocab), llmt_precision_dtype(cfg->precision),
                       num_threads};
    out->scratch = take(&work, ops->scratch_bytes(&od));
    out->act_bytes = act;
    out->work_bytes = work;
    return LLMT_OK;
}

void llmt_layout_free(llmt_layout *l)
{
    free(l->off);
    l->off = NULL;
}
