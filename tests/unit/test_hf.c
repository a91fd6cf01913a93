/* Hugging Face directories: export (config.json checked against a
 * dictionary written here, single and sharded weights, the index decoded
 * here, tokenizer files), import (byte-identical round trips, config.json's
 * rms_norm_eps and rope_theta honoured, llama3 scaling, inv_freq skipped with
 * a note) and refusals naming the file and key or tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_tensors.h"
#include "ckpt/safetensors.h"
#include "util/fsutil.h"
#include "util/json.h"

static char root[64];
static char out_dir[128];

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/llmt-hf-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    snprintf(out_dir, sizeof out_dir, "%s/export", root);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return llmt_remove_tree(root);
}

static llmt_model_config small_config(int precision, int tied)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_size = 24;
    c.max_seq_len = 12;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 500000.0f;
    c.tie_embeddings = tied;
    c.precision = precision;
    return c;
}

static llmt_model *make_model(llmt_context *ctx, const llmt_model_config *c)
{
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, c), LLMT_OK);
    test_randomize_params(m, 7, 0.3);
    return m;
}

/* dir/name in one of four rotating buffers (dir must not be one of them). */
static char *path_in(const char *dir, const char *name)
{
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* The two models' weights are the same bytes (as fp32 copies, exact). */
static void assert_same_weights(llmt_model *a, llmt_model *b)
{
    assert_int_equal(llmt_model_num_params(a), llmt_model_num_params(b));
    float *wa = test_all_params(a), *wb = test_all_params(b);
    assert_memory_equal(wa, wb, (size_t)llmt_model_num_params(a) * sizeof(float));
    free(wa);
    free(wb);
}

static llmt_json *parse_file(const char *p)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(llmt_read_file(p, 1 << 20, &text, &len), LLMT_OK);
    const llmt_json_limits lim = {16, len, 4096, 100000};
    llmt_json *j = NULL;
    assert_int_equal(llmt_json_parse(text, len, &lim, &j), LLMT_OK);
    free(text);
    return j;
}

/* A config.json value as text: numbers as written, strings quoted. */
static void value_text(const llmt_json *v, char *buf, size_t cap)
{
    switch (llmt_json_type(v)) {
    case LLMT_JSON_NULL: snprintf(buf, cap, "null"); break;
    case LLMT_JSON_BOOL: {
        bool b = false;
        llmt_json_bool(v, &b);
        snprintf(buf, cap, "%s", b ? "true" : "false");
        break;
    }
    case LLMT_JSON_NUMBER: snprintf(buf, cap, "%s", llmt_json_number_text(v, NULL)); break;
    case LLMT_JSON_STRING: snprintf(buf, cap, "\"%s\"", llmt_json_string(v, NULL)); break;
    case LLMT_JSON_ARRAY:
        snprintf(buf, cap, "[\"%s\"]", llmt_json_string(llmt_json_at(v, 0), NULL));
        break;
    default: snprintf(buf, cap, "{%zu members}", llmt_json_len(v));
    }
}

typedef struct kv {
    const char *key, *value;
} kv;

static void assert_json_object(const llmt_json *obj, const kv *want, size_t n)
{
    assert_int_equal(llmt_json_len(obj), n);
    for (size_t i = 0; i < n; i++) {
        const llmt_json *v = llmt_json_get(obj, want[i].key);
        if (!v)
            fail_msg("config.json lacks \"%s\"", want[i].key);
        char got[256];
        value_text(v, got, sizeof got);
        if (strcmp(got, want[i].value) != 0)
            fail_msg("config.json \"%s\" = %s, expected %s", want[i].key, got, want[i].value);
    }
}

static void test_config_json_keys(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(LLMT_PRECISION_FP32, 0);
    llmt_model *m = make_model(ctx, &c);
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    o.bos_token_id = 1;
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_OK);
    llmt_json *j = parse_file(path_in(out_dir, "config.json"));
    /* What LlamaConfig (transformers 4.x and 5.x) reads, written by hand. */
    static const kv want[] = {
        {"architectures", "[\"LlamaForCausalLM\"]"}, {"model_type", "\"llama\""},
        {"vocab_size", "40"}, {"hidden_size", "16"}, {"intermediate_size", "24"},
        {"num_hidden_layers", "2"}, {"num_attention_heads", "4"}, {"num_key_value_heads", "2"},
        {"head_dim", "4"}, {"max_position_embeddings", "12"}, {"rms_norm_eps", "1e-06"},
        {"rope_theta", "500000"}, {"rope_scaling", "null"}, {"tie_word_embeddings", "false"},
        {"hidden_act", "\"silu\""}, {"attention_bias", "false"}, {"mlp_bias", "false"},
        {"attention_dropout", "0"}, {"initializer_range", "0.02"}, {"pretraining_tp", "1"},
        {"use_cache", "true"}, {"bos_token_id", "1"}, {"eos_token_id", "null"},
        {"torch_dtype", "\"bfloat16\""},
    };
    assert_json_object(j, want, sizeof want / sizeof *want);
    llmt_json_free(j);
    /* One file, no index, and no temporary directory left beside it. */
    assert_true(exists(path_in(out_dir, "model.safetensors")));
    assert_false(exists(path_in(out_dir, "model.safetensors.index.json")));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 1", root);
    assert_int_equal(system(cmd), 0);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Export then import: the same weights, bit for bit, and the same config;
 * want_shards files (1: model.safetensors and no index). */
static void round_trip(int precision, int tied, int dtype, uint64_t shard_bytes,
                       int32_t want_shards)
{
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(precision, tied);
    llmt_model *m = make_model(ctx, &c);
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    o.dtype = dtype;
    o.max_shard_bytes = shard_bytes;
    llmt_remove_tree(out_dir);
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_OK);
    if (want_shards > 1) {
        llmt_json *idx = parse_file(path_in(out_dir, "model.safetensors.index.json"));
        const llmt_json *map = llmt_json_get(idx, "weight_map");
        assert_int_equal(llmt_json_len(map), llmt_model_num_tensors(m));
        uint64_t total = 0, sum = 0;
        assert_int_equal(llmt_json_uint64(llmt_json_get(llmt_json_get(idx, "metadata"),
                                                        "total_size"), &total), LLMT_OK);
        /* Every tensor is in the shard the index names, with its bytes counted. */
        for (size_t i = 0; i < llmt_json_len(map); i++) {
            const char *name = NULL;
            const char *file = llmt_json_string(llmt_json_member(map, i, &name, NULL), NULL);
            llmt_st_file *f = NULL;
            assert_int_equal(llmt_st_open(path_in(out_dir, file), NULL, &f), LLMT_OK);
            size_t k = 0;
            assert_int_equal(llmt_st_find(f, name, &k), LLMT_OK);
            assert_string_equal(llmt_st_meta_get(f, "format"), "pt");
            sum += llmt_st_tensor_at(f, k)->end - llmt_st_tensor_at(f, k)->begin;
            llmt_st_close(f);
        }
        assert_int_equal(sum, total);
        llmt_json_free(idx);
        char last[64];
        snprintf(last, sizeof last, "model-%05d-of-%05d.safetensors", want_shards, want_shards);
        assert_true(exists(path_in(out_dir, last)));
        assert_false(exists(path_in(out_dir, "model.safetensors")));
    }
    llmt_model *b = NULL;
    char notes[256];
    assert_int_equal(llmt_model_create_from_hf(&b, ctx, out_dir, precision, notes, sizeof notes),
                     LLMT_OK);
    assert_string_equal(notes, "");
    assert_same_weights(m, b);
    llmt_model_config cb;
    assert_int_equal(llmt_model_get_config(b, &cb), LLMT_OK);
    assert_memory_equal(&c, &cb, sizeof c);
    llmt_model_free(b);
    /* llmt_model_create_from_file takes the directory too. */
    assert_int_equal(llmt_model_create_from_file(&b, ctx, out_dir, precision), LLMT_OK);
    assert_same_weights(m, b);
    llmt_model_free(b);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_round_trips(void **state)
{
    (void)state;
    round_trip(LLMT_PRECISION_FP32, 0, LLMT_DTYPE_F32, 0, 1);
    /* F32 bytes: embedding and LM head 2560, q and o 1024, k and v 512,
     * gate, up and down 1536, norms 64. Under 3000 a shard, in table order:
     * [embed ln1] [q k v] [o ln2 gate] [up] [down ln1 q] [k v o ln2] [gate]
     * [up] [down norm] [lm_head]. */
    round_trip(LLMT_PRECISION_FP32, 0, LLMT_DTYPE_F32, 3000, 10);
    /* BF16 halves every size; tied, there is no LM head. */
    round_trip(LLMT_PRECISION_BF16_MIXED, 1, LLMT_DTYPE_BF16, 1500, 9);
    round_trip(LLMT_PRECISION_FP16_MIXED, 0, LLMT_DTYPE_F16, 0, 1);
}

static void edit_config(const char *from, const char *to);

static void test_config_honoured(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(LLMT_PRECISION_FP32, 0);
    llmt_model *m = make_model(ctx, &c);
    assert_int_equal(llmt_model_export_hf(m, out_dir, NULL), LLMT_OK);
    /* Precision as saved: BF16 weights give bf16_mixed. */
    llmt_model *b = NULL;
    assert_int_equal(llmt_model_create_from_hf(&b, ctx, out_dir, LLMT_PRECISION_AS_SAVED, NULL, 0),
                     LLMT_OK);
    llmt_model_config cb;
    llmt_model_get_config(b, &cb);
    assert_int_equal(cb.precision, LLMT_PRECISION_BF16_MIXED);
    assert_true(cb.rms_norm_eps == 1e-6f);
    assert_true(cb.rope_theta == 500000.0f);
    llmt_model_free(b);
    /* Without rms_norm_eps, rope_theta, max_position_embeddings and
     * tie_word_embeddings, LlamaConfig's defaults: 1e-6, 10000, 2048, false. */
    const char *minimal = "{\"model_type\": \"llama\", \"vocab_size\": 40, \"hidden_size\": 16,"
                          "\"intermediate_size\": 24, \"num_hidden_layers\": 2,"
                          "\"num_attention_heads\": 4, \"num_key_value_heads\": 2}";
    assert_int_equal(unlink(path_in(out_dir, "config.json")), 0);
    assert_int_equal(llmt_write_file(path_in(out_dir, "config.json"), minimal, strlen(minimal), 0,
                                     NULL), LLMT_OK);
    assert_int_equal(llmt_model_create_from_hf(&b, ctx, out_dir, 0, NULL, 0), LLMT_OK);
    llmt_model_get_config(b, &cb);
    assert_true(cb.rms_norm_eps == 1e-6f);
    assert_true(cb.rope_theta == 10000.0f);
    assert_int_equal(cb.max_seq_len, 2048);
    assert_int_equal(cb.tie_embeddings, 0);
    assert_int_equal(cb.precision, LLMT_PRECISION_FP32);
    llmt_model_free(b);
    /* Without num_key_value_heads, as many as the heads: k_proj's shape differs. */
    edit_config(", \"num_key_value_heads\": 2", "");
    assert_int_equal(llmt_model_create_from_hf(&b, ctx, out_dir, 0, NULL, 0), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "model.safetensors: tensor "
                    "\"model.layers.0.self_attn.k_proj.weight\" has shape [8, 16], config.json "
                    "implies [16, 16]");
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_llama3_scaling(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(LLMT_PRECISION_FP32, 0);
    c.rope_scaling = LLMT_ROPE_SCALING_LLAMA3;
    c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_original_max_len = 8;
    llmt_model *m = make_model(ctx, &c);
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    o.dtype = LLMT_DTYPE_F32;
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_OK);
    llmt_json *j = parse_file(path_in(out_dir, "config.json"));
    static const kv want[] = {
        {"rope_type", "\"llama3\""}, {"factor", "8"}, {"low_freq_factor", "1"},
        {"high_freq_factor", "4"}, {"original_max_position_embeddings", "8"},
    };
    assert_json_object(llmt_json_get(j, "rope_scaling"), want, sizeof want / sizeof *want);
    llmt_json_free(j);
    llmt_model *b = NULL;
    assert_int_equal(llmt_model_create_from_hf(&b, ctx, out_dir, -1, NULL, 0), LLMT_OK);
    llmt_model_config cb;
    llmt_model_get_config(b, &cb);
    assert_memory_equal(&c, &cb, sizeof c);
    /* The scaling changes the logits (positions past 1 rotate differently)
     * and the imported model computes the same ones. */
    llmt_model_config plain = c;
    plain.rope_scaling = LLMT_ROPE_SCALING_NONE;
    llmt_model *p = make_model(ctx, &plain);
    int32_t tokens[12];
    for (int i = 0; i < 12; i++)
        tokens[i] = (i * 7 + 3) % 40;
    float la[12 * 40], lb[12 * 40], lp[12 * 40];
    assert_int_equal(llmt_model_logits(m, tokens, 1, 12, la, 480), LLMT_OK);
    assert_int_equal(llmt_model_logits(b, tokens, 1, 12, lb, 480), LLMT_OK);
    assert_int_equal(llmt_model_logits(p, tokens, 1, 12, lp, 480), LLMT_OK);
    assert_memory_equal(la, lb, sizeof la);
    assert_memory_equal(la, lp, 40 * sizeof(float)); /* position 0 does not rotate */
    assert_memory_not_equal(la + 440, lp + 440, 40 * sizeof(float));
    llmt_model_free(p);
    llmt_model_free(b);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* The version 1 struct, allocated at its own size (ASan sees any read past it). */
static void test_config_version_1(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(LLMT_PRECISION_FP32, 0);
    size_t v1 = offsetof(llmt_model_config, rope_scaling);
    c.version = 1;
    void *old = malloc(v1);
    memcpy(old, &c, v1);
    c.version = LLMT_MODEL_CONFIG_VERSION;
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, old), LLMT_OK);
    llmt_model_config got;
    llmt_model_get_config(m, &got);
    assert_int_equal(got.version, LLMT_MODEL_CONFIG_VERSION);
    assert_int_equal(got.rope_scaling, LLMT_ROPE_SCALING_NONE);
    assert_int_equal(got.hidden_size, 16);
    free(old);
    llmt_model_free(m);
    c.rope_scaling = LLMT_ROPE_SCALING_LLAMA3;
    c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 4.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_original_max_len = 8;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "rope_high_freq_factor = 4");
    llmt_context_free(ctx);
}

/* The YAML model keys of the llama3 scaling reach the model configuration
 * and are written back. */
static void test_yaml_keys(void **state)
{
    (void)state;
    llmt_train_config t;
    llmt_train_config_init(&t);
    const char *yaml = "model:\n  rope_scaling: llama3\n  rope_factor: 8\n"
                       "  rope_low_freq_factor: 1\n  rope_high_freq_factor: 4\n"
                       "  rope_original_max_len: 8192\n";
    assert_int_equal(llmt_train_config_parse_yaml(&t, yaml, strlen(yaml), "t.yaml"), LLMT_OK);
    assert_int_equal(t.model.rope_scaling, LLMT_ROPE_SCALING_LLAMA3);
    assert_true(t.model.rope_factor == 8.0f && t.model.rope_high_freq_factor == 4.0f);
    assert_int_equal(t.model.rope_original_max_len, 8192);
    char out[8192];
    assert_int_equal(llmt_train_config_to_yaml(&t, out, sizeof out, NULL), LLMT_OK);
    assert_contains(out, "  rope_scaling: llama3\n  rope_factor: 8\n");
    assert_contains(out, "  rope_original_max_len: 8192\n");
    assert_int_equal(llmt_train_config_set(&t, "model.rope_high_freq_factor", "0.5"), LLMT_OK);
    assert_int_equal(llmt_train_config_check(&t), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "rope_high_freq_factor = 0.5");
}

/* Rewrites a safetensors file with one tensor dropped (drop) or one F32
 * tensor of 2 elements added (add). */
static void rewrite(const char *p, const char *drop, const char *add)
{
    llmt_st_file *f = NULL;
    assert_int_equal(llmt_st_open(p, NULL, &f), LLMT_OK);
    size_t n = llmt_st_count(f), k = 0;
    llmt_st_write_tensor *t = calloc(n + 1, sizeof *t);
    void **data = calloc(n, sizeof *data);
    static const float extra[2] = {1.0f, 0.5f};
    for (size_t i = 0; i < n; i++) {
        const llmt_st_tensor *s = llmt_st_tensor_at(f, i);
        data[i] = malloc(s->end - s->begin + 1);
        assert_int_equal(llmt_st_read(f, i, 0, data[i], s->end - s->begin), LLMT_OK);
        if (drop && strcmp(s->name, drop) == 0)
            continue;
        t[k] = (llmt_st_write_tensor){.name = s->name, .dtype = s->dtype, .ndim = s->ndim,
                                      .data = data[i]};
        memcpy(t[k++].shape, s->shape, sizeof s->shape);
    }
    if (add)
        t[k++] = (llmt_st_write_tensor){.name = add, .dtype = LLMT_DTYPE_F32, .ndim = 1,
                                        .shape = {2}, .data = extra};
    const llmt_st_meta meta[1] = {{"format", "pt"}};
    assert_int_equal(llmt_st_write(p, t, k, meta, 1, NULL, NULL), LLMT_OK);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
    free(data);
    free(t);
    llmt_st_close(f);
}

static void edit_config(const char *from, const char *to)
{
    char *p = path_in(out_dir, "config.json"), *text = NULL;
    size_t len = 0;
    assert_int_equal(llmt_read_file(p, 1 << 20, &text, &len), LLMT_OK);
    char *at = strstr(text, from);
    assert_non_null(at);
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    free(text);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(llmt_write_file(p, buf, strlen(buf), 0, NULL), LLMT_OK);
}

/* Imports out_dir expecting status rc and a message holding both texts. */
static void refused(llmt_context *ctx, int rc, const char *a, const char *b)
{
    llmt_model *m = (llmt_model *)1;
    assert_int_equal(llmt_model_create_from_hf(&m, ctx, out_dir, -1, NULL, 0), rc);
    assert_null(m);
    assert_contains(llmt_error_last(), a);
    assert_contains(llmt_error_last(), b);
}

static void export_fresh(llmt_model *m, uint64_t shard_bytes)
{
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    o.dtype = LLMT_DTYPE_F32; /* 10 shards under 3000 bytes, as in test_round_trips */
    o.max_shard_bytes = shard_bytes;
    llmt_remove_tree(out_dir);
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_OK);
}

static void test_import_refusals(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(LLMT_PRECISION_FP32, 0);
    llmt_model *m = make_model(ctx, &c);
    export_fresh(m, 0);
    edit_config("LlamaForCausalLM", "MistralForCausalLM");
    refused(ctx, LLMT_EUNSUPPORTED, "config.json: key \"architectures\"", "MistralForCausalLM");
    export_fresh(m, 0);
    edit_config("\"model_type\":\"llama\"", "\"model_type\":\"qwen2\"");
    refused(ctx, LLMT_EUNSUPPORTED, "config.json: key \"model_type\"", "qwen2");
    export_fresh(m, 0);
    edit_config("\"rope_scaling\":null", "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}");
    refused(ctx, LLMT_EUNSUPPORTED, "config.json: key \"rope_scaling\"",
            "\"yarn\" is not implemented");
    export_fresh(m, 0);
    edit_config("\"rope_scaling\":null", "\"rope_scaling\":{\"type\":\"llama3\",\"factor\":4}");
    refused(ctx, LLMT_ECORRUPT, "config.json: rope_scaling: key \"low_freq_factor\"", "missing");
    export_fresh(m, 0);
    edit_config("\"attention_bias\":false", "\"attention_bias\":true");
    refused(ctx, LLMT_EUNSUPPORTED, "config.json: key \"attention_bias\"", "not supported");
    export_fresh(m, 0);
    edit_config("\"hidden_act\":\"silu\"", "\"hidden_act\":\"gelu\"");
    refused(ctx, LLMT_EUNSUPPORTED, "config.json: key \"hidden_act\"", "gelu");
    export_fresh(m, 0);
    edit_config("\"hidden_size\":16", "\"hidden_size\":16.5");
    refused(ctx, LLMT_ECORRUPT, "config.json: key \"hidden_size\"", "integer");
    export_fresh(m, 0);
    rewrite(path_in(out_dir, "model.safetensors"), "model.layers.1.mlp.up_proj.weight", NULL);
    refused(ctx, LLMT_EINVAL, "tensor \"model.layers.1.mlp.up_proj.weight\" is missing", out_dir);
    export_fresh(m, 0);
    rewrite(path_in(out_dir, "model.safetensors"), NULL, "model.layers.0.extra");
    refused(ctx, LLMT_EINVAL, "model.safetensors: tensor \"model.layers.0.extra\"",
            "not a parameter");
    /* Sharded: a truncated shard, and an index naming a file that is gone. */
    export_fresh(m, 3000);
    char *shard = path_in(out_dir, "model-00002-of-00010.safetensors");
    struct stat st;
    assert_int_equal(stat(shard, &st), 0);
    assert_int_equal(truncate(shard, st.st_size - 8), 0);
    refused(ctx, LLMT_ECORRUPT, "model-00002-of-00010.safetensors", "model.safetensors.index.json");
    export_fresh(m, 3000);
    assert_int_equal(unlink(path_in(out_dir, "model-00003-of-00010.safetensors")), 0);
    refused(ctx, LLMT_EIO, "model-00003-of-00010.safetensors: cannot open",
            "model.safetensors.index.json names it");
    export_fresh(m, 3000);
    assert_int_equal(unlink(path_in(out_dir, "model.safetensors.index.json")), 0);
    refused(ctx, LLMT_EIO, "holds neither model.safetensors nor", out_dir);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* rotary_emb.inv_freq tensors are skipped, each with a note. */
static void test_inv_freq_noted(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(LLMT_PRECISION_FP32, 0);
    llmt_model *m = make_model(ctx, &c);
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    o.dtype = LLMT_DTYPE_F32;
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_OK);
    rewrite(path_in(out_dir, "model.safetensors"), NULL,
            "model.layers.1.self_attn.rotary_emb.inv_freq");
    llmt_model *b = NULL;
    char notes[512];
    assert_int_equal(llmt_model_create_from_hf(&b, ctx, out_dir, -1, notes, sizeof notes), LLMT_OK);
    assert_string_equal(notes, "ignored tensor \"model.layers.1.self_attn.rotary_emb.inv_freq\" "
                               "in model.safetensors: RoPE frequencies are computed from "
                               "config.json\n");
    assert_same_weights(m, b);
    llmt_model_free(b);
    /* A buffer too small is cut, still terminated. */
    assert_int_equal(llmt_model_create_from_hf(&b, ctx, out_dir, -1, notes, 10), LLMT_OK);
    assert_string_equal(notes, "ignored t");
    llmt_model_free(b);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_export_refusals_and_tokenizer(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = small_config(LLMT_PRECISION_FP32, 0);
    llmt_model *m = make_model(ctx, &c);
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    o.version = 2;
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_EVERSION);
    o = (llmt_hf_export_options)LLMT_HF_EXPORT_OPTIONS_INIT;
    o.dtype = LLMT_DTYPE_I32;
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "opts->dtype");
    /* A tokenizer directory without tokenizer files: refused, nothing left. */
    o = (llmt_hf_export_options)LLMT_HF_EXPORT_OPTIONS_INIT;
    o.tokenizer_dir = root;
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tokenizer_dir holds none");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 0", root);
    assert_int_equal(system(cmd), 0);
    /* With tokenizer files: copied byte for byte (into an empty directory). */
    char tok[128];
    snprintf(tok, sizeof tok, "%s/tok", root);
    assert_int_equal(llmt_mkdirs(tok), LLMT_OK);
    const char *tj = "{\"version\": \"1.0\"}", *tc = "{\"bos_token\": \"<s>\"}";
    assert_int_equal(llmt_write_file(path_in(tok, "tokenizer.json"), tj, strlen(tj), 0, NULL), 0);
    assert_int_equal(llmt_write_file(path_in(tok, "tokenizer_config.json"), tc, strlen(tc), 0,
                                     NULL), 0);
    assert_int_equal(llmt_mkdirs(out_dir), LLMT_OK);
    o.tokenizer_dir = tok;
    assert_int_equal(llmt_model_export_hf(m, out_dir, &o), LLMT_OK);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(llmt_read_file(path_in(out_dir, "tokenizer.json"), 1024, &text, &len), 0);
    assert_string_equal(text, tj);
    free(text);
    assert_int_equal(llmt_read_file(path_in(out_dir, "tokenizer_config.json"), 1024, &text, &len),
                     0);
    assert_string_equal(text, tc);
    free(text);
    assert_false(exists(path_in(out_dir, "tokenizer.model")));
    /* An existing export is not overwritten. */
    assert_int_equal(llmt_model_export_hf(m, out_dir, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "exists and is not empty");
    assert_true(exists(path_in(out_dir, "tokenizer.json")));
    llmt_model_free(m);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_config_json_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_honoured, setup, teardown),
        cmocka_unit_test_setup_teardown(test_llama3_scaling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_version_1, setup, teardown),
        cmocka_unit_test(test_yaml_keys),
        cmocka_unit_test_setup_teardown(test_import_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inv_freq_noted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_refusals_and_tokenizer, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
