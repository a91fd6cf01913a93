/* config.json of a Hugging Face LLaMA directory <-> llmt_model_config.
 * Absent optional keys take LlamaConfig's defaults (transformers 4.x and
 * 5.x), which is what from_pretrained would use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "model/hf_internal.h"
#include "util/fsutil.h"
#include "util/json.h"

/* A real config.json is a few kilobytes. */
#define CONFIG_MAX_BYTES ((size_t)1 << 20)

/* What a key of config.json is read for: the file's path for messages. */
typedef struct reader {
    const char *path;
    const llmt_json *root;
} reader;

/* Integer key into *out in [lo, hi]; an absent (or null) key leaves *out
 * unless required. */
static int read_int(const reader *r, const llmt_json *obj, const char *key, int required,
                    int64_t lo, int64_t hi, int32_t *out)
{
    const llmt_json *v = llmt_json_get(obj, key);
    if (!v || llmt_json_type(v) == LLMT_JSON_NULL)
        return required ? llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" is missing", r->path, key)
                        : LLMT_OK;
    int64_t x = 0;
    if (llmt_json_int64(v, &x) || x < lo || x > hi)
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" must be an integer in %lld..%lld",
                         r->path, key, (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return LLMT_OK;
}

/* Positive finite number key into *out; absent or null leaves *out. */
static int read_float(const reader *r, const llmt_json *obj, const char *key, int required,
                      float *out)
{
    const llmt_json *v = llmt_json_get(obj, key);
    if (!v || llmt_json_type(v) == LLMT_JSON_NULL)
        return required ? llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" is missing", r->path, key)
                        : LLMT_OK;
    double x = 0;
    if (llmt_json_double(v, &x) || !(x > 0) || !isfinite((float)x))
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" must be a positive number", r->path, key);
    *out = (float)x;
    return LLMT_OK;
}

/* A boolean key that this library supports only with the value `want`. */
static int require_bool(const reader *r, const char *key, bool want)
{
    const llmt_json *v = llmt_json_get(r->root, key);
    bool b = want;
    if (!v || llmt_json_type(v) == LLMT_JSON_NULL)
        return LLMT_OK;
    if (llmt_json_bool(v, &b))
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" must be true or false", r->path, key);
    if (b != want)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: key \"%s\" = %s is not supported (only %s)",
                         r->path, key, b ? "true" : "false", want ? "true" : "false");
    return LLMT_OK;
}

/* A string key that must be `want` when present (required: must be present). */
static int require_string(const reader *r, const char *key, const char *want, int required)
{
    const llmt_json *v = llmt_json_get(r->root, key);
    if (!v)
        return required ? llmt_fail(LLMT_EUNSUPPORTED, "%s: key \"%s\" is missing (must be "
                                    "\"%s\")", r->path, key, want) : LLMT_OK;
    const char *s = llmt_json_string(v, NULL);
    char q[LLMT_JSON_QUOTE_CAP];
    if (!s)
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" is not a string", r->path, key);
    if (strcmp(s, want) != 0)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: key \"%s\" = %s is not supported (only \"%s\")",
                         r->path, key, llmt_json_quote(q, sizeof q, s, strlen(s)), want);
    return LLMT_OK;
}

/* "architectures" must be ["LlamaForCausalLM"] when present. */
static int check_architectures(const reader *r)
{
    const llmt_json *v = llmt_json_get(r->root, "architectures");
    if (!v || llmt_json_type(v) == LLMT_JSON_NULL)
        return LLMT_OK;
    const char *s = llmt_json_string(llmt_json_at(v, 0), NULL);
    char q[LLMT_JSON_QUOTE_CAP];
    if (llmt_json_type(v) != LLMT_JSON_ARRAY || llmt_json_len(v) != 1 || !s)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: key \"architectures\" must be "
                         "[\"LlamaForCausalLM\"]", r->path);
    if (strcmp(s, "LlamaForCausalLM") != 0)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: key \"architectures\" = [%s] is not supported "
                         "(only \"LlamaForCausalLM\")", r->path,
                         llmt_json_quote(q, sizeof q, s, strlen(s)));
    return LLMT_OK;
}

/* The RoPE settings: transformers 4.x writes "rope_theta" and "rope_scaling"
 * (null or {"rope_type" or "type", ...}); 5.x writes "rope_parameters"
 * {"rope_type", "rope_theta", ...}. "default" and "llama3" are implemented. */
static int read_rope(const reader *r, llmt_model_config *cfg)
{
    const char *key = "rope_parameters";
    const llmt_json *p = llmt_json_get(r->root, key);
    if (!p || llmt_json_type(p) == LLMT_JSON_NULL) {
        key = "rope_scaling";
        p = llmt_json_get(r->root, key);
    }
    LLMT_TRY(read_float(r, r->root, "rope_theta", 0, &cfg->rope_theta));
    if (!p || llmt_json_type(p) == LLMT_JSON_NULL)
        return LLMT_OK;
    if (llmt_json_type(p) != LLMT_JSON_OBJECT)
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" is not an object", r->path, key);
    LLMT_TRY(read_float(r, p, "rope_theta", 0, &cfg->rope_theta));
    const llmt_json *t = llmt_json_get(p, "rope_type");
    if (!t)
        t = llmt_json_get(p, "type");
    const char *type = llmt_json_string(t, NULL);
    if (!type)
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"%s\" has no string \"rope_type\"", r->path, key);
    if (strcmp(type, "default") == 0)
        return LLMT_OK;
    char q[LLMT_JSON_QUOTE_CAP];
    if (strcmp(type, "llama3") != 0)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: key \"%s\": rope_type %s is not implemented "
                         "(only \"default\" and \"llama3\")", r->path, key,
                         llmt_json_quote(q, sizeof q, type, strlen(type)));
    char k[4200];
    const reader sub = {k, r->root};
    snprintf(k, sizeof k, "%s: %s", r->path, key);
    cfg->rope_scaling = LLMT_ROPE_SCALING_LLAMA3;
    LLMT_TRY(read_float(&sub, p, "factor", 1, &cfg->rope_factor));
    LLMT_TRY(read_float(&sub, p, "low_freq_factor", 1, &cfg->rope_low_freq_factor));
    LLMT_TRY(read_float(&sub, p, "high_freq_factor", 1, &cfg->rope_high_freq_factor));
    return read_int(&sub, p, "original_max_position_embeddings", 1, 1, INT32_MAX,
                    &cfg->rope_original_max_len);
}

/* Every key this library reads or refuses; the rest of config.json
 * (initializer_range, use_cache, token ids, torch_dtype, ...) does not change
 * the forward pass. */
static int read_config(const reader *r, llmt_model_config *cfg)
{
    if (llmt_json_type(r->root) != LLMT_JSON_OBJECT)
        return llmt_fail(LLMT_ECORRUPT, "%s: not a JSON object", r->path);
    if (!llmt_json_get(r->root, "model_type") && !llmt_json_get(r->root, "architectures"))
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: neither \"model_type\" nor \"architectures\" "
                         "says this is a LLaMA model", r->path);
    LLMT_TRY(require_string(r, "model_type", "llama", 0));
    LLMT_TRY(check_architectures(r));
    LLMT_TRY(require_string(r, "hidden_act", "silu", 0));
    LLMT_TRY(require_bool(r, "attention_bias", false));
    LLMT_TRY(require_bool(r, "mlp_bias", false));
    llmt_model_config_init(cfg);
    const llmt_json *root = r->root;
    LLMT_TRY(read_int(r, root, "vocab_size", 1, 1, INT32_MAX, &cfg->vocab_size));
    LLMT_TRY(read_int(r, root, "hidden_size", 1, 1, INT32_MAX, &cfg->hidden_size));
    LLMT_TRY(read_int(r, root, "intermediate_size", 1, 1, INT32_MAX, &cfg->ffn_size));
    LLMT_TRY(read_int(r, root, "num_hidden_layers", 1, 1, INT32_MAX, &cfg->num_layers));
    LLMT_TRY(read_int(r, root, "num_attention_heads", 1, 1, INT32_MAX, &cfg->num_heads));
    cfg->num_kv_heads = cfg->num_heads;
    LLMT_TRY(read_int(r, root, "num_key_value_heads", 0, 1, INT32_MAX, &cfg->num_kv_heads));
    cfg->max_seq_len = 2048;
    LLMT_TRY(read_int(r, root, "max_position_embeddings", 0, 1, INT32_MAX, &cfg->max_seq_len));
    cfg->rms_norm_eps = 1e-6f;
    LLMT_TRY(read_float(r, root, "rms_norm_eps", 0, &cfg->rms_norm_eps));
    cfg->rope_theta = 10000.0f;
    LLMT_TRY(read_rope(r, cfg));
    const llmt_json *tie = llmt_json_get(root, "tie_word_embeddings");
    bool tied = false;
    if (tie && llmt_json_bool(tie, &tied))
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"tie_word_embeddings\" must be true or false",
                         r->path);
    cfg->tie_embeddings = tied;
    int32_t head_dim = cfg->hidden_size / cfg->num_heads;
    LLMT_TRY(read_int(r, root, "head_dim", 0, 1, INT32_MAX, &head_dim));
    if (head_dim * cfg->num_heads != cfg->hidden_size)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: key \"head_dim\" = %d is not supported (only "
                         "hidden_size / num_attention_heads = %d / %d)", r->path, head_dim,
                         cfg->hidden_size, cfg->num_heads);
    cfg->precision = LLMT_PRECISION_FP32;
    return LLMT_OK;
}

int llmt_hf_config_read(const char *dir, llmt_model_config *cfg)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, LLMT_HF_CONFIG) >= sizeof path)
        return llmt_fail(LLMT_EINVAL, "%s: path too long", dir);
    char *text = NULL;
    size_t len = 0;
    LLMT_TRY(llmt_read_file(path, CONFIG_MAX_BYTES, &text, &len));
    const llmt_json_limits lim = {16, len, 4096, 65536};
    llmt_json *root = NULL;
    int rc = llmt_json_parse(text, len, &lim, &root);
    if (rc)
        llmt_fail_prefix(rc, "%s", path);
    const reader r = {path, root};
    if (!rc)
        rc = read_config(&r, cfg);
    llmt_json_free(root);
    free(text);
    return rc;
}

int llmt_hf_is_model_dir(const char *dir)
{
    char path[4096];
    struct stat st;
    return (size_t)snprintf(path, sizeof path, "%s/%s", dir, LLMT_HF_CONFIG) < sizeof path &&
           stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The shortest decimal that reads back as the float v, as a double, so that
 * 1e-5f is written "1e-05" rather than "9.99999974737875e-06". */
static double float_decimal(float v)
{
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    return strtod(buf, NULL);
}

static const char *dtype_torch_name(int dtype)
{
    return dtype == LLMT_DTYPE_F32 ? "float32" : dtype == LLMT_DTYPE_BF16 ? "bfloat16" : "float16";
}

static void key_int(llmt_jw *w, const char *k, int64_t v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_int64(w, v);
}

static void key_token(llmt_jw *w, const char *k, int32_t id)
{
    llmt_jw_keyz(w, k);
    if (id < 0)
        llmt_jw_null(w);
    else
        llmt_jw_int64(w, id);
}

static void key_string(llmt_jw *w, const char *k, const char *v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_string(w, v, strlen(v));
}

static void key_float(llmt_jw *w, const char *k, float v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_double(w, float_decimal(v));
}

static void key_bool(llmt_jw *w, const char *k, bool v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_bool(w, v);
}

/* rope_scaling as transformers 4.x writes it (5.x reads it too). */
static void write_rope_scaling(llmt_jw *w, const llmt_model_config *c)
{
    llmt_jw_keyz(w, "rope_scaling");
    if (c->rope_scaling != LLMT_ROPE_SCALING_LLAMA3) {
        llmt_jw_null(w);
        return;
    }
    llmt_jw_begin_object(w);
    key_string(w, "rope_type", "llama3");
    key_float(w, "factor", c->rope_factor);
    key_float(w, "low_freq_factor", c->rope_low_freq_factor);
    key_float(w, "high_freq_factor", c->rope_high_freq_factor);
    key_int(w, "original_max_position_embeddings", c->rope_original_max_len);
    llmt_jw_end_object(w);
}

int llmt_hf_config_write(const char *path, const llmt_model_config *c,
                         const llmt_hf_export_options *o)
{
    llmt_jw w;
    llmt_jw_init(&w);
    llmt_jw_begin_object(&w);
    llmt_jw_keyz(&w, "architectures");
    llmt_jw_begin_array(&w);
    llmt_jw_string(&w, "LlamaForCausalLM", strlen("LlamaForCausalLM"));
    llmt_jw_end_array(&w);
    key_string(&w, "model_type", "llama");
    key_int(&w, "vocab_size", c->vocab_size);
    key_int(&w, "hidden_size", c->hidden_size);
    key_int(&w, "intermediate_size", c->ffn_size);
    key_int(&w, "num_hidden_layers", c->num_layers);
    key_int(&w, "num_attention_heads", c->num_heads);
    key_int(&w, "num_key_value_heads", c->num_kv_heads);
    key_int(&w, "head_dim", c->hidden_size / c->num_heads);
    key_int(&w, "max_position_embeddings", c->max_seq_len);
    key_float(&w, "rms_norm_eps", c->rms_norm_eps);
    key_float(&w, "rope_theta", c->rope_theta);
    write_rope_scaling(&w, c);
    key_bool(&w, "tie_word_embeddings", c->tie_embeddings != 0);
    key_string(&w, "hidden_act", "silu");
    key_bool(&w, "attention_bias", false);
    key_bool(&w, "mlp_bias", false);
    key_float(&w, "attention_dropout", 0.0f);
    key_float(&w, "initializer_range", 0.02f);
    key_int(&w, "pretraining_tp", 1);
    key_bool(&w, "use_cache", true);
    key_token(&w, "bos_token_id", o->bos_token_id);
    key_token(&w, "eos_token_id", o->eos_token_id);
    key_string(&w, "torch_dtype", dtype_torch_name(o->dtype));
    llmt_jw_end_object(&w);
    const char *text = NULL;
    size_t len = 0;
    int rc = llmt_jw_finish(&w, &text, &len);
    if (rc)
        rc = llmt_fail_prefix(rc, "%s", path);
    else
        rc = llmt_write_file(path, text, len, 1, NULL);
    llmt_jw_free(&w);
    return rc;
}
