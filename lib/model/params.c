/* The parameter table (Hugging Face names, shapes, offsets into one flat
 * buffer), the documented initialisation and the RoPE table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model_internal.h"
#include "model/transfer.h"

#define INIT_STD 0.02f
/* Elements generated on the host per copy to the device. */
#define INIT_CHUNK ((int64_t)1 << 20)

static int64_t add_param(llmt_model *m, int64_t *next, int kind, int64_t rows, int64_t cols,
                         const char *fmt, long layer)
{
    llmt_param *p = &m->params[m->n_params++];
    snprintf(p->name, sizeof p->name, fmt, layer);
    p->ndim = cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->numel = cols ? rows * cols : rows;
    p->offset = *next;
    p->kind = kind;
    *next += p->numel;
    return p->offset;
}

int llmt_model_build_params(llmt_model *m)
{
    const llmt_dims *d = &m->dims;
    int32_t count = 2 + 9 * (int32_t)d->layers + (m->cfg.tie_embeddings ? 0 : 1);
    m->params = calloc((size_t)count, sizeof *m->params);
    m->layer = calloc((size_t)d->layers, sizeof *m->layer);
    if (!m->params || !m->layer)
        return llmt_fail(LLMT_ENOMEM, "llmt_model_create: out of host memory");
    int64_t next = 0, hd = d->head_dim;
    m->embed = add_param(m, &next, LLMT_PARAM_EMBED, d->vocab, d->d, "model.embed_tokens.weight", 0);
    for (long l = 0; l < d->layers; l++) {
        llmt_layer_offsets *o = &m->layer[l];
        o->ln1 = add_param(m, &next, LLMT_PARAM_NORM, d->d, 0, "model.layers.%ld.input_layernorm.weight", l);
        o->wqkv = add_param(m, &next, LLMT_PARAM_MATRIX, d->heads * hd, d->d, "model.layers.%ld.self_attn.q_proj.weight", l);
        add_param(m, &next, LLMT_PARAM_MATRIX, d->kv_heads * hd, d->d, "model.layers.%ld.self_attn.k_proj.weight", l);
        add_param(m, &next, LLMT_PARAM_MATRIX, d->kv_heads * hd, d->d, "model.layers.%ld.self_attn.v_proj.weight", l);
        o->wo = add_param(m, &next, LLMT_PARAM_MATRIX, d->d, d->att_dim, "model.layers.%ld.self_attn.o_proj.weight", l);
        o->ln2 = add_param(m, &next, LLMT_PARAM_NORM, d->d, 0, "model.layers.%ld.post_attention_layernorm.weight", l);
        o->wgu = add_param(m, &next, LLMT_PARAM_MATRIX, d->ffn, d->d, "model.layers.%ld.mlp.gate_proj.weight", l);
        add_param(m, &next, LLMT_PARAM_MATRIX, d->ffn, d->d, "model.layers.%ld.mlp.up_proj.weight", l);
        o->wdown = add_param(m, &next, LLMT_PARAM_MATRIX, d->d, d->ffn, "model.layers.%ld.mlp.down_proj.weight", l);
    }
    m->norm = add_param(m, &next, LLMT_PARAM_NORM, d->d, 0, "model.norm.weight", 0);
    m->lm_head = m->cfg.tie_embeddings
                     ? m->embed
                     : add_param(m, &next, LLMT_PARAM_MATRIX, d->vocab, d->d, "lm_head.weight", 0);
    m->num_params = next;
    return LLMT_OK;
}

int llmt_model_init_weights(llmt_model *m)
{
    float *chunk = malloc((size_t)INIT_CHUNK * sizeof *chunk);
    if (!chunk)
        return llmt_fail(LLMT_ENOMEM, "llmt_model_create: out of host memory");
    /* One stream for all weights, drawn in table order. */
    llmt_rng_state rng = {m->ctx->cfg.seed, LLMT_STREAM_INIT, 0};
    int rc = LLMT_OK;
    for (int32_t i = 0; i < m->n_params && !rc; i++) {
        const llmt_param *p = &m->params[i];
        for (int64_t done = 0; done < p->numel && !rc; done += INIT_CHUNK) {
            int64_t n = p->numel - done < INIT_CHUNK ? p->numel - done : INIT_CHUNK;
            if (p->kind == LLMT_PARAM_NORM)
                for (int64_t j = 0; j < n; j++)
                    chunk[j] = 1.0f;
            else
                llmt_rng_fill_normal(&rng, chunk, (size_t)n, 0.0f, INIT_STD);
            rc = llmt_transfer_in(m, m->weights.ptr, m->dt, p->offset + done, chunk, n);
        }
    }
    free(chunk);
    return rc;
}

size_t llmt_model_constant_bytes(const llmt_model_config *cfg)
{
    /* cos and sin for every position and half a head. */
    return 2 * (size_t)cfg->max_seq_len * (size_t)(cfg->hidden_size / cfg->num_heads / 2) *
           sizeof(float);
}

/* The inverse frequency of rotation pair i: theta^(-2i / head_dim), then,
 * with llama3 scaling (Hugging Face's _compute_llama3_parameters), wavelengths
 * longer than original_max_len / low_freq_factor divided by factor, shorter
 * than original_max_len / high_freq_factor kept, and those between blended
 * linearly in original_max_len / wavelength. In double throughout. */
static double rope_inv_freq(const llmt_model_config *c, int64_t i, int64_t head_dim)
{
    double inv = pow((double)c->rope_theta, -2.0 * (double)i / (double)head_dim);
    if (c->rope_scaling != LLMT_ROPE_SCALING_LLAMA3)
        return inv;
    const double pi = 3.14159265358979323846;
    double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
    double old_len = (double)c->rope_original_max_len, wavelen = 2.0 * pi / inv;
    if (wavelen < old_len / hi)
        return inv;
    if (wavelen > old_len / lo)
        return inv / factor;
    double smooth = (old_len / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * inv / factor + smooth * inv;
}

int llmt_model_init_rope(llmt_model *m)
{
    int64_t half = m->dims.head_dim / 2, seq = m->dims.max_seq;
    float *table = malloc(llmt_model_constant_bytes(&m->cfg));
    if (!table)
        return llmt_fail(LLMT_ENOMEM, "llmt_model_create: out of host memory");
    /* cos and sin of pos * inv_freq, computed in double then rounded. */
    for (int64_t pos = 0; pos < seq; pos++)
        for (int64_t i = 0; i < half; i++) {
            double inv_freq = rope_inv_freq(&m->cfg, i, m->dims.head_dim);
            double angle = (double)pos * inv_freq;
            table[(2 * pos) * half + i] = (float)cos(angle);
            table[(2 * pos + 1) * half + i] = (float)sin(angle);
        }
    int rc = m->ops->copy_to_device(m->dev, m->rope.ptr, table, llmt_model_constant_bytes(&m->cfg));
    free(table);
    return rc;
}
