/* FLOPs, bytes and roofline time of the backend's ops, per call and for a
 * training step (see op_cost.h for what is counted). */
#include "op_cost.h"

static const char *const family_names[OP_FAMILY_COUNT] = {
    "gemm_fwd", "gemm_bwd", "attn_fwd", "attn_bwd", "lm_head_ce", "rmsnorm",
    "rope",     "swiglu",   "embedding", "elementwise", "copy",   "optimizer",
};

const char *op_family_name(int f)
{
    return f >= 0 && f < OP_FAMILY_COUNT ? family_names[f] : "?";
}

/* One call of flops (causal_flops) model FLOPs moving bytes. */
static op_cost one_call(double flops, double causal_flops, double bytes)
{
    op_cost c = {1, flops, causal_flops, bytes, 0.0, causal_flops / (OP_PEAK_TFLOPS * 1e12)};
    double memory_s = bytes / (OP_HBM_TBPS * 1e12);
    c.roofline_s = c.compute_s > memory_s ? c.compute_s : memory_s;
    return c;
}

op_cost op_cost_gemm(int64_t m, int64_t n, int64_t k, int accumulate, int64_t es)
{
    double flops = 2.0 * (double)m * (double)n * (double)k;
    double elems = (double)m * k + (double)k * n + (double)m * n * (accumulate ? 2 : 1);
    return one_call(flops, flops, elems * (double)es);
}

op_cost op_cost_attention(const llmt_attn_dims *a, int backward, int64_t es)
{
    /* Per (batch, head) and T x T square: S = Q K^T and O = P V forward;
     * dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q backward. */
    double square = 2.0 * (double)a->batch * a->heads * a->seq * a->seq * a->head_dim;
    double flops = (backward ? 4.0 : 2.0) * square;
    /* The causal triangle with its diagonal: T (T + 1) / 2 of T^2 pairs. */
    double causal = flops * (double)(a->seq + 1) / (2.0 * (double)a->seq);
    double rows = (double)a->batch * a->seq;
    double qkv = rows * (a->heads + 2 * a->kv_heads) * a->head_dim;
    double out = rows * a->heads * a->head_dim;
    double lse = rows * a->heads * 4.0; /* fp32 logsumexp per query row and head */
    /* forward: qkv in, out and lse out; backward: qkv, out, dout, lse in, dqkv out */
    double bytes = backward ? (2 * qkv + 2 * out) * es + lse : (qkv + out) * es + lse;
    return one_call(flops, causal, bytes);
}

op_cost op_cost_lm_head_ce(int64_t m, int64_t d, int64_t vocab, int want_grad, int64_t es)
{
    /* logits = h W^T; with the gradient also dh = dlogits W and dW += dlogits^T h */
    double product = 2.0 * (double)m * d * vocab;
    double flops = (want_grad ? 3.0 : 1.0) * product;
    double bytes = ((double)m * d + (double)vocab * d) * es + 4.0 * m; /* h, W, targets */
    if (want_grad)
        bytes += ((double)m * d + 2.0 * vocab * d) * es; /* dh written, dW accumulated */
    return one_call(flops, flops, bytes);
}

op_cost op_cost_rmsnorm(int64_t m, int64_t d, int backward, int accumulate, int64_t es)
{
    double md = (double)m * d, rstd = 4.0 * m;
    if (!backward) /* x, w in; out, rstd out */
        return one_call(0, 0, (2 * md + d) * es + rstd);
    /* dout, x, w, rstd in; dx written (read too when accumulated), dw accumulated */
    return one_call(0, 0, (md * (accumulate ? 4 : 3) + 3.0 * d) * es + rstd);
}

op_cost op_cost_rope(int64_t m, int64_t seq, int64_t heads, int64_t head_dim, int64_t es)
{
    /* the rotated heads read and written in place; the cos/sin table (fp32,
     * head_dim per position) read */
    return one_call(0, 0, 2.0 * m * heads * head_dim * es + 4.0 * seq * head_dim);
}

op_cost op_cost_swiglu(int64_t m, int64_t f, int backward, int64_t es)
{
    /* forward: gate_up (2f) in, out (f); backward: dout (f), gate_up in, dgate_up out */
    return one_call(0, 0, (double)m * f * (backward ? 5 : 3) * es);
}

op_cost op_cost_embedding(int64_t m, int64_t d, int backward, int64_t es)
{
    /* ids in; forward: m rows read and written; backward: dout read, the
     * rows of dtable read and written (per token: repeated ids counted again) */
    return one_call(0, 0, 4.0 * m + (double)m * d * (backward ? 3 : 2) * es);
}

op_cost op_cost_cast(int64_t n, int64_t src_es, int64_t dst_es)
{
    return one_call(0, 0, (double)n * (double)(src_es + dst_es));
}

op_cost op_cost_accumulate(int64_t n, int64_t es)
{
    return one_call(0, 0, (double)n * (double)(8 + es));
}

op_cost op_cost_bytes(double bytes)
{
    return one_call(0, 0, bytes);
}

op_cost op_cost_grad_stats(int64_t n, int64_t es)
{
    return one_call(0, 0, (double)n * es);
}

op_cost op_cost_adamw(int64_t n, int64_t es, int master, int64_t state_es)
{
    double per = (double)es + 4.0 * state_es + (master ? 8.0 + es : 2.0 * es);
    return one_call(0, 0, per * n);
}

void op_cost_add(op_cost *acc, op_cost c)
{
    acc->calls += c.calls;
    acc->flops += c.flops;
    acc->causal_flops += c.causal_flops;
    acc->bytes += c.bytes;
    acc->roofline_s += c.roofline_s;
    acc->compute_s += c.compute_s;
}

/* Storage dtype size, master weights and moment size of a precision, as
 * llmt_precision_dtype (lib/model/config.c) and llmt_optimizer_create
 * (lib/optim/optimizer.c) choose them. */
static int precision_sizes(int precision, int64_t *es, int *master, int64_t *state_es)
{
    switch (precision) {
    case LLMT_PRECISION_FP32: *es = 4, *master = 0, *state_es = 4; return 0;
    case LLMT_PRECISION_BF16_MIXED:
    case LLMT_PRECISION_FP16_MIXED: *es = 2, *master = 1, *state_es = 4; return 0;
    case LLMT_PRECISION_BF16_PURE: *es = 2, *master = 0, *state_es = 2; return 0;
    default: return -1;
    }
}

/* One layer's forward (lib/model/forward.c, llmt_layer_forward). */
static void layer_forward(op_cost *o, const llmt_attn_dims *ad, int64_t d, int64_t ffn, int64_t es)
{
    const int64_t M = ad->batch * ad->seq, hd = ad->head_dim;
    const int64_t qkv = (ad->heads + 2 * ad->kv_heads) * hd, att = ad->heads * hd;
    op_cost_add(&o[OP_RMSNORM], op_cost_rmsnorm(M, d, 0, 0, es));
    op_cost_add(&o[OP_GEMM_FWD], op_cost_gemm(M, qkv, d, 0, es));
    op_cost_add(&o[OP_ROPE], op_cost_rope(M, ad->seq, ad->heads + ad->kv_heads, hd, es));
    op_cost_add(&o[OP_ATTN_FWD], op_cost_attention(ad, 0, es));
    /* xmid = x + att Wo^T (gemm_cd: x read as C, xmid written as D) */
    op_cost_add(&o[OP_GEMM_FWD], op_cost_gemm(M, d, att, 1, es));
    op_cost_add(&o[OP_RMSNORM], op_cost_rmsnorm(M, d, 0, 0, es));
    op_cost_add(&o[OP_GEMM_FWD], op_cost_gemm(M, 2 * ffn, d, 0, es));
    op_cost_add(&o[OP_SWIGLU], op_cost_swiglu(M, ffn, 0, es));
    /* x_next = xmid + s Wdown^T (gemm_cd) */
    op_cost_add(&o[OP_GEMM_FWD], op_cost_gemm(M, d, ffn, 1, es));
}

/* One layer's backward (lib/model/backward.c, layer_backward): per linear
 * layer a data gradient and an accumulated weight gradient. */
static void layer_backward(op_cost *o, const llmt_attn_dims *ad, int64_t d, int64_t ffn, int64_t es)
{
    const int64_t M = ad->batch * ad->seq, hd = ad->head_dim;
    const int64_t qkv = (ad->heads + 2 * ad->kv_heads) * hd, att = ad->heads * hd;
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(M, ffn, d, 0, es));
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(d, ffn, M, 1, es));
    op_cost_add(&o[OP_SWIGLU], op_cost_swiglu(M, ffn, 1, es));
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(M, d, 2 * ffn, 0, es));
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(2 * ffn, d, M, 1, es));
    op_cost_add(&o[OP_RMSNORM], op_cost_rmsnorm(M, d, 1, 1, es));
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(M, att, d, 0, es));
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(d, att, M, 1, es));
    op_cost_add(&o[OP_ATTN_BWD], op_cost_attention(ad, 1, es));
    op_cost_add(&o[OP_ROPE], op_cost_rope(M, ad->seq, ad->heads + ad->kv_heads, hd, es));
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(M, d, qkv, 0, es));
    op_cost_add(&o[OP_GEMM_BWD], op_cost_gemm(qkv, d, M, 1, es));
    op_cost_add(&o[OP_RMSNORM], op_cost_rmsnorm(M, d, 1, 1, es));
}

int op_cost_step(const llmt_model_config *c, int64_t batch, int64_t seq,
                 op_cost out[OP_FAMILY_COUNT])
{
    int64_t es = 0, state_es = 0;
    int master = 0;
    if (precision_sizes(c->precision, &es, &master, &state_es) || batch < 1 || seq < 1 ||
        c->vocab_size < 1 || c->hidden_size < 1 || c->num_layers < 1 || c->num_heads < 1 ||
        c->num_kv_heads < 1 || c->ffn_size < 1)
        return -1;
    for (int f = 0; f < OP_FAMILY_COUNT; f++)
        out[f] = (op_cost){0};
    const int64_t d = c->hidden_size, L = c->num_layers, V = c->vocab_size, ffn = c->ffn_size;
    const int64_t hd = d / c->num_heads, M = batch * seq;
    const int64_t att = c->num_heads * hd, qkv = (c->num_heads + 2 * c->num_kv_heads) * hd;
    const llmt_attn_dims ad = {batch, seq, c->num_heads, c->num_kv_heads, hd};
    /* Parameters: the embedding, per layer two norms and four matrices, the
     * final norm, the LM head unless tied (lib/model/params.c). */
    const int64_t layer_params = 2 * d + qkv * d + d * att + 2 * ffn * d + d * ffn;
    const int64_t params = V * d + L * layer_params + d + (c->tie_embeddings ? 0 : V * d);

    op_cost_add(&out[OP_COPY], op_cost_bytes((double)params * es)); /* zero the gradients */
    op_cost_add(&out[OP_COPY], op_cost_bytes(4.0 * M));             /* upload the tokens */
    op_cost_add(&out[OP_EMBEDDING], op_cost_embedding(M, d, 0, es));
    for (int64_t l = 0; l < L; l++)
        layer_forward(out, &ad, d, ffn, es);
    op_cost_add(&out[OP_RMSNORM], op_cost_rmsnorm(M, d, 0, 0, es)); /* final norm */
    op_cost_add(&out[OP_COPY], op_cost_bytes(4.0 * M));             /* upload the targets */
    op_cost_add(&out[OP_LM_HEAD_CE], op_cost_lm_head_ce(M, d, V, 1, es));
    op_cost_add(&out[OP_RMSNORM], op_cost_rmsnorm(M, d, 1, 0, es)); /* final norm */
    for (int64_t l = 0; l < L; l++)
        layer_backward(out, &ad, d, ffn, es);
    op_cost_add(&out[OP_EMBEDDING], op_cost_embedding(M, d, 1, es));

    /* The optimizer: the gradient norm in one pass, then one AdamW per run
     * of tensors sharing a weight decay (norm weights undecayed): the
     * embedding; per layer ln1 | q, k, v, o | ln2 | gate, up, down; the
     * final norm; the LM head. */
    op_cost_add(&out[OP_OPTIMIZER], op_cost_grad_stats(params, es));
    op_cost_add(&out[OP_OPTIMIZER], op_cost_adamw(V * d, es, master, state_es));
    for (int64_t l = 0; l < L; l++) {
        op_cost_add(&out[OP_OPTIMIZER], op_cost_adamw(d, es, master, state_es));
        op_cost_add(&out[OP_OPTIMIZER], op_cost_adamw((qkv + att) * d, es, master, state_es));
        op_cost_add(&out[OP_OPTIMIZER], op_cost_adamw(d, es, master, state_es));
        op_cost_add(&out[OP_OPTIMIZER], op_cost_adamw(3 * ffn * d, es, master, state_es));
    }
    op_cost_add(&out[OP_OPTIMIZER], op_cost_adamw(d, es, master, state_es));
    if (!c->tie_embeddings)
        op_cost_add(&out[OP_OPTIMIZER], op_cost_adamw(V * d, es, master, state_es));
    return 0;
}
