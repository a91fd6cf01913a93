/* Model configuration <-> JSON. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/config_json.h"

/* A field of the configuration by name and offset (int32 in int_fields,
 * float in scaling_floats). */
typedef struct int_field {
    const char *name;
    size_t offset;
} int_field;

#define INT_FIELD(f) {#f, offsetof(llmt_model_config, f)}
/* Integer fields of the configuration, in the order they are written. */
static const int_field int_fields[] = {
    INT_FIELD(vocab_size),   INT_FIELD(hidden_size), INT_FIELD(num_layers),
    INT_FIELD(num_heads),    INT_FIELD(num_kv_heads), INT_FIELD(ffn_size),
    INT_FIELD(max_seq_len),  INT_FIELD(tie_embeddings), INT_FIELD(precision),
};
#define INT_FIELD_COUNT (sizeof int_fields / sizeof int_fields[0])

/* The llama3 scaling's float fields, written after rope_scaling. */
#define FLOAT_FIELD(f) {#f, offsetof(llmt_model_config, f)}
static const int_field scaling_floats[] = {
    FLOAT_FIELD(rope_factor), FLOAT_FIELD(rope_low_freq_factor), FLOAT_FIELD(rope_high_freq_factor),
};
#define SCALING_FLOAT_COUNT (sizeof scaling_floats / sizeof scaling_floats[0])
/* Members of the object besides the integer fields: eps and theta, and with
 * llama3 scaling its name, three floats and rope_original_max_len. */
#define BASE_EXTRA 2
#define SCALING_EXTRA (2 + SCALING_FLOAT_COUNT)

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
    llmt_jw_keyz(w, "rms_norm_eps");
    llmt_jw_double(w, cfg->rms_norm_eps);
    llmt_jw_keyz(w, "rope_theta");
    llmt_jw_double(w, cfg->rope_theta);
    /* Written only when set, so configurations without scaling keep the
     * version 1 text that older readers accept. */
    if (cfg->rope_scaling == LLMT_ROPE_SCALING_LLAMA3) {
        llmt_jw_keyz(w, "rope_scaling");
        llmt_jw_string(w, "llama3", strlen("llama3"));
        for (size_t i = 0; i < SCALING_FLOAT_COUNT; i++) {
            llmt_jw_key(w, scaling_floats[i].name, strlen(scaling_floats[i].name));
            llmt_jw_double(w, *(const float *)((const char *)cfg + scaling_floats[i].offset));
        }
        llmt_jw_keyz(w, "rope_original_max_len");
        llmt_jw_int64(w, cfg->rope_original_max_len);
    }
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
    size_t expected = INT_FIELD_COUNT + BASE_EXTRA;
    const llmt_json *scaling = llmt_json_get(obj, "rope_scaling");
    if (!rc && scaling) {
        const char *name = llmt_json_string(scaling, NULL);
        if (!name || strcmp(name, "llama3") != 0)
            return llmt_fail(LLMT_ECORRUPT, "model config: \"rope_scaling\" is not \"llama3\"");
        cfg->rope_scaling = LLMT_ROPE_SCALING_LLAMA3;
        for (size_t i = 0; i < SCALING_FLOAT_COUNT && !rc; i++)
            rc = read_float(obj, scaling_floats[i].name,
                            (float *)((char *)cfg + scaling_floats[i].offset));
        int64_t v = 0;
        const llmt_json *f = llmt_json_get(obj, "rope_original_max_len");
        if (!rc && (!f || llmt_json_int64(f, &v) || v < 0 || v > INT32_MAX))
            rc = llmt_fail(LLMT_ECORRUPT, "model config: \"rope_original_max_len\" missing or "
                           "not a 32-bit integer");
        cfg->rope_original_max_len = (int32_t)v;
        expected += SCALING_EXTRA;
    }
    if (!rc && llmt_json_len(obj) != expected)
        rc = llmt_fail(LLMT_ECORRUPT, "model config: %zu fields, expected %zu", llmt_json_len(obj),
                       expected);
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
    if (a->rope_scaling != b->rope_scaling) {
        snprintf(va, cap, "%d", a->rope_scaling);
        snprintf(vb, cap, "%d", b->rope_scaling);
        return "rope_scaling";
    }
    if (a->rope_scaling == LLMT_ROPE_SCALING_NONE)
        return NULL;
    for (size_t i = 0; i < SCALING_FLOAT_COUNT; i++) {
        float fa = *(const float *)((const char *)a + scaling_floats[i].offset);
        float fb = *(const float *)((const char *)b + scaling_floats[i].offset);
        if (fa != fb) {
            snprintf(va, cap, "%.9g", (double)fa);
            snprintf(vb, cap, "%.9g", (double)fb);
            return scaling_floats[i].name;
        }
    }
    if (a->rope_original_max_len != b->rope_original_max_len) {
        snprintf(va, cap, "%d", a->rope_original_max_len);
        snprintf(vb, cap, "%d", b->rope_original_max_len);
        return "rope_original_max_len";
    }
    return NULL;
}
