/* MANIFEST: formatting and strict parsing. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ckpt/manifest.h"
#include "core/error.h"
#include "model/config_json.h"
#include "util/json.h"

#define TRAILER_LEN 22 /* "xxh3:" + 16 hex digits + "\n" */

/* ---- formatting */

static void put_i64(llmt_jw *w, const char *k, int64_t v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_int64(w, v);
}

static void put_u64(llmt_jw *w, const char *k, uint64_t v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_uint64(w, v);
}

static void put_f64(llmt_jw *w, const char *k, double v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_double(w, v);
}

static void put_str(llmt_jw *w, const char *k, const char *v)
{
    llmt_jw_keyz(w, k);
    llmt_jw_string(w, v, strlen(v));
}

static void put_hex(llmt_jw *w, const char *k, uint64_t v)
{
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, v);
    put_str(w, k, hex);
}

static void write_optimizer(llmt_jw *w, const llmt_manifest *m)
{
    const llmt_optimizer_config *o = &m->optimizer;
    llmt_jw_begin_object(w);
    put_f64(w, "lr", o->lr);
    put_f64(w, "beta1", o->beta1);
    put_f64(w, "beta2", o->beta2);
    put_f64(w, "eps", o->eps);
    put_f64(w, "weight_decay", o->weight_decay);
    put_i64(w, "decay_norms", o->decay_norms);
    put_f64(w, "grad_clip", o->grad_clip);
    put_i64(w, "schedule", o->schedule);
    put_i64(w, "warmup_steps", o->warmup_steps);
    put_i64(w, "total_steps", o->total_steps);
    put_f64(w, "min_lr", o->min_lr);
    put_i64(w, "step_count", m->optimizer_steps);
    llmt_jw_end_object(w);
}

static void write_scaler(llmt_jw *w, const llmt_manifest *m)
{
    const llmt_loss_scaler_config *c = &m->scaler_config;
    llmt_jw_begin_object(w);
    put_i64(w, "dynamic", c->dynamic);
    put_f64(w, "init_scale", c->init_scale);
    put_f64(w, "growth_factor", c->growth_factor);
    put_f64(w, "backoff_factor", c->backoff_factor);
    put_i64(w, "growth_interval", c->growth_interval);
    put_f64(w, "min_scale", c->min_scale);
    put_f64(w, "max_scale", c->max_scale);
    put_f64(w, "scale", m->scaler.scale);
    put_i64(w, "clean_steps", m->scaler.clean_steps);
    put_i64(w, "skipped_steps", m->scaler.skipped_steps);
    llmt_jw_end_object(w);
}

static void write_loader(llmt_jw *w, const llmt_loader_state *s)
{
    llmt_jw_begin_object(w);
    put_u64(w, "epoch", s->epoch);
    put_u64(w, "shard_cursor", s->shard_cursor);
    put_u64(w, "window_cursor", s->window_cursor);
    put_u64(w, "windows_consumed", s->windows_consumed);
    put_u64(w, "seed", s->seed);
    put_hex(w, "fingerprint", s->fingerprint);
    llmt_jw_end_object(w);
}

/* "shards" of format 2: the save's world size and one entry per rank's file. */
static void write_shards(llmt_jw *w, const llmt_manifest *m)
{
    llmt_jw_begin_object(w);
    put_i64(w, "world_size", m->world_size);
    put_i64(w, "elements", m->num_elements);
    put_u64(w, "chunk_bytes", m->chunk_bytes);
    if (m->per_node) { /* absent otherwise: what earlier versions wrote */
        llmt_jw_keyz(w, "per_node");
        llmt_jw_bool(w, true);
    }
    llmt_jw_keyz(w, "files");
    llmt_jw_begin_array(w);
    for (int32_t r = 0; r < m->world_size; r++) {
        const llmt_manifest_shard *sh = &m->shards[r];
        llmt_jw_begin_object(w);
        put_str(w, "name", sh->file.name);
        put_u64(w, "bytes", sh->file.bytes);
        put_hex(w, "xxh3", sh->file.xxh3);
        llmt_jw_keyz(w, "range");
        llmt_jw_begin_array(w);
        llmt_jw_int64(w, sh->first);
        llmt_jw_int64(w, sh->end);
        llmt_jw_end_array(w);
        llmt_jw_keyz(w, "chunks");
        llmt_jw_begin_array(w);
        for (size_t c = 0; c < sh->n_chunks; c++) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, sh->chunks[c]);
            llmt_jw_string(w, hex, 16);
        }
        llmt_jw_end_array(w);
        llmt_jw_end_object(w);
    }
    llmt_jw_end_array(w);
    llmt_jw_end_object(w);
}

int llmt_manifest_format(const llmt_manifest *m, char **out, size_t *len)
{
    const int sharded = m->format == LLMT_MANIFEST_FORMAT_SHARDED;
    llmt_jw w;
    llmt_jw_init(&w);
    llmt_jw_begin_object(&w);
    put_str(&w, "format", "llmt-checkpoint");
    put_i64(&w, "format_version", sharded ? LLMT_MANIFEST_FORMAT_SHARDED : LLMT_MANIFEST_FORMAT);
    put_str(&w, "library_version", m->library_version);
    put_i64(&w, "step", m->step);
    put_i64(&w, "epoch", m->epoch);
    put_i64(&w, "tokens_seen", m->tokens_seen);
    llmt_jw_keyz(&w, "model");
    llmt_model_config_write_json(&w, &m->model);
    llmt_jw_keyz(&w, "optimizer");
    if (m->has_optimizer)
        write_optimizer(&w, m);
    else
        llmt_jw_null(&w);
    llmt_jw_keyz(&w, "loss_scaler");
    if (m->has_scaler)
        write_scaler(&w, m);
    else
        llmt_jw_null(&w);
    llmt_jw_keyz(&w, "rng");
    llmt_jw_begin_object(&w);
    put_u64(&w, "seed", m->context_rng.seed);
    put_u64(&w, "stream", m->context_rng.stream);
    put_u64(&w, "offset", m->context_rng.offset);
    llmt_jw_end_object(&w);
    llmt_jw_keyz(&w, "data");
    if (m->has_loader)
        write_loader(&w, &m->loader);
    else
        llmt_jw_null(&w);
    llmt_jw_keyz(&w, "config_yaml");
    if (m->config_yaml)
        llmt_jw_string(&w, m->config_yaml, strlen(m->config_yaml));
    else
        llmt_jw_null(&w);
    llmt_jw_keyz(&w, "files");
    llmt_jw_begin_array(&w);
    for (int i = 0; i < m->n_files; i++) {
        llmt_jw_begin_object(&w);
        put_str(&w, "name", m->files[i].name);
        put_u64(&w, "bytes", m->files[i].bytes);
        put_hex(&w, "xxh3", m->files[i].xxh3);
        llmt_jw_end_object(&w);
    }
    llmt_jw_end_array(&w);
    if (sharded) {
        llmt_jw_keyz(&w, "shards");
        write_shards(&w, m);
    }
    llmt_jw_end_object(&w);
    const char *text = NULL;
    size_t n = 0;
    int rc = llmt_jw_finish(&w, &text, &n);
    if (!rc) {
        *out = malloc(n + 1 + TRAILER_LEN + 1);
        if (!*out)
            rc = llmt_fail(LLMT_ENOMEM, "manifest: out of memory");
    }
    if (!rc) {
        memcpy(*out, text, n);
        (*out)[n] = '\n';
        snprintf(*out + n + 1, TRAILER_LEN + 1, "xxh3:%016" PRIx64 "\n", XXH3_64bits(*out, n + 1));
        *len = n + 1 + TRAILER_LEN;
    }
    llmt_jw_free(&w);
    return rc;
}

/* ---- parsing */

/* Fails with "manifest: <what>". */
#define BAD(...) llmt_fail(LLMT_ECORRUPT, "manifest: " __VA_ARGS__)

/* obj must be an object with exactly n members, the keys given. */
static int expect_keys(const llmt_json *obj, const char *where, const char *const *keys, size_t n)
{
    if (llmt_json_type(obj) != LLMT_JSON_OBJECT)
        return BAD("%s is not an object", where);
    if (llmt_json_len(obj) != n)
        return BAD("%s has %zu fields, expected %zu", where, llmt_json_len(obj), n);
    for (size_t i = 0; i < n; i++)
        if (!llmt_json_get(obj, keys[i]))
            return BAD("%s lacks \"%s\"", where, keys[i]);
    return LLMT_OK;
}

static int get_i64(const llmt_json *obj, const char *where, const char *k, int64_t *out)
{
    if (llmt_json_int64(llmt_json_get(obj, k), out))
        return BAD("%s.%s is not an integer", where, k);
    return LLMT_OK;
}

static int get_u64(const llmt_json *obj, const char *where, const char *k, uint64_t *out)
{
    if (llmt_json_uint64(llmt_json_get(obj, k), out))
        return BAD("%s.%s is not a non-negative integer", where, k);
    return LLMT_OK;
}

static int get_i32(const llmt_json *obj, const char *where, const char *k, int32_t *out)
{
    int64_t v = 0;
    int rc = get_i64(obj, where, k, &v);
    if (!rc && (v < INT32_MIN || v > INT32_MAX))
        rc = BAD("%s.%s = %lld is out of range", where, k, (long long)v);
    *out = (int32_t)v;
    return rc;
}

static int get_f64(const llmt_json *obj, const char *where, const char *k, double *out)
{
    const llmt_json *v = llmt_json_get(obj, k);
    if (llmt_json_type(v) != LLMT_JSON_NUMBER || llmt_json_double(v, out))
        return BAD("%s.%s is not a number", where, k);
    return LLMT_OK;
}

static int get_hex(const llmt_json *obj, const char *where, const char *k, uint64_t *out)
{
    size_t len = 0;
    const char *s = llmt_json_string(llmt_json_get(obj, k), &len);
    if (!s || len != 16 || strspn(s, "0123456789abcdef") != 16)
        return BAD("%s.%s is not 16 lowercase hex digits", where, k);
    *out = strtoull(s, NULL, 16);
    return LLMT_OK;
}

static int get_string(const llmt_json *obj, const char *where, const char *k, char *out,
                      size_t cap)
{
    size_t len = 0;
    const char *s = llmt_json_string(llmt_json_get(obj, k), &len);
    if (!s || len >= cap || memchr(s, 0, len))
        return BAD("%s.%s is not a string of under %zu bytes", where, k, cap);
    memcpy(out, s, len + 1);
    return LLMT_OK;
}

static int read_optimizer(const llmt_json *o, llmt_manifest *m)
{
    static const char *const keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                       "decay_norms", "grad_clip", "schedule", "warmup_steps",
                                       "total_steps", "min_lr", "step_count"};
    llmt_optimizer_config *c = &m->optimizer;
    llmt_optimizer_config_init(c);
    int rc = expect_keys(o, "optimizer", keys, sizeof keys / sizeof keys[0]);
    if (!rc) rc = get_f64(o, "optimizer", "lr", &c->lr);
    if (!rc) rc = get_f64(o, "optimizer", "beta1", &c->beta1);
    if (!rc) rc = get_f64(o, "optimizer", "beta2", &c->beta2);
    if (!rc) rc = get_f64(o, "optimizer", "eps", &c->eps);
    if (!rc) rc = get_f64(o, "optimizer", "weight_decay", &c->weight_decay);
    if (!rc) rc = get_i32(o, "optimizer", "decay_norms", &c->decay_norms);
    if (!rc) rc = get_f64(o, "optimizer", "grad_clip", &c->grad_clip);
    if (!rc) rc = get_i32(o, "optimizer", "schedule", &c->schedule);
    if (!rc) rc = get_i64(o, "optimizer", "warmup_steps", &c->warmup_steps);
    if (!rc) rc = get_i64(o, "optimizer", "total_steps", &c->total_steps);
    if (!rc) rc = get_f64(o, "optimizer", "min_lr", &c->min_lr);
    if (!rc) rc = get_i64(o, "optimizer", "step_count", &m->optimizer_steps);
    if (!rc && m->optimizer_steps < 0)
        rc = BAD("optimizer.step_count is negative");
    m->has_optimizer = !rc;
    return rc;
}

static int read_scaler(const llmt_json *o, llmt_manifest *m)
{
    static const char *const keys[] = {"dynamic", "init_scale", "growth_factor", "backoff_factor",
                                       "growth_interval", "min_scale", "max_scale", "scale",
                                       "clean_steps", "skipped_steps"};
    llmt_loss_scaler_config *c = &m->scaler_config;
    llmt_loss_scaler_config_init(c);
    m->scaler.version = LLMT_LOSS_SCALER_STATE_VERSION;
    int rc = expect_keys(o, "loss_scaler", keys, sizeof keys / sizeof keys[0]);
    if (!rc) rc = get_i32(o, "loss_scaler", "dynamic", &c->dynamic);
    if (!rc) rc = get_f64(o, "loss_scaler", "init_scale", &c->init_scale);
    if (!rc) rc = get_f64(o, "loss_scaler", "growth_factor", &c->growth_factor);
    if (!rc) rc = get_f64(o, "loss_scaler", "backoff_factor", &c->backoff_factor);
    if (!rc) rc = get_i64(o, "loss_scaler", "growth_interval", &c->growth_interval);
    if (!rc) rc = get_f64(o, "loss_scaler", "min_scale", &c->min_scale);
    if (!rc) rc = get_f64(o, "loss_scaler", "max_scale", &c->max_scale);
    if (!rc) rc = get_f64(o, "loss_scaler", "scale", &m->scaler.scale);
    if (!rc) rc = get_i64(o, "loss_scaler", "clean_steps", &m->scaler.clean_steps);
    if (!rc) rc = get_i64(o, "loss_scaler", "skipped_steps", &m->scaler.skipped_steps);
    m->has_scaler = !rc;
    return rc;
}

static int read_loader(const llmt_json *o, llmt_manifest *m)
{
    static const char *const keys[] = {"epoch", "shard_cursor", "window_cursor",
                                       "windows_consumed", "seed", "fingerprint"};
    llmt_loader_state *s = &m->loader;
    s->version = LLMT_LOADER_STATE_VERSION;
    int rc = expect_keys(o, "data", keys, sizeof keys / sizeof keys[0]);
    if (!rc) rc = get_u64(o, "data", "epoch", &s->epoch);
    if (!rc) rc = get_u64(o, "data", "shard_cursor", &s->shard_cursor);
    if (!rc) rc = get_u64(o, "data", "window_cursor", &s->window_cursor);
    if (!rc) rc = get_u64(o, "data", "windows_consumed", &s->windows_consumed);
    if (!rc) rc = get_u64(o, "data", "seed", &s->seed);
    if (!rc) rc = get_hex(o, "data", "fingerprint", &s->fingerprint);
    m->has_loader = !rc;
    return rc;
}

static int read_files(const llmt_json *arr, llmt_manifest *m)
{
    static const char *const keys[] = {"name", "bytes", "xxh3"};
    if (llmt_json_type(arr) != LLMT_JSON_ARRAY || llmt_json_len(arr) > LLMT_MANIFEST_MAX_FILES)
        return BAD("files is not an array of at most %d entries", LLMT_MANIFEST_MAX_FILES);
    m->n_files = (int)llmt_json_len(arr);
    for (int i = 0; i < m->n_files; i++) {
        const llmt_json *f = llmt_json_at(arr, (size_t)i);
        llmt_manifest_file *e = &m->files[i];
        int rc = expect_keys(f, "files[]", keys, 3);
        if (!rc) rc = get_string(f, "files[]", "name", e->name, sizeof e->name);
        if (!rc) rc = get_u64(f, "files[]", "bytes", &e->bytes);
        if (!rc) rc = get_hex(f, "files[]", "xxh3", &e->xxh3);
        if (!rc && (!e->name[0] || strchr(e->name, '/') || !strcmp(e->name, ".") ||
                    !strcmp(e->name, "..") || !strcmp(e->name, "MANIFEST")))
            rc = BAD("files[%d].name \"%s\" is not a plain file name", i, e->name);
        for (int j = 0; j < i && !rc; j++)
            if (!strcmp(m->files[j].name, e->name))
                rc = BAD("file \"%s\" is listed twice", e->name);
        if (rc)
            return rc;
    }
    return LLMT_OK;
}

void llmt_manifest_shard_name(char *buf, size_t cap, int32_t rank, int32_t size)
{
    snprintf(buf, cap, "optimizer-%05d-of-%05d.safetensors", (int)rank + 1, (int)size);
}

/* One entry of shards.files: rank r's file, its range starting at `at`. */
static int read_shard(const llmt_json *f, int32_t r, int32_t size, int64_t at, uint64_t chunk,
                      llmt_manifest_shard *sh)
{
    static const char *const keys[] = {"name", "bytes", "xxh3", "range", "chunks"};
    char want[64];
    int64_t range[2] = {0, 0};
    int rc = expect_keys(f, "shards.files[]", keys, 5);
    if (!rc) rc = get_string(f, "shards.files[]", "name", sh->file.name, sizeof sh->file.name);
    if (!rc) rc = get_u64(f, "shards.files[]", "bytes", &sh->file.bytes);
    if (!rc) rc = get_hex(f, "shards.files[]", "xxh3", &sh->file.xxh3);
    llmt_manifest_shard_name(want, sizeof want, r, size);
    if (!rc && strcmp(sh->file.name, want))
        rc = BAD("shards.files[%d].name is \"%s\", expected \"%s\"", (int)r, sh->file.name, want);
    const llmt_json *v = llmt_json_get(f, "range");
    if (!rc && (llmt_json_type(v) != LLMT_JSON_ARRAY || llmt_json_len(v) != 2 ||
                llmt_json_int64(llmt_json_at(v, 0), &range[0]) ||
                llmt_json_int64(llmt_json_at(v, 1), &range[1])))
        rc = BAD("shards.files[%d].range is not two integers", (int)r);
    if (!rc && (range[0] != at || range[1] < range[0]))
        rc = BAD("shards.files[%d].range [%lld, %lld) does not continue at %lld", (int)r,
                 (long long)range[0], (long long)range[1], (long long)at);
    sh->first = range[0];
    sh->end = range[1];
    v = llmt_json_get(f, "chunks");
    size_t n = (size_t)(sh->file.bytes / chunk + (sh->file.bytes % chunk != 0));
    if (!rc && (llmt_json_type(v) != LLMT_JSON_ARRAY || llmt_json_len(v) != n))
        rc = BAD("shards.files[%d].chunks is not an array of %zu checksums", (int)r, n);
    if (!rc && n && !(sh->chunks = malloc(n * sizeof *sh->chunks)))
        rc = llmt_fail(LLMT_ENOMEM, "manifest: out of memory");
    for (size_t c = 0; c < n && !rc; c++) {
        size_t len = 0;
        const char *hex = llmt_json_string(llmt_json_at(v, c), &len);
        if (!hex || len != 16 || strspn(hex, "0123456789abcdef") != 16)
            rc = BAD("shards.files[%d].chunks[%zu] is not 16 lowercase hex digits", (int)r, c);
        else
            sh->chunks[c] = strtoull(hex, NULL, 16);
    }
    sh->n_chunks = rc ? 0 : n;
    return rc;
}

/* "shards" of format 2: ranges that tile [0, elements) in rank order, and
 * "per_node": true in a per-node fast tier's copy (absent otherwise). */
static int read_shards(const llmt_json *o, llmt_manifest *m)
{
    static const char *const keys[] = {"world_size", "elements", "chunk_bytes", "files",
                                       "per_node"};
    const llmt_json *per_node = llmt_json_get(o, "per_node");
    int64_t size = 0;
    uint64_t chunk = 0;
    bool flag = false;
    int rc = expect_keys(o, "shards", keys, per_node ? 5 : 4);
    if (!rc && per_node && (llmt_json_bool(per_node, &flag) || !flag))
        rc = BAD("shards.per_node is not true");
    m->per_node = per_node != NULL;
    if (!rc) rc = get_i64(o, "shards", "world_size", &size);
    if (!rc) rc = get_i64(o, "shards", "elements", &m->num_elements);
    if (!rc) rc = get_u64(o, "shards", "chunk_bytes", &m->chunk_bytes);
    chunk = m->chunk_bytes;
    if (!rc && (size < 1 || size > LLMT_MANIFEST_MAX_SHARDS || m->num_elements < 0))
        rc = BAD("shards.world_size = %lld or shards.elements = %lld is out of range",
                 (long long)size, (long long)m->num_elements);
    if (!rc && (chunk < 4096 || chunk > ((uint64_t)1 << 30) || (chunk & (chunk - 1))))
        rc = BAD("shards.chunk_bytes = %llu is not a power of two from 4 KiB to 1 GiB",
                 (unsigned long long)chunk);
    const llmt_json *files = llmt_json_get(o, "files");
    if (!rc && (llmt_json_type(files) != LLMT_JSON_ARRAY || llmt_json_len(files) != (size_t)size))
        rc = BAD("shards.files is not an array of world_size = %lld entries", (long long)size);
    if (!rc && !(m->shards = calloc((size_t)size, sizeof *m->shards)))
        rc = llmt_fail(LLMT_ENOMEM, "manifest: out of memory");
    if (!rc)
        m->world_size = (int32_t)size;
    int64_t at = 0;
    for (int32_t r = 0; r < m->world_size && !rc; r++) {
        rc = read_shard(llmt_json_at(files, (size_t)r), r, m->world_size, at, chunk,
                        &m->shards[r]);
        at = m->shards[r].end;
    }
    if (!rc && at != m->num_elements)
        rc = BAD("shards end at %lld, not at elements = %lld", (long long)at,
                 (long long)m->num_elements);
    return rc;
}

/* The top level: fields in any order, every one present. */
static int read_root(const llmt_json *root, llmt_manifest *m)
{
    /* Format 2 adds "shards" (last). */
    static const char *const keys[] = {"format", "format_version", "library_version", "step",
                                       "epoch", "tokens_seen", "model", "optimizer",
                                       "loss_scaler", "rng", "data", "config_yaml", "files",
                                       "shards"};
    static const char *const rng_keys[] = {"seed", "stream", "offset"};
    char format[32];
    int rc = llmt_json_type(root) == LLMT_JSON_OBJECT ? LLMT_OK : BAD("manifest is not an object");
    if (!rc) rc = get_i64(root, "manifest", "format_version", &m->format);
    if (!rc && m->format != LLMT_MANIFEST_FORMAT && m->format != LLMT_MANIFEST_FORMAT_SHARDED)
        return llmt_fail(LLMT_EVERSION, "manifest: format_version %lld, this library reads %d "
                         "and %d", (long long)m->format, LLMT_MANIFEST_FORMAT,
                         LLMT_MANIFEST_FORMAT_SHARDED);
    const int sharded = m->format == LLMT_MANIFEST_FORMAT_SHARDED;
    if (!rc) rc = expect_keys(root, "manifest", keys, sizeof keys / sizeof keys[0] - !sharded);
    if (!rc) rc = get_string(root, "manifest", "format", format, sizeof format);
    if (!rc && strcmp(format, "llmt-checkpoint"))
        rc = BAD("format is \"%s\", not llmt-checkpoint", format);
    if (!rc) rc = get_string(root, "manifest", "library_version", m->library_version,
                             sizeof m->library_version);
    if (!rc) rc = get_i64(root, "manifest", "step", &m->step);
    if (!rc) rc = get_i64(root, "manifest", "epoch", &m->epoch);
    if (!rc) rc = get_i64(root, "manifest", "tokens_seen", &m->tokens_seen);
    if (!rc && (m->step < 0 || m->epoch < 0 || m->tokens_seen < 0))
        rc = BAD("step, epoch or tokens_seen is negative");
    if (!rc && llmt_model_config_read_json(llmt_json_get(root, "model"), &m->model))
        rc = llmt_fail_prefix(LLMT_ECORRUPT, "manifest");
    const llmt_json *v = llmt_json_get(root, "optimizer");
    if (!rc && llmt_json_type(v) != LLMT_JSON_NULL)
        rc = read_optimizer(v, m);
    v = llmt_json_get(root, "loss_scaler");
    if (!rc && llmt_json_type(v) != LLMT_JSON_NULL)
        rc = read_scaler(v, m);
    v = llmt_json_get(root, "rng");
    if (!rc) rc = expect_keys(v, "rng", rng_keys, 3);
    if (!rc) rc = get_u64(v, "rng", "seed", &m->context_rng.seed);
    if (!rc) rc = get_u64(v, "rng", "stream", &m->context_rng.stream);
    if (!rc) rc = get_u64(v, "rng", "offset", &m->context_rng.offset);
    v = llmt_json_get(root, "data");
    if (!rc && llmt_json_type(v) != LLMT_JSON_NULL)
        rc = read_loader(v, m);
    v = llmt_json_get(root, "config_yaml");
    if (!rc && llmt_json_type(v) != LLMT_JSON_NULL) {
        size_t len = 0;
        const char *s = llmt_json_string(v, &len);
        if (!s || memchr(s, 0, len))
            rc = BAD("config_yaml is not a string");
        else if (!(m->config_yaml = malloc(len + 1)))
            rc = llmt_fail(LLMT_ENOMEM, "manifest: out of memory");
        else
            memcpy(m->config_yaml, s, len + 1);
    }
    if (!rc)
        rc = read_files(llmt_json_get(root, "files"), m);
    if (!rc && sharded)
        rc = read_shards(llmt_json_get(root, "shards"), m);
    if (!rc && sharded && (!m->has_optimizer || llmt_manifest_find(m, "optimizer.safetensors")))
        rc = BAD("format_version 2 without an optimizer, or with optimizer.safetensors");
    for (int32_t r = 0; r < m->world_size && !rc; r++)
        for (int i = 0; i < m->n_files && !rc; i++)
            if (!strcmp(m->files[i].name, m->shards[r].file.name))
                rc = BAD("file \"%s\" is listed twice", m->files[i].name);
    return rc;
}

int llmt_manifest_parse(const char *text, size_t len, llmt_manifest *m)
{
    memset(m, 0, sizeof *m);
    if (len > LLMT_MANIFEST_MAX_BYTES)
        return BAD("%zu bytes, over the limit of %u", len, LLMT_MANIFEST_MAX_BYTES);
    if (len < TRAILER_LEN + 3 || memcmp(text + len - TRAILER_LEN, "xxh3:", 5) != 0 ||
        text[len - 1] != '\n' || text[len - TRAILER_LEN - 1] != '\n')
        return BAD("no checksum trailer (\"xxh3:\" and 16 hex digits on the last line)");
    const char *hex = text + len - TRAILER_LEN + 5;
    if (strspn(hex, "0123456789abcdef") < 16)
        return BAD("checksum trailer is not 16 lowercase hex digits");
    char digits[17];
    memcpy(digits, hex, 16);
    digits[16] = '\0';
    uint64_t want = strtoull(digits, NULL, 16), got = XXH3_64bits(text, len - TRAILER_LEN);
    if (want != got)
        return BAD("checksum mismatch (trailer %016" PRIx64 ", contents %016" PRIx64 ")", want, got);
    m->checksum = want;
    size_t body = len - TRAILER_LEN - 1;
    /* Nodes: a v1 manifest has a few hundred; a sharded one one per chunk
     * checksum besides (each at least 19 bytes of text). */
    const llmt_json_limits lim = {16, body, body, 4096 + body / 16};
    llmt_json *root = NULL;
    int rc = llmt_json_parse(text, body, &lim, &root);
    if (rc)
        rc = llmt_fail_prefix(LLMT_ECORRUPT, "manifest");
    else
        rc = read_root(root, m);
    llmt_json_free(root);
    if (rc)
        llmt_manifest_clear(m);
    return rc;
}

void llmt_manifest_clear(llmt_manifest *m)
{
    for (int32_t r = 0; m->shards && r < m->world_size; r++)
        free(m->shards[r].chunks);
    free(m->shards);
    free(m->config_yaml);
    memset(m, 0, sizeof *m);
}

const llmt_manifest_file *llmt_manifest_find(const llmt_manifest *m, const char *name)
{
    for (int i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].name, name))
            return &m->files[i];
    for (int32_t r = 0; m->shards && r < m->world_size; r++)
        if (!strcmp(m->shards[r].file.name, name))
            return &m->shards[r].file;
    return NULL;
}
