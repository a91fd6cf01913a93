/* The training configuration's YAML form: a schema table drives parsing
 * (libyaml's document API, so every node carries its line and column),
 * validation of types and ranges, and writing. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "core/error.h"
#include "llmt/config.h"
#include "llmt/data.h"
#include "llmt/recompute.h"
#include "llmt/slicer.h"
#include "train/config_internal.h"
#include "util/format.h"

typedef enum kind {
    K_I32,       /* integer */
    K_I64,       /* integer */
    K_U64,       /* integer >= 0 */
    K_BYTES,     /* integer, or with a unit: 512MiB, 2GiB, 1.5GB */
    K_F32,       /* number */
    K_F64,       /* number */
    K_BOOL,      /* true / false */
    K_PATH,      /* string */
    K_ENUM,      /* one of names, stored as int32 index */
    K_RECOMPUTE, /* none, or flags joined by '+' */
    K_LAYERS,    /* all (stored as -1), or an int32 count in lo..hi */
    K_OFFLOAD    /* one of offload_names, stored as its llmt_offload_part bits */
} kind;

typedef struct field {
    const char *section; /* NULL: a top-level scalar */
    const char *key;
    kind type;
    size_t offset;
    double lo, hi; /* inclusive bounds of numbers (and of integer values) */
    const char *const *names;
} field;

static const char *const precision_names[] = {"fp32", "bf16_mixed", "fp16_mixed", "bf16_pure", NULL};
static const char *const schedule_names[] = {"constant", "cosine", "linear", NULL};
static const char *const backend_names[] = {"cpu", "cuda", NULL};
static const char *const rope_scaling_names[] = {"none", "llama3", NULL};
static const char *const reduce_names[] = {"deterministic", "fast", NULL};
static const char *const accumulation_names[] = {"in_place", "ordered", NULL};
/* optimizer.offload's values and their llmt_offload_part bits. */
static const char *const offload_names[] = {"none", "optimizer", "optimizer+grads", NULL};
static const int32_t offload_bits[] = {LLMT_OFFLOAD_NONE, LLMT_OFFLOAD_OPTIMIZER,
                                       LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS};

#define OFF(f) offsetof(llmt_train_config, f)
#define BIG 1e15
static const field fields[] = {
    {"model", "vocab_size", K_I32, OFF(model.vocab_size), 2, 1 << 20, NULL},
    {"model", "hidden_size", K_I32, OFF(model.hidden_size), 2, 1 << 20, NULL},
    {"model", "num_layers", K_I32, OFF(model.num_layers), 1, 4096, NULL},
    {"model", "num_heads", K_I32, OFF(model.num_heads), 1, 1 << 20, NULL},
    {"model", "num_kv_heads", K_I32, OFF(model.num_kv_heads), 1, 1 << 20, NULL},
    {"model", "ffn_size", K_I32, OFF(model.ffn_size), 1, 1 << 20, NULL},
    {"model", "max_seq_len", K_I32, OFF(model.max_seq_len), 1, 1 << 20, NULL},
    {"model", "rms_norm_eps", K_F32, OFF(model.rms_norm_eps), 1e-12, 0.5, NULL},
    {"model", "rope_theta", K_F32, OFF(model.rope_theta), 1.0001, 1e9, NULL},
    {"model", "tie_embeddings", K_BOOL, OFF(model.tie_embeddings), 0, 1, NULL},
    /* RoPE scaling: the llama3 numbers are checked with the model (0 unused). */
    {"model", "rope_scaling", K_ENUM, OFF(model.rope_scaling), 0, 1, rope_scaling_names},
    {"model", "rope_factor", K_F32, OFF(model.rope_factor), 0, 1e6, NULL},
    {"model", "rope_low_freq_factor", K_F32, OFF(model.rope_low_freq_factor), 0, 1e6, NULL},
    {"model", "rope_high_freq_factor", K_F32, OFF(model.rope_high_freq_factor), 0, 1e6, NULL},
    {"model", "rope_original_max_len", K_I32, OFF(model.rope_original_max_len), 0, 1 << 20, NULL},
    {NULL, "precision", K_ENUM, OFF(model.precision), 0, 3, precision_names},
    {"optimizer", "lr", K_F64, OFF(optimizer.lr), 1e-12, 10, NULL},
    {"optimizer", "beta1", K_F64, OFF(optimizer.beta1), 0, 0.999999, NULL},
    {"optimizer", "beta2", K_F64, OFF(optimizer.beta2), 0, 0.999999999, NULL},
    {"optimizer", "eps", K_F64, OFF(optimizer.eps), 1e-30, 1, NULL},
    {"optimizer", "weight_decay", K_F64, OFF(optimizer.weight_decay), 0, 1, NULL},
    {"optimizer", "decay_norms", K_BOOL, OFF(optimizer.decay_norms), 0, 1, NULL},
    {"optimizer", "grad_clip", K_F64, OFF(optimizer.grad_clip), 0, 1e12, NULL},
    {"optimizer", "offload", K_OFFLOAD, OFF(optimizer.offload_parts), 0, 0, offload_names},
    {"optimizer", "offload_layers", K_LAYERS, OFF(optimizer.offload_layers), 0, 4096, NULL},
    {"schedule", "kind", K_ENUM, OFF(optimizer.schedule), 0, 2, schedule_names},
    {"schedule", "warmup_steps", K_I64, OFF(optimizer.warmup_steps), 0, BIG, NULL},
    {"schedule", "total_steps", K_I64, OFF(optimizer.total_steps), 0, BIG, NULL},
    {"schedule", "min_lr", K_F64, OFF(optimizer.min_lr), 0, 10, NULL},
    {"loss_scale", "dynamic", K_BOOL, OFF(loss_scale.dynamic), 0, 1, NULL},
    {"loss_scale", "init_scale", K_F64, OFF(loss_scale.init_scale), 1e-30, 1e30, NULL},
    {"loss_scale", "growth_factor", K_F64, OFF(loss_scale.growth_factor), 1.000001, 1e6, NULL},
    {"loss_scale", "backoff_factor", K_F64, OFF(loss_scale.backoff_factor), 1e-6, 0.999999, NULL},
    {"loss_scale", "growth_interval", K_I64, OFF(loss_scale.growth_interval), 1, BIG, NULL},
    {"loss_scale", "min_scale", K_F64, OFF(loss_scale.min_scale), 1e-30, 1e30, NULL},
    {"loss_scale", "max_scale", K_F64, OFF(loss_scale.max_scale), 1e-30, 1e30, NULL},
    {NULL, "recompute", K_RECOMPUTE, OFF(recompute), 0, LLMT_RECOMPUTE_MASK, NULL},
    {"batch", "batch_size", K_I32, OFF(batch_size), 1, 1 << 20, NULL},
    {"batch", "micro_batch", K_I32, OFF(micro_batch), 1, 1 << 20, NULL},
    {"batch", "seq_len", K_I32, OFF(seq_len), 1, 1 << 20, NULL},
    {"batch", "accumulation", K_ENUM, OFF(accumulation), 0, 1, accumulation_names},
    {"data", "train", K_PATH, OFF(train_data), 0, 0, NULL},
    {"data", "val", K_PATH, OFF(val_data), 0, 0, NULL},
    {"data", "shuffle", K_BOOL, OFF(shuffle), 0, 1, NULL},
    {"train", "steps", K_I64, OFF(steps), 0, BIG, NULL},
    {"train", "eval_every", K_I64, OFF(eval_every), 0, BIG, NULL},
    {"train", "eval_batches", K_I32, OFF(eval_batches), 1, 1 << 20, NULL},
    {"train", "log_every", K_I64, OFF(log_every), 1, BIG, NULL},
    {"train", "metrics", K_PATH, OFF(metrics), 0, 0, NULL},
    {"train", "seed", K_U64, OFF(seed), 0, 1.8e19, NULL},
    {"train", "threads", K_I32, OFF(threads), 0, 1024, NULL},
    {"train", "backend", K_ENUM, OFF(backend), 0, 1, backend_names},
    {"train", "device", K_I32, OFF(device), 0, 1024, NULL},
    {"checkpoint", "dir", K_PATH, OFF(checkpoint_dir), 0, 0, NULL},
    {"checkpoint", "every", K_I64, OFF(checkpoint_every), 0, BIG, NULL},
    {"checkpoint", "keep", K_I32, OFF(checkpoint_keep), 1, 1 << 20, NULL},
    {"checkpoint", "async", K_BOOL, OFF(checkpoint_async), 0, 1, NULL},
    {"checkpoint", "fast_dir", K_PATH, OFF(fast_checkpoint_dir), 0, 0, NULL},
    {"checkpoint", "fast_every", K_I64, OFF(fast_checkpoint_every), 0, BIG, NULL},
    {"checkpoint", "fast_keep", K_I32, OFF(fast_checkpoint_keep), 1, 1 << 20, NULL},
    {"memory", "budget", K_BYTES, OFF(memory_budget), 0, 1.8e19, NULL},
    {"memory", "host_budget", K_BYTES, OFF(memory_host_budget), 0, 1.8e19, NULL},
    {"memory", "threshold", K_F64, OFF(memory_threshold), 0.05, 1, NULL},
    {"memory", "adaptive", K_BOOL, OFF(adaptive), 0, 1, NULL},
    {"dist", "reduce", K_ENUM, OFF(dist_reduce), 0, 1, reduce_names},
};
#define FIELD_COUNT (sizeof fields / sizeof fields[0])

void llmt_train_config_init(llmt_train_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->version = LLMT_TRAIN_CONFIG_VERSION;
    llmt_model_config_init(&cfg->model);
    /* The byte tokenizer's ids (256 bytes and end-of-text), so the defaults
     * train on what llmt-tokenize and llmt-train's default corpus write. */
    cfg->model.vocab_size = LLMT_BYTE_VOCAB;
    llmt_optimizer_config_init(&cfg->optimizer);
    llmt_loss_scaler_config_init(&cfg->loss_scale);
    cfg->batch_size = 8;
    cfg->micro_batch = 8;
    cfg->seq_len = 256;
    cfg->shuffle = 1;
    cfg->steps = 1000;
    cfg->eval_batches = 4;
    cfg->log_every = 10;
    cfg->backend = LLMT_BACKEND_CPU;
    cfg->checkpoint_keep = 5;
    cfg->checkpoint_async = 1;
    cfg->fast_checkpoint_keep = 2;
    cfg->memory_threshold = 0.85;
    cfg->adaptive = 1;
}

/* ---- parsing */

typedef struct parse_ctx {
    yaml_document_t *doc;
    const char *source;
    llmt_train_config *cfg;
} parse_ctx;

static int fail_at(const parse_ctx *p, const yaml_node_t *n, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail_at(const parse_ctx *p, const yaml_node_t *n, const char *key, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return llmt_fail(LLMT_EINVAL, "%s:%zu:%zu: %s%s%s", p->source, n->start_mark.line + 1,
                     n->start_mark.column + 1, key ? key : "", key ? ": " : "", what);
}

static const char *scalar_text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* Parses a whole non-negative decimal integer up to 2^64 - 1; 0 on success. */
static int parse_uint(const char *s, unsigned long long *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-')
        return -1;
    *out = v;
    return 0;
}

/* Parses a whole decimal integer; 0 on success. */
static int parse_int(const char *s, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_number(const char *s, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* Bytes: a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB). */
static int parse_bytes(const char *s, double *out)
{
    static const struct { const char *unit; double scale; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v))
        return -1;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].unit) == 0) {
            *out = floor(v * units[i].scale);
            return 0;
        }
    return -1;
}

static int parse_recompute(const char *s, int32_t *out)
{
    static const struct { const char *name; int32_t flag; } flags[] = {
        {"attn_core", LLMT_RECOMPUTE_ATTN_CORE}, {"ffn_act", LLMT_RECOMPUTE_FFN_ACT},
        {"ffn", LLMT_RECOMPUTE_FFN}, {"full", LLMT_RECOMPUTE_FULL}};
    if (strcmp(s, "none") == 0) {
        *out = LLMT_RECOMPUTE_NONE;
        return 0;
    }
    int32_t policy = 0;
    const char *at = s;
    for (;;) {
        size_t len = strcspn(at, "+");
        int found = 0;
        for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
            if (strlen(flags[i].name) == len && strncmp(at, flags[i].name, len) == 0) {
                policy |= flags[i].flag;
                found = 1;
            }
        if (!found)
            return -1;
        if (!at[len])
            break;
        at += len + 1;
    }
    *out = policy;
    return 0;
}

/* Writes the reason a value is refused into why; returns -1. */
static int refuse(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int refuse(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* Sets field f of cfg from the text s, the one check every way of setting a
 * key goes through (YAML files and llmt_train_config_set). On error writes
 * why (naming the value, not the key) and returns -1; cfg is unchanged. */
static int set_value(llmt_train_config *cfg, const field *f, const char *s, char *why, size_t cap)
{
    void *dst = (char *)cfg + f->offset;
    long long iv = 0;
    double dv = 0;
    switch (f->type) {
    case K_U64: {
        unsigned long long uv = 0;
        if (parse_uint(s, &uv))
            return refuse(why, cap, "'%s' is not a non-negative integer", s);
        *(uint64_t *)dst = uv;
        return 0;
    }
    case K_I32:
    case K_I64:
        if (parse_int(s, &iv))
            return refuse(why, cap, "'%s' is not an integer", s);
        if ((double)iv < f->lo || (double)iv > f->hi)
            return refuse(why, cap, "%lld is outside %.0f..%.0f", iv, f->lo, f->hi);
        if (f->type == K_I32)
            *(int32_t *)dst = (int32_t)iv;
        else
            *(int64_t *)dst = iv;
        return 0;
    case K_BYTES:
        if (parse_bytes(s, &dv) || dv < 0 || dv > f->hi)
            return refuse(why, cap, "'%s' is not a byte count (an integer, or with a unit: "
                            "KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s);
        *(uint64_t *)dst = (uint64_t)dv;
        return 0;
    case K_F32:
    case K_F64:
        if (parse_number(s, &dv))
            return refuse(why, cap, "'%s' is not a number", s);
        if (dv < f->lo || dv > f->hi)
            return refuse(why, cap, "%g is outside [%g, %g]", dv, f->lo, f->hi);
        if (f->type == K_F32)
            *(float *)dst = (float)dv;
        else
            *(double *)dst = dv;
        return 0;
    case K_BOOL:
        if (strcmp(s, "true") != 0 && strcmp(s, "false") != 0)
            return refuse(why, cap, "'%s' is not true or false", s);
        *(int32_t *)dst = strcmp(s, "true") == 0;
        return 0;
    case K_PATH:
        if (strlen(s) >= LLMT_CONFIG_PATH_MAX)
            return refuse(why, cap, "longer than %d bytes", LLMT_CONFIG_PATH_MAX - 1);
        memcpy(dst, s, strlen(s) + 1);
        return 0;
    case K_ENUM:
        for (int32_t i = 0; f->names[i]; i++)
            if (strcmp(s, f->names[i]) == 0) {
                *(int32_t *)dst = i;
                return 0;
            }
        {
            char choices[256] = "";
            for (int i = 0; f->names[i]; i++)
                snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s",
                         i ? ", " : "", f->names[i]);
            return refuse(why, cap, "'%s' is not one of %s", s, choices);
        }
    case K_RECOMPUTE:
        if (parse_recompute(s, (int32_t *)dst))
            return refuse(why, cap, "'%s' is not none or flags attn_core, ffn_act, ffn, full "
                            "joined by '+'", s);
        return 0;
    case K_LAYERS:
        if (strcmp(s, "all") == 0) {
            *(int32_t *)dst = LLMT_OFFLOAD_ALL_LAYERS;
            return 0;
        }
        if (parse_int(s, &iv) || (double)iv < f->lo || (double)iv > f->hi)
            return refuse(why, cap, "'%s' is not all or an integer in %.0f..%.0f", s, f->lo, f->hi);
        *(int32_t *)dst = (int32_t)iv;
        return 0;
    case K_OFFLOAD:
        for (int32_t i = 0; offload_names[i]; i++)
            if (strcmp(s, offload_names[i]) == 0) {
                *(int32_t *)dst = offload_bits[i];
                return 0;
            }
        if (strcmp(s, "grads") == 0)
            return refuse(why, cap, "'grads' alone: gradient offload needs the optimizer's "
                            "too (the host AdamW reads the offloaded gradients): use "
                            "optimizer+grads");
        return refuse(why, cap, "'%s' is not one of none, optimizer, optimizer+grads", s);
    }
    return 0;
}

/* Sets field f from scalar node n; errors name source:line:column and key. */
static int set_field(const parse_ctx *p, const field *f, const yaml_node_t *n, const char *key)
{
    if (n->type != YAML_SCALAR_NODE)
        return fail_at(p, n, key, "expected a single value, found a %s",
                       n->type == YAML_MAPPING_NODE ? "mapping" : "sequence");
    char why[512];
    if (set_value(p->cfg, f, scalar_text(n), why, sizeof why))
        return fail_at(p, n, key, "%s", why);
    return LLMT_OK;
}

static const field *find_field(const char *section, const char *key)
{
    for (size_t i = 0; i < FIELD_COUNT; i++) {
        const field *f = &fields[i];
        if (strcmp(f->key, key) == 0 &&
            ((!section && !f->section) || (section && f->section && strcmp(section, f->section) == 0)))
            return f;
    }
    return NULL;
}

static int is_section(const char *name)
{
    for (size_t i = 0; i < FIELD_COUNT; i++)
        if (fields[i].section && strcmp(fields[i].section, name) == 0)
            return 1;
    return 0;
}

/* Walks a mapping's pairs, refusing duplicate and non-scalar keys. */
static int walk_mapping(const parse_ctx *p, const yaml_node_t *map, const char *section)
{
    for (yaml_node_pair_t *pair = map->data.mapping.pairs.start;
         pair < map->data.mapping.pairs.top; pair++) {
        yaml_node_t *k = yaml_document_get_node(p->doc, pair->key);
        yaml_node_t *v = yaml_document_get_node(p->doc, pair->value);
        if (k->type != YAML_SCALAR_NODE)
            return fail_at(p, k, section, "keys must be plain names");
        const char *key = scalar_text(k);
        char full[128];
        snprintf(full, sizeof full, "%s%s%s", section ? section : "", section ? "." : "", key);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < pair; q++) {
            yaml_node_t *earlier = yaml_document_get_node(p->doc, q->key);
            if (earlier->type == YAML_SCALAR_NODE && strcmp(scalar_text(earlier), key) == 0)
                return fail_at(p, k, full, "given twice (first at line %zu)",
                               earlier->start_mark.line + 1);
        }
        int rc;
        if (!section && is_section(key)) {
            if (v->type != YAML_MAPPING_NODE)
                return fail_at(p, v, full, "expected a mapping of %s settings", key);
            rc = walk_mapping(p, v, key);
        } else {
            const field *f = find_field(section, key);
            if (!f)
                return fail_at(p, k, full, "unknown key");
            rc = set_field(p, f, v, full);
        }
        if (rc)
            return rc;
    }
    return LLMT_OK;
}

/* A configuration nests two levels; deeper input is refused before libyaml
 * builds it (its scanner is quadratic in the depth of flow collections). */
#define MAX_DEPTH 32

/* Reads text's events once: refuses a second document (everything after a
 * '---' mid-file would otherwise be ignored) and nesting deeper than
 * MAX_DEPTH, stopping at the first offence. Syntax errors are left to the
 * loader, which reports them with the same position. */
static int check_structure(const char *text, size_t len, const char *source)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", source);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = LLMT_OK, depth = 0, documents = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev))
            break;
        yaml_event_type_t type = ev.type;
        size_t line = ev.start_mark.line + 1, column = ev.start_mark.column + 1;
        yaml_event_delete(&ev);
        if (type == YAML_STREAM_END_EVENT)
            break;
        if (type == YAML_DOCUMENT_START_EVENT && ++documents > 1) {
            rc = llmt_fail(LLMT_EINVAL, "%s:%zu:%zu: a second YAML document ('---'): a "
                           "configuration is one document", source, line, column);
            break;
        }
        if (type == YAML_MAPPING_START_EVENT || type == YAML_SEQUENCE_START_EVENT) {
            if (++depth > MAX_DEPTH) {
                rc = llmt_fail(LLMT_EINVAL, "%s:%zu:%zu: nested deeper than %d levels", source,
                               line, column, MAX_DEPTH);
                break;
            }
        } else if (type == YAML_MAPPING_END_EVENT || type == YAML_SEQUENCE_END_EVENT) {
            depth--;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

int llmt_train_config_parse_yaml(llmt_train_config *cfg, const char *text, size_t len,
                                 const char *source)
{
    const char *fn = "llmt_train_config_parse_yaml";
    if (!cfg || !text)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, cfg ? "text" : "cfg");
    if (cfg->version != LLMT_TRAIN_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows %u", fn,
                         cfg->version, LLMT_TRAIN_CONFIG_VERSION);
    source = source ? source : "config";
    LLMT_TRY(check_structure(text, len, source));
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", fn);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        int rc = llmt_fail(LLMT_EINVAL, "%s:%zu:%zu: not valid YAML: %s", source,
                           parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                           parser.problem ? parser.problem : "parse error");
        yaml_parser_delete(&parser);
        return rc;
    }
    parse_ctx p = {&doc, source, cfg};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    int rc = LLMT_OK;
    if (root && root->type != YAML_MAPPING_NODE)
        rc = fail_at(&p, root, NULL, "the configuration must be a mapping of sections");
    else if (root)
        rc = walk_mapping(&p, root, NULL);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

int llmt_train_config_set(llmt_train_config *cfg, const char *key, const char *value)
{
    const char *fn = "llmt_train_config_set";
    if (!cfg || !key || !value)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, !cfg ? "cfg" : !key ? "key" : "value");
    if (cfg->version != LLMT_TRAIN_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows %u", fn,
                         cfg->version, LLMT_TRAIN_CONFIG_VERSION);
    const char *dot = strchr(key, '.');
    char section[64];
    const field *f = NULL;
    if (!dot)
        f = find_field(NULL, key);
    else if ((size_t)(dot - key) < sizeof section) {
        memcpy(section, key, (size_t)(dot - key));
        section[dot - key] = '\0';
        f = find_field(section, dot + 1);
    }
    if (!f)
        return llmt_fail(LLMT_EINVAL, "%s: unknown key (docs/config.md lists the keys)", key);
    char why[512];
    if (set_value(cfg, f, value, why, sizeof why))
        return llmt_fail(LLMT_EINVAL, "%s: %s", key, why);
    return LLMT_OK;
}

int llmt_train_config_load_yaml(llmt_train_config *cfg, const char *path)
{
    if (!path)
        return llmt_fail(LLMT_EINVAL, "llmt_train_config_load_yaml: path is NULL");
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is
     * refused below, as are directories and devices. A regular file ignores
     * the flag. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    const char *why = fstat(fd, &st) != 0   ? strerror(errno)
                      : S_ISREG(st.st_mode) ? NULL
                      : S_ISDIR(st.st_mode) ? "a directory, not a configuration file"
                      : S_ISFIFO(st.st_mode) ? "a FIFO, not a regular file"
                                             : "not a regular file";
    if (why) {
        int rc = llmt_fail(LLMT_EIO, "%s: %s", path, why);
        close(fd);
        return rc;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int rc = llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = LLMT_OK;
    for (;;) {
        if (len + 4096 > cap) {
            char *grown = realloc(text, cap = 2 * cap + 4096);
            if (!grown) {
                rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", path);
                break;
            }
            text = grown;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                rc = llmt_fail(LLMT_EIO, "%s: read error", path);
            break;
        }
        if (len > LLMT_CONFIG_MAX_BYTES) {
            rc = llmt_fail(LLMT_EINVAL, "%s: larger than %d bytes", path, LLMT_CONFIG_MAX_BYTES);
            break;
        }
    }
    fclose(f);
    if (!rc)
        rc = llmt_train_config_parse_yaml(cfg, text, len, path);
    free(text);
    return rc;
}

/* ---- validation of relations between fields */

int llmt_train_config_check(const llmt_train_config *c)
{
    const char *fn = "llmt_train_config_check";
    if (!c)
        return llmt_fail(LLMT_EINVAL, "%s: cfg is NULL", fn);
    if (c->version != LLMT_TRAIN_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows %u", fn,
                         c->version, LLMT_TRAIN_CONFIG_VERSION);
    int rc = llmt_model_config_check(&c->model, "model");
    if (!rc)
        rc = llmt_optimizer_config_check(&c->optimizer, "optimizer/schedule");
    if (!rc)
        rc = llmt_loss_scaler_config_check(&c->loss_scale, "loss_scale");
    if (rc)
        return rc;
    if (c->micro_batch > c->batch_size)
        return llmt_fail(LLMT_EINVAL, "batch.micro_batch = %d is larger than batch.batch_size "
                         "= %d", c->micro_batch, c->batch_size);
    if (c->seq_len > c->model.max_seq_len)
        return llmt_fail(LLMT_EINVAL, "batch.seq_len = %d is longer than model.max_seq_len = %d",
                         c->seq_len, c->model.max_seq_len);
    if (c->recompute < 0 || c->recompute > LLMT_RECOMPUTE_MASK)
        return llmt_fail(LLMT_EINVAL, "recompute = %d is not a policy", c->recompute);
    if (c->optimizer.offload_parts != LLMT_OFFLOAD_NONE &&
        (c->optimizer.offload_layers < LLMT_OFFLOAD_ALL_LAYERS ||
         c->optimizer.offload_layers > c->model.num_layers))
        return llmt_fail(LLMT_EINVAL, "optimizer.offload_layers = %d is neither all nor in 0..%d "
                         "(model.num_layers)", c->optimizer.offload_layers, c->model.num_layers);
    if (c->optimizer.schedule != LLMT_SCHEDULE_CONSTANT &&
        c->optimizer.total_steps <= c->optimizer.warmup_steps)
        return llmt_fail(LLMT_EINVAL, "schedule.total_steps = %lld must exceed "
                         "schedule.warmup_steps = %lld for a decaying schedule",
                         (long long)c->optimizer.total_steps, (long long)c->optimizer.warmup_steps);
    if (!memchr(c->train_data, 0, sizeof c->train_data) || !memchr(c->val_data, 0, sizeof c->val_data) ||
        !memchr(c->metrics, 0, sizeof c->metrics) || !memchr(c->checkpoint_dir, 0, sizeof c->checkpoint_dir) ||
        !memchr(c->fast_checkpoint_dir, 0, sizeof c->fast_checkpoint_dir))
        return llmt_fail(LLMT_EINVAL, "a path in the configuration is not NUL-terminated");
    if (c->fast_checkpoint_dir[0] && !c->fast_checkpoint_every)
        return llmt_fail(LLMT_EINVAL, "checkpoint.fast_dir is set but checkpoint.fast_every is 0");
    return LLMT_OK;
}

/* ---- writing */

typedef struct out_buf {
    char *p;
    size_t cap, len; /* len counts what would have been written */
} out_buf;

static void emit(out_buf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void emit(out_buf *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->len < o->cap ? o->p + o->len : NULL, o->len < o->cap ? o->cap - o->len : 0,
                      fmt, ap);
    va_end(ap);
    o->len += n > 0 ? (size_t)n : 0;
}

/* A YAML double-quoted string. */
static void emit_string(out_buf *o, const char *s)
{
    emit(o, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            emit(o, "\\%c", c);
        else if (c < 0x20)
            emit(o, "\\x%02x", c);
        else
            emit(o, "%c", c);
    }
    emit(o, "\"");
}

static void emit_value(out_buf *o, const llmt_train_config *cfg, const field *f)
{
    const void *src = (const char *)cfg + f->offset;
    char num[32];
    switch (f->type) {
    case K_I32: emit(o, "%d", *(const int32_t *)src); break;
    case K_I64: emit(o, "%lld", (long long)*(const int64_t *)src); break;
    case K_U64:
    case K_BYTES: emit(o, "%llu", (unsigned long long)*(const uint64_t *)src); break;
    case K_F32: llmt_format_float(num, *(const float *)src); emit(o, "%s", num); break;
    case K_F64: llmt_format_double(num, *(const double *)src); emit(o, "%s", num); break;
    case K_BOOL: emit(o, "%s", *(const int32_t *)src ? "true" : "false"); break;
    case K_PATH: emit_string(o, (const char *)src); break;
    case K_ENUM: emit(o, "%s", f->names[*(const int32_t *)src]); break;
    case K_RECOMPUTE: emit(o, "%s", llmt_recompute_policy_name(*(const int32_t *)src)); break;
    case K_LAYERS:
        if (*(const int32_t *)src == LLMT_OFFLOAD_ALL_LAYERS)
            emit(o, "all");
        else
            emit(o, "%d", *(const int32_t *)src);
        break;
    case K_OFFLOAD:
        for (int i = 0; offload_names[i]; i++)
            if (offload_bits[i] == *(const int32_t *)src)
                emit(o, "%s", offload_names[i]);
        break;
    }
}

int llmt_train_config_to_yaml(const llmt_train_config *cfg, char *out, size_t cap, size_t *needed)
{
    if (!cfg || (!out && cap))
        return llmt_fail(LLMT_EINVAL, "llmt_train_config_to_yaml: %s is NULL", cfg ? "out" : "cfg");
    int rc = llmt_train_config_check(cfg);
    if (rc)
        return rc;
    out_buf o = {out, cap, 0};
    const char *section = NULL;
    for (size_t i = 0; i < FIELD_COUNT; i++) {
        const field *f = &fields[i];
        if (f->section && (!section || strcmp(section, f->section) != 0))
            emit(&o, "%s:\n", f->section);
        section = f->section;
        emit(&o, "%s%s: ", f->section ? "  " : "", f->key);
        emit_value(&o, cfg, f);
        emit(&o, "\n");
    }
    if (needed)
        *needed = o.len + 1;
    if (cap && o.len + 1 > cap) {
        out[0] = '\0';
        return llmt_fail(LLMT_EINVAL, "llmt_train_config_to_yaml: cap = %zu, %zu needed", cap,
                         o.len + 1);
    }
    return LLMT_OK;
}
