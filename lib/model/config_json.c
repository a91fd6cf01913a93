/* Model configuration <-> JSON. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/config_json.h"

/* Integer fields of the configuration, in the order they are written. */
typedef struct int_field {
    const char *name;
    size_t offset;
} int_field;

#define INT_FIELD(f) {#f, offsetof(llmt_model_config, f)}
static const int_field int_fields[] = {
    INT_FIELD(vocab_size),   INT_FIELD(hidden_size), INT_FIELD(num_layers),
    INT_FIELD(num_heads),    INT_FIELD(num_kv_heads), INT_FIELD(ffn_size),
    INT_FIELD(max_seq_len),  INT_FIELD(tie_embeddings), INT_FIELD(precision),
};
#define INT_FIELD_COUNT (sizeof int_fields / sizeof int_fields[0])

static int32_t *int_at(llmt_model_config *c, size_t i)
{
    return (int32_t *)((char *)c + int_fields[i].offset);
}

static int32_t int_of(const llmt_model_config *c, size_t i)
{
    return *(const int32_t *)((const char *)c + int_fields[i].offset);
}

int llmt_model_config_write_json(llmt_jw *w, const llmt_model_config *cfg)
{
    llmt_jw_begin_object(w);
    for (size_t i = 0; i < INT_FIELD_COUNT; i++) {
        llmt_jw_key(w, int_fields[i].name, strlen(int_fields[i].name));
        llmt_jw_int64(w, int_of(cfg, i));
    }
    llmt_jw_key(w, "rms_norm_eps", strlen("rms_norm_eps"));
    llmt_jw_double(w, cfg->rms_norm_eps);
    llmt_jw_key(w, "rope_theta", strlen("rope_theta"));
    llmt_jw_double(w, cfg->rope_theta);
    return llmt_jw_end_object(w); /* the writer's first error sticks */
}

static int read_float(const llmt_json *obj, const char *name, float *out)
{
    double v = 0;
    const llmt_json *f = llmt_json_get(obj, name);
    if (!f || llmt_json_type(f) != LLMT_JSON_NUMBER || llmt_json_double(f, &v))
        return llmt_fail(LLMT_ECORRUPT, "model config: \"%s\" missing or not a number", name);
    *out = (float)v;
    return LLMT_OK;
}

int llmt_model_config_read_json(const llmt_json *obj, llmt_model_config *cfg)
{
    if (llmt_json_type(obj) != LLMT_JSON_OBJECT)
        return llmt_fail(LLMT_ECORRUPT, "model config: not a JSON object");
    llmt_model_config_init(cfg);
    for (size_t i = 0; i < INT_FIELD_COUNT; i++) {
        int64_t v = 0;
        const llmt_json *f = llmt_json_get(obj, int_fields[i].name);
        if (!f || llmt_json_int64(f, &v) || v < INT32_MIN || v > INT32_MAX)
            return llmt_fail(LLMT_ECORRUPT, "model config: \"%s\" missing or not a 32-bit integer",
                             int_fields[i].name);
        *int_at(cfg, i) = (int32_t)v;
    }
    int rc = read_float(obj, "rms_norm_eps", &cfg->rms_norm_eps);
    if (!rc)
        rc = read_float(obj, "rope_theta", &cfg->rope_theta);
    if (!rc && llmt_json_len(obj) != INT_FIELD_COUNT + 2)
        rc = llmt_fail(LLMT_ECORRUPT, "model config: %zu fields, expected %zu", llmt_json_len(obj),
                       INT_FIELD_COUNT + 2);
    return rc;
}

const char *llmt_model_config_mismatch(const llmt_model_config *a, const llmt_model_config *b,
                                       char *va, char *vb, size_t cap)
{
    for (size_t i = 0; i < INT_FIELD_COUNT; i++) {
        if (strcmp(int_fields[i].name, "precision") == 0 || int_of(a, i) == int_of(b, i))
            continue;
        snprintf(va, cap, "%d", int_of(a, i));
        snprintf(vb, cap, "%d", int_of(b, i));
        return int_fields[i].name;
    }
    if (a->rms_norm_eps != b->rms_norm_eps || a->rope_theta != b->rope_theta) {
        int eps = a->rms_norm_eps != b->rms_norm_eps;
        snprintf(va, cap, "%.9g", (double)(eps ? a->rms_norm_eps : a->rope_theta));
        snprintf(vb, cap, "%.9g", (double)(eps ? b->rms_norm_eps : b->rope_theta));
        return eps ? "rms_norm_eps" : "rope_theta";
    }
    return NULL;
}
