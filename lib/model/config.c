/* Model configuration: defaults, validation, derived dimensions. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "core/error.h"
#include "model/model_internal.h"

/* Bounds that keep every size computation far from overflow. */
#define MAX_DIM (1 << 20)
#define MAX_LAYERS 4096

void llmt_model_config_init(llmt_model_config *cfg)
{
    if (cfg) {
        const llmt_model_config defaults = LLMT_MODEL_CONFIG_INIT;
        *cfg = defaults;
    }
}

int llmt_precision_dtype(int precision)
{
    switch (precision) {
    case LLMT_PRECISION_BF16_MIXED:
    case LLMT_PRECISION_BF16_PURE: return LLMT_DTYPE_BF16;
    case LLMT_PRECISION_FP16_MIXED: return LLMT_DTYPE_F16;
    default: return LLMT_DTYPE_F32;
    }
}

void llmt_dims_from_config(const llmt_model_config *c, llmt_dims *d)
{
    d->vocab = c->vocab_size;
    d->d = c->hidden_size;
    d->layers = c->num_layers;
    d->heads = c->num_heads;
    d->kv_heads = c->num_kv_heads;
    d->head_dim = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
    d->qkv_dim = (d->heads + 2 * d->kv_heads) * d->head_dim;
    d->att_dim = d->heads * d->head_dim;
    d->ffn = c->ffn_size;
    d->max_seq = c->max_seq_len;
}

#define CHECK_RANGE(field, lo, hi)                                                        \
    do {                                                                                  \
        if (cfg->field < (lo) || cfg->field > (hi))                                       \
            return llmt_fail(LLMT_EINVAL, "%s: cfg->" #field " = %d (must be %d..%d)", fn, \
                             (int)cfg->field, (int)(lo), (int)(hi));                      \
    } while (0)

/* Bytes of a version 1 configuration: everything up to the RoPE scaling fields. */
#define CONFIG_V1_BYTES offsetof(llmt_model_config, rope_scaling)

int llmt_model_config_upgrade(const llmt_model_config *in, llmt_model_config *out, const char *fn)
{
    if (in->version != 1 && in->version != LLMT_MODEL_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows 1..%u", fn,
                         in->version, LLMT_MODEL_CONFIG_VERSION);
    llmt_model_config_init(out);
    /* A version 1 struct ends before the scaling fields: read only its bytes. */
    memcpy(out, in, in->version == 1 ? CONFIG_V1_BYTES : sizeof *out);
    out->version = LLMT_MODEL_CONFIG_VERSION;
    return llmt_model_config_check(out, fn);
}

/* The llama3 scaling fields, when rope_scaling asks for them. */
static int check_rope_scaling(const llmt_model_config *cfg, const char *fn)
{
    if (cfg->rope_scaling == LLMT_ROPE_SCALING_NONE)
        return LLMT_OK;
    if (cfg->rope_scaling != LLMT_ROPE_SCALING_LLAMA3)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rope_scaling = %d (must be NONE %d or LLAMA3 %d)",
                         fn, cfg->rope_scaling, LLMT_ROPE_SCALING_NONE, LLMT_ROPE_SCALING_LLAMA3);
    if (!(cfg->rope_factor >= 1.0f && isfinite(cfg->rope_factor)))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rope_factor = %g (must be >= 1)", fn,
                         (double)cfg->rope_factor);
    if (!(cfg->rope_low_freq_factor > 0.0f && isfinite(cfg->rope_low_freq_factor)))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rope_low_freq_factor = %g (must be > 0)", fn,
                         (double)cfg->rope_low_freq_factor);
    if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor &&
          isfinite(cfg->rope_high_freq_factor)))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rope_high_freq_factor = %g (must be > "
                         "rope_low_freq_factor = %g)", fn, (double)cfg->rope_high_freq_factor,
                         (double)cfg->rope_low_freq_factor);
    CHECK_RANGE(rope_original_max_len, 1, MAX_DIM);
    return LLMT_OK;
}

int llmt_model_config_check(const llmt_model_config *cfg, const char *fn)
{
    if (cfg->version != LLMT_MODEL_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows %u", fn,
                         cfg->version, LLMT_MODEL_CONFIG_VERSION);
    CHECK_RANGE(vocab_size, 2, MAX_DIM);
    CHECK_RANGE(hidden_size, 2, MAX_DIM);
    CHECK_RANGE(num_layers, 1, MAX_LAYERS);
    CHECK_RANGE(num_heads, 1, cfg->hidden_size);
    CHECK_RANGE(num_kv_heads, 1, cfg->num_heads);
    CHECK_RANGE(ffn_size, 1, MAX_DIM);
    CHECK_RANGE(max_seq_len, 1, MAX_DIM);
    CHECK_RANGE(tie_embeddings, 0, 1);
    CHECK_RANGE(precision, LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_PURE);
    if (cfg->hidden_size % cfg->num_heads != 0)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->hidden_size = %d is not a multiple of "
                         "cfg->num_heads = %d", fn, cfg->hidden_size, cfg->num_heads);
    if ((cfg->hidden_size / cfg->num_heads) % 2 != 0)
        return llmt_fail(LLMT_EINVAL, "%s: head_dim = %d must be even for RoPE", fn,
                         cfg->hidden_size / cfg->num_heads);
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->num_kv_heads = %d does not divide "
                         "cfg->num_heads = %d", fn, cfg->num_kv_heads, cfg->num_heads);
    if (!(cfg->rms_norm_eps > 0.0f && cfg->rms_norm_eps < 1.0f))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rms_norm_eps = %g (must be in (0, 1))", fn,
                         (double)cfg->rms_norm_eps);
    if (!(cfg->rope_theta > 1.0f && isfinite(cfg->rope_theta)))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rope_theta = %g (must be > 1)", fn,
                         (double)cfg->rope_theta);
    return check_rope_scaling(cfg, fn);
}
