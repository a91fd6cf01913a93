/* Model weights to and from safetensors files under Hugging Face names. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "model/config_json.h"
#include "model/model_internal.h"
#include "model/transfer.h"

/* The metadata key holding the model configuration as JSON. */
#define CONFIG_KEY "llmt.model_config"
/* Elements converted at a time on the host. */

typedef struct save_job {
    const llmt_model *m;
    int disk_dt;
    float *tmp; /* LLMT_TRANSFER_CHUNK floats */
} save_job;

/* Produces bytes of tensor ti in the disk dtype. */
static int fill_tensor(void *user, size_t ti, size_t byte_offset, void *dst, size_t bytes)
{
    const save_job *job = user;
    return llmt_transfer_weights_out(job->m, job->m->params[ti].offset, job->disk_dt, byte_offset,
                                     bytes, dst, job->tmp);
}

int llmt_model_save_safetensors(const llmt_model *m, const char *path, int dtype)
{
    const char *fn = "llmt_model_save_safetensors";
    if (!m || !path)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, m ? "path" : "model");
    if (dtype != LLMT_DTYPE_F32 && dtype != LLMT_DTYPE_BF16 && dtype != LLMT_DTYPE_F16)
        return llmt_fail(LLMT_EINVAL, "%s: dtype = %d (must be F32, BF16 or F16)", fn, dtype);
    llmt_jw w;
    llmt_jw_init(&w);
    const char *config_text = NULL;
    size_t config_len = 0;
    int rc = llmt_model_config_write_json(&w, &m->cfg);
    if (!rc)
        rc = llmt_jw_finish(&w, &config_text, &config_len);
    save_job job = {m, dtype, malloc((size_t)LLMT_TRANSFER_CHUNK * sizeof(float))};
    llmt_st_write_tensor *tensors = calloc((size_t)m->n_params, sizeof *tensors);
    if (!rc && (!job.tmp || !tensors))
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    if (!rc) {
        for (int32_t i = 0; i < m->n_params; i++) {
            const llmt_param *p = &m->params[i];
            tensors[i] = (llmt_st_write_tensor){.name = p->name, .dtype = dtype, .ndim = p->ndim,
                                                .fill = fill_tensor, .user = &job};
            tensors[i].shape[0] = (uint64_t)p->shape[0];
            tensors[i].shape[1] = (uint64_t)p->shape[1];
        }
        const llmt_st_meta meta[2] = {{"format", "pt"}, {CONFIG_KEY, config_text}};
        rc = llmt_st_write(path, tensors, (size_t)m->n_params, meta, 2, NULL, NULL);
        if (rc)
            llmt_fail_prefix(rc, "%s", fn);
    }
    free(tensors);
    free(job.tmp);
    llmt_jw_free(&w);
    return rc;
}

/* Refuses a file whose stored configuration describes another architecture. */
static int check_config(const llmt_model *m, llmt_st_file *f, const char *path)
{
    const char *text = llmt_st_meta_get(f, CONFIG_KEY);
    if (!text)
        return LLMT_OK; /* a file from elsewhere: the shapes are checked instead */
    llmt_json *root = NULL;
    const llmt_json_limits lim = {8, strlen(text), 64, 64};
    llmt_model_config stored;
    int rc = llmt_json_parse(text, strlen(text), &lim, &root);
    if (!rc)
        rc = llmt_model_config_read_json(root, &stored);
    llmt_json_free(root);
    if (rc)
        return llmt_fail_prefix(LLMT_ECORRUPT, "%s: metadata %s", path, CONFIG_KEY);
    char a[32], b[32];
    const char *field = llmt_model_config_mismatch(&stored, &m->cfg, a, b, sizeof a);
    if (field)
        return llmt_fail(LLMT_EINVAL, "%s: the file's model has %s = %s, this model %s", path,
                         field, a, b);
    return LLMT_OK;
}

/* Checks that the file holds exactly the model's tensors, with their shapes
 * and a float dtype. */
static int check_tensors(const llmt_model *m, llmt_st_file *f, const char *path)
{
    for (size_t i = 0; i < llmt_st_count(f); i++) {
        const llmt_st_tensor *t = llmt_st_tensor_at(f, i);
        if (!llmt_model_find_param(m, path, t->name))
            return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" is not a parameter of this model",
                             path, t->name);
    }
    for (int32_t i = 0; i < m->n_params; i++) {
        const llmt_param *p = &m->params[i];
        size_t idx = 0;
        if (llmt_st_find(f, p->name, &idx))
            return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" is missing", path, p->name);
        const llmt_st_tensor *t = llmt_st_tensor_at(f, idx);
        if (t->dtype == LLMT_DTYPE_I32)
            return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" has dtype I32, not a float type",
                             path, p->name);
        int same = t->ndim == p->ndim && t->shape[0] == (uint64_t)p->shape[0] &&
                   (p->ndim == 1 || t->shape[1] == (uint64_t)p->shape[1]);
        if (!same)
            return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" has shape [%llu%s%llu], the model "
                             "[%lld%s%lld]", path, p->name, (unsigned long long)t->shape[0],
                             t->ndim > 1 ? ", " : "", t->ndim > 1 ? (unsigned long long)t->shape[1] : 0ULL,
                             (long long)p->shape[0], p->ndim > 1 ? ", " : "",
                             p->ndim > 1 ? (long long)p->shape[1] : 0LL);
    }
    return LLMT_OK;
}

/* Reads every tensor into staging (device memory of the model's dtype). */
static int read_all(const llmt_model *m, llmt_st_file *f, void *staging, void *raw, float *tmp)
{
    for (int32_t i = 0; i < m->n_params; i++) {
        const llmt_param *p = &m->params[i];
        size_t idx = 0;
        llmt_st_find(f, p->name, &idx);
        LLMT_TRY(llmt_transfer_tensor_in(m, staging, p->offset, p->numel, f, idx, raw, tmp));
    }
    return LLMT_OK;
}

int llmt_model_load_safetensors(llmt_model *m, const char *path)
{
    const char *fn = "llmt_model_load_safetensors";
    if (!m || !path)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, m ? "path" : "model");
    llmt_st_file *f = NULL;
    int rc = llmt_st_open(path, NULL, &f);
    if (!rc)
        rc = check_config(m, f, path);
    if (!rc)
        rc = check_tensors(m, f, path);
    /* Everything is read into staging first: a failure part-way leaves the
     * weights as they were. */
    llmt_buf staging = {0};
    void *raw = malloc((size_t)LLMT_TRANSFER_CHUNK * sizeof(float));
    float *tmp = malloc((size_t)LLMT_TRANSFER_CHUNK * sizeof(float));
    if (!rc && (!raw || !tmp))
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    if (!rc)
        rc = llmt_buf_alloc(m->ctx, &staging, LLMT_MEM_STAGING, m->weights.bytes, "weights being loaded");
    if (!rc)
        rc = read_all(m, f, staging.ptr, raw, tmp);
    if (!rc)
        rc = m->ops->copy_on_device(m->dev, m->weights.ptr, staging.ptr, m->weights.bytes);
    if (!rc)
        m->weights_epoch++;
    llmt_buf_free(m->ctx, &staging);
    free(raw);
    free(tmp);
    llmt_st_close(f);
    return rc;
}
