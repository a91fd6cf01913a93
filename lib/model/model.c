/* llmt_model: creation, the public training calls and tensor access. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "model/transfer.h"

/* The ops the model needs from its backend. */
static int backend_has_model_ops(const llmt_backend_ops *o)
{
    return o->scratch_bytes && o->gemm && o->gemm_cd && o->ce_chunk && o->embedding_fwd &&
           o->embedding_bwd &&
           o->rmsnorm_fwd && o->rmsnorm_bwd && o->rope && o->attention_saved_bytes && o->attention_fwd &&
           o->attention_bwd && o->swiglu_fwd && o->swiglu_bwd && o->add && o->lm_head_ce;
}

int llmt_model_create(llmt_model **out, llmt_context *ctx, const llmt_model_config *cfg)
{
    if (!out)
        return llmt_fail(LLMT_EINVAL, "llmt_model_create: out is NULL");
    *out = NULL;
    if (!ctx || !cfg)
        return llmt_fail(LLMT_EINVAL, "llmt_model_create: %s is NULL", ctx ? "cfg" : "ctx");
    llmt_model_config c;
    int rc = llmt_model_config_upgrade(cfg, &c, "llmt_model_create");
    if (rc)
        return rc;
    cfg = &c;
    if (!backend_has_model_ops(llmt_ops(ctx)))
        return llmt_fail(LLMT_EUNSUPPORTED, "llmt_model_create: the %s backend does not "
                         "implement the model's ops yet", llmt_ops(ctx)->name);

    llmt_model *m = calloc(1, sizeof *m);
    if (!m)
        return llmt_fail(LLMT_ENOMEM, "llmt_model_create: out of host memory");
    m->ctx = ctx;
    m->ops = llmt_ops(ctx);
    m->dev = ctx->backend;
    m->cfg = *cfg;
    m->dt = llmt_precision_dtype(cfg->precision);
    llmt_dims_from_config(cfg, &m->dims);
    m->rc_flags = calloc((size_t)m->dims.layers, 1);
    m->arena_flags = calloc((size_t)m->dims.layers, 1);
    m->host_valid = calloc((size_t)m->dims.layers + 2, 1); /* one per gradient bucket */
    m->loaded = -1;                                         /* grad_split 0: all on the device */
    rc = m->rc_flags && m->arena_flags && m->host_valid
             ? llmt_model_build_params(m)
             : llmt_fail(LLMT_ENOMEM, "llmt_model_create: out of host memory");
    size_t bytes = (size_t)m->num_params * llmt_dtype_size(m->dt);
    if (!rc)
        rc = llmt_buf_alloc(ctx, &m->weights, LLMT_MEM_PARAMS, bytes, "model weights");
    if (!rc)
        rc = llmt_buf_alloc(ctx, &m->rope, LLMT_MEM_WORKSPACE, llmt_model_constant_bytes(cfg),
                            "RoPE table");
    if (!rc)
        rc = llmt_model_init_weights(m);
    if (!rc)
        rc = llmt_model_init_rope(m);
    if (rc) {
        llmt_model_free(m);
        return rc;
    }
    *out = m;
    return LLMT_OK;
}

void llmt_model_free(llmt_model *m)
{
    if (!m)
        return;
    llmt_model_release_arena(m);
    llmt_buf_free(m->ctx, &m->weights);
    llmt_buf_free(m->ctx, &m->grads);
    llmt_buf_free(m->ctx, &m->host_grads);
    llmt_buf_free(m->ctx, &m->grad_bucket);
    llmt_buf_free(m->ctx, &m->rope);
    free(m->params);
    free(m->layer);
    free(m->rc_flags);
    free(m->arena_flags);
    free(m->host_valid);
    free(m);
}

int llmt_model_get_config(const llmt_model *m, llmt_model_config *out)
{
    if (!m || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_model_get_config: %s is NULL", m ? "out" : "model");
    *out = m->cfg;
    return LLMT_OK;
}

int64_t llmt_model_num_params(const llmt_model *m)
{
    return m ? m->num_params : 0;
}

/* Checks a batch's arguments and counts its targets. */
static int check_batch(const llmt_model *m, const char *fn, const int32_t *tokens,
                       const int32_t *targets, int32_t batch, int32_t seq, int64_t *count)
{
    if (!m)
        return llmt_fail(LLMT_EINVAL, "%s: model is NULL", fn);
    if (!tokens)
        return llmt_fail(LLMT_EINVAL, "%s: tokens is NULL", fn);
    if (batch < 1)
        return llmt_fail(LLMT_EINVAL, "%s: batch = %d (must be >= 1)", fn, batch);
    if (seq < 1 || seq > m->cfg.max_seq_len)
        return llmt_fail(LLMT_EINVAL, "%s: seq_len = %d (must be 1..%d, the model's max_seq_len)",
                         fn, seq, m->cfg.max_seq_len);
    int64_t n = (int64_t)batch * seq, counted = 0;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return llmt_fail(LLMT_EINVAL, "%s: tokens[%lld] (sequence %lld, position %lld) = %d "
                             "is outside the vocabulary 0..%d", fn, (long long)i,
                             (long long)(i / seq), (long long)(i % seq), tokens[i],
                             m->cfg.vocab_size - 1);
        if (targets && (targets[i] < -1 || targets[i] >= m->cfg.vocab_size))
            return llmt_fail(LLMT_EINVAL, "%s: targets[%lld] (sequence %lld, position %lld) = %d "
                             "is neither -1 nor in 0..%d", fn, (long long)i,
                             (long long)(i / seq), (long long)(i % seq), targets[i],
                             m->cfg.vocab_size - 1);
        counted += targets && targets[i] >= 0;
    }
    *count = counted;
    return LLMT_OK;
}

int llmt_model_forward_backward(llmt_model *m, const int32_t *tokens, const int32_t *targets,
                                int32_t batch, int32_t seq_len, double grad_scale,
                                double normaliser, double *loss)
{
    const char *fn = "llmt_model_forward_backward";
    int64_t count = 0;
    if (!targets)
        return llmt_fail(LLMT_EINVAL, "%s: targets is NULL", fn);
    int rc = check_batch(m, fn, tokens, targets, batch, seq_len, &count);
    if (rc)
        return rc;
    if (!isfinite(grad_scale) || !isfinite(normaliser))
        return llmt_fail(LLMT_EINVAL, "%s: grad_scale = %g, normaliser = %g must be finite", fn,
                         grad_scale, normaliser);
    double norm = normaliser > 0.0 ? normaliser : (double)count;
    float row_scale = norm > 0.0 ? (float)(grad_scale / norm) : 0.0f;
    double sum = 0.0;
    int64_t counted = 0;
    rc = llmt_model_run(m, tokens, targets, batch, seq_len, 1, row_scale, &sum, &counted);
    if (!rc && loss)
        *loss = counted ? sum / (double)counted : 0.0;
    return rc;
}

int llmt_model_forward(llmt_model *m, const int32_t *tokens, const int32_t *targets,
                       int32_t batch, int32_t seq_len, double *loss)
{
    const char *fn = "llmt_model_forward";
    int64_t count = 0;
    if (!targets)
        return llmt_fail(LLMT_EINVAL, "%s: targets is NULL", fn);
    int rc = check_batch(m, fn, tokens, targets, batch, seq_len, &count);
    if (rc)
        return rc;
    double sum = 0.0;
    int64_t counted = 0;
    rc = llmt_model_run(m, tokens, targets, batch, seq_len, 0, 0.0f, &sum, &counted);
    if (!rc && loss)
        *loss = counted ? sum / (double)counted : 0.0;
    return rc;
}

int llmt_model_logits(llmt_model *m, const int32_t *tokens, int32_t batch, int32_t seq_len,
                      float *out, size_t count)
{
    const char *fn = "llmt_model_logits";
    int64_t unused = 0;
    int rc = check_batch(m, fn, tokens, NULL, batch, seq_len, &unused);
    if (rc)
        return rc;
    int64_t M = (int64_t)batch * seq_len, V = m->dims.vocab;
    if (!out || count != (size_t)(M * V))
        return llmt_fail(LLMT_EINVAL, "%s: out must hold batch * seq_len * vocab_size = %lld "
                         "floats (count = %zu%s)", fn, (long long)(M * V), count,
                         out ? "" : ", out NULL");
    return llmt_model_run_logits(m, tokens, batch, seq_len, out);
}

int llmt_model_reserve_activations(llmt_model *m, int32_t batch, int32_t seq_len)
{
    const char *fn = "llmt_model_reserve_activations";
    if (!m)
        return llmt_fail(LLMT_EINVAL, "%s: model is NULL", fn);
    if (batch < 1 || seq_len < 1 || seq_len > m->cfg.max_seq_len)
        return llmt_fail(LLMT_EINVAL, "%s: batch = %d, seq_len = %d (need batch >= 1, "
                         "1 <= seq_len <= %d)", fn, batch, seq_len, m->cfg.max_seq_len);
    return llmt_model_allocate_arena(m, batch, seq_len);
}

int llmt_model_release_activations(llmt_model *m)
{
    if (!m)
        return llmt_fail(LLMT_EINVAL, "llmt_model_release_activations: model is NULL");
    llmt_model_release_arena(m);
    return LLMT_OK;
}

int llmt_model_zero_grads(llmt_model *m)
{
    if (!m)
        return llmt_fail(LLMT_EINVAL, "llmt_model_zero_grads: model is NULL");
    return llmt_grads_zero(m);
}

int32_t llmt_model_num_tensors(const llmt_model *m)
{
    return m ? m->n_params : 0;
}

int llmt_model_tensor_info(const llmt_model *m, int32_t index, llmt_tensor_info *out)
{
    if (!m || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_model_tensor_info: %s is NULL", m ? "out" : "model");
    if (out->version != LLMT_TENSOR_INFO_VERSION)
        return llmt_fail(LLMT_EVERSION, "llmt_model_tensor_info: out->version = %u, this library "
                         "knows %u", out->version, LLMT_TENSOR_INFO_VERSION);
    if (index < 0 || index >= m->n_params)
        return llmt_fail(LLMT_EINVAL, "llmt_model_tensor_info: index = %d (model has %d tensors)",
                         index, m->n_params);
    const llmt_param *p = &m->params[index];
    memset(out->shape, 0, sizeof out->shape);
    out->name = p->name;
    out->ndim = p->ndim;
    out->shape[0] = p->shape[0];
    if (p->ndim == 2)
        out->shape[1] = p->shape[1];
    out->numel = p->numel;
    out->dtype = m->dt;
    return LLMT_OK;
}

/* The tensor named `name`, or NULL with an error set. */
const llmt_param *llmt_model_find_param(const llmt_model *m, const char *fn, const char *name)
{
    if (!m || !name) {
        llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, m ? "name" : "model");
        return NULL;
    }
    for (int32_t i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return &m->params[i];
    llmt_fail(LLMT_ENOTFOUND, "%s: the model has no tensor named \"%s\"", fn, name);
    return NULL;
}

int llmt_model_tensor_find(const llmt_model *m, const char *name, int32_t *index)
{
    const llmt_param *p = llmt_model_find_param(m, "llmt_model_tensor_find", name);
    if (!p)
        return m && name ? LLMT_ENOTFOUND : LLMT_EINVAL;
    if (index)
        *index = (int32_t)(p - m->params);
    return LLMT_OK;
}

int llmt_model_get_param(const llmt_model *m, const char *name, float *out, size_t count)
{
    return llmt_transfer_tensor(m, "llmt_model_get_param", name, m ? m->weights.ptr : NULL,
                                m ? m->dt : 0, out, count, 0);
}

int llmt_model_set_param(llmt_model *m, const char *name, const float *in, size_t count)
{
    int rc = llmt_transfer_tensor(m, "llmt_model_set_param", name, m ? m->weights.ptr : NULL,
                                  m ? m->dt : 0, (void *)in, count, 1);
    if (!rc)
        m->weights_epoch++;
    return rc;
}

/* Copies gradient tensor name between the model (both segments) and host. */
static int grad_tensor_io(llmt_model *m, const char *fn, const char *name, float *host,
                          size_t count, int to_grads)
{
    const llmt_param *p = NULL;
    LLMT_TRY(llmt_transfer_check(m, fn, name, host, count, &p));
    return llmt_grads_io(m, p->offset, p->numel, host, to_grads);
}

int llmt_model_get_grad(const llmt_model *m, const char *name, float *out, size_t count)
{
    /* Reading settles the gradients (within the host copy's room,
     * llmt_grads_io), which changes where values are held but never a
     * value; the model is never a const object. */
    return grad_tensor_io((llmt_model *)m, "llmt_model_get_grad", name, out, count, 0);
}

int llmt_model_set_grad(llmt_model *m, const char *name, const float *in, size_t count)
{
    return grad_tensor_io(m, "llmt_model_set_grad", name, (float *)in, count, 1);
}
