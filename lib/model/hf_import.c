/* llmt_model_create_from_hf: a model from a Hugging Face directory
 * (config.json, and model.safetensors or the shards of
 * model.safetensors.index.json). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "model/hf_internal.h"
#include "model/model_internal.h"
#include "model/transfer.h"
#include "util/fsutil.h"
#include "util/json.h"

#define PATH_CAP 4096
/* Elements converted at a time on the host. */
/* Index files of the largest public checkpoints are well under 1 MiB. */
#define INDEX_MAX_BYTES ((size_t)64 << 20)
#define MAX_SHARDS 65536

/* The weight files: one, or the shards an index names (each once). */
typedef struct weight_files {
    const char *dir;
    size_t n;
    char **names;        /* file names within dir */
    llmt_st_file **files;
    llmt_json *index;    /* parsed index, or NULL */
    const char *index_path;
} weight_files;

/* Where each parameter is: files[file], tensor idx. */
typedef struct located {
    size_t file, idx;
    int found;
} located;

/* Appends a line to the caller's notes buffer, cut to fit. */
static void note(char *notes, size_t cap, const char *fmt, ...)
{
    if (!notes || !cap)
        return;
    size_t used = strnlen(notes, cap - 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes + used, cap - used, fmt, ap);
    va_end(ap);
}

static void files_free(weight_files *w)
{
    for (size_t i = 0; i < w->n; i++) {
        llmt_st_close(w->files[i]);
        free(w->names[i]);
    }
    free(w->names);
    free(w->files);
    llmt_json_free(w->index);
}

/* A shard name an index may give: a plain file name in the directory. */
static int shard_name_ok(const char *s)
{
    size_t len = strlen(s);
    return len > 0 && len < 256 && s[0] != '.' && !strchr(s, '/');
}

static int add_file(weight_files *w, const char *name)
{
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->names[i], name) == 0)
            return LLMT_OK;
    if (w->n == MAX_SHARDS)
        return llmt_fail(LLMT_ECORRUPT, "%s: names more than %d files", w->index_path, MAX_SHARDS);
    char **names = realloc(w->names, (w->n + 1) * sizeof *names);
    if (names)
        w->names = names;
    llmt_st_file **files = realloc(w->files, (w->n + 1) * sizeof *files);
    if (files)
        w->files = files;
    char *copy = strdup(name);
    if (!names || !files || !copy) {
        free(copy);
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", w->dir);
    }
    w->names[w->n] = copy;
    w->files[w->n++] = NULL;
    return LLMT_OK;
}

/* Reads the index: {"metadata": {...}, "weight_map": {tensor: file}}. */
static int read_index(weight_files *w, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    LLMT_TRY(llmt_read_file(path, INDEX_MAX_BYTES, &text, &len));
    const llmt_json_limits lim = {8, len, 4096, (size_t)4 << 20};
    int rc = llmt_json_parse(text, len, &lim, &w->index);
    free(text);
    if (rc)
        return llmt_fail_prefix(rc, "%s", path);
    const llmt_json *map = llmt_json_get(w->index, "weight_map");
    if (llmt_json_type(map) != LLMT_JSON_OBJECT || llmt_json_len(map) == 0)
        return llmt_fail(LLMT_ECORRUPT, "%s: key \"weight_map\" is missing or not a non-empty "
                         "object", path);
    for (size_t i = 0; i < llmt_json_len(map); i++) {
        const char *tensor = NULL;
        const char *file = llmt_json_string(llmt_json_member(map, i, &tensor, NULL), NULL);
        char q[LLMT_JSON_QUOTE_CAP];
        if (!file || !shard_name_ok(file))
            return llmt_fail(LLMT_ECORRUPT, "%s: weight_map[%s] is not a file name in the "
                             "directory", path,
                             llmt_json_quote(q, sizeof q, tensor, strlen(tensor)));
        LLMT_TRY(add_file(w, file));
    }
    return LLMT_OK;
}

/* Finds the weight files as from_pretrained does (model.safetensors first,
 * then the index) and opens them all: each header is validated, and a
 * truncated file is refused, before anything is read. */
static int open_files(weight_files *w)
{
    char path[PATH_CAP];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", w->dir, LLMT_HF_WEIGHTS);
    if (stat(path, &st) == 0) {
        LLMT_TRY(add_file(w, LLMT_HF_WEIGHTS));
    } else {
        snprintf(path, sizeof path, "%s/%s", w->dir, LLMT_HF_INDEX);
        if (stat(path, &st) != 0)
            return llmt_fail(LLMT_EIO, "%s: holds neither %s nor %s", w->dir, LLMT_HF_WEIGHTS,
                             LLMT_HF_INDEX);
        w->index_path = path;
        int rc = read_index(w, path);
        w->index_path = NULL;
        LLMT_TRY(rc);
    }
    for (size_t i = 0; i < w->n; i++) {
        snprintf(path, sizeof path, "%s/%s", w->dir, w->names[i]);
        int rc = llmt_st_open(path, NULL, &w->files[i]);
        if (rc && w->index)
            return llmt_fail_prefix(rc, "%s/%s names it", w->dir, LLMT_HF_INDEX);
        LLMT_TRY(rc);
    }
    return LLMT_OK;
}

/* Tensors a checkpoint may hold that are not parameters here: RoPE
 * frequencies (computed from config.json) and the LM head of a tied model
 * (the embedding is used, as transformers does). */
static const char *ignored_reason(const char *name, int tied)
{
    const char *suffix = ".rotary_emb.inv_freq";
    size_t n = strlen(name), k = strlen(suffix);
    if (n >= k && strcmp(name + n - k, suffix) == 0)
        return "RoPE frequencies are computed from config.json";
    if (tied && strcmp(name, "lm_head.weight") == 0)
        return "tie_word_embeddings is true: the LM head is the embedding";
    return NULL;
}

/* A shape as "[a, b, ...]" for messages. */
static const char *shape_text(char *buf, size_t cap, int ndim, const uint64_t *shape)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)shape[i]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
    return buf;
}

/* Checks one tensor against the parameter it names. */
static int check_shape(const llmt_param *p, const llmt_st_tensor *t, const char *file)
{
    if (t->dtype == LLMT_DTYPE_I32)
        return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" has dtype I32, not a float type", file,
                         t->name);
    const uint64_t want[2] = {(uint64_t)p->shape[0], (uint64_t)p->shape[1]};
    if (t->ndim != p->ndim || t->shape[0] != want[0] || (p->ndim == 2 && t->shape[1] != want[1])) {
        char a[128], b[64];
        return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" has shape %s, config.json implies %s",
                         file, t->name, shape_text(a, sizeof a, t->ndim, t->shape),
                         shape_text(b, sizeof b, p->ndim, want));
    }
    return LLMT_OK;
}

/* Maps every tensor of every file to a parameter (or a note), each parameter
 * exactly once; with an index, each tensor must be in the file it names. */
static int locate(const llmt_model *m, const weight_files *w, located *where, char *notes,
                  size_t cap)
{
    const llmt_json *map = llmt_json_get(w->index, "weight_map");
    for (size_t f = 0; f < w->n; f++) {
        char label[PATH_CAP];
        snprintf(label, sizeof label, "%s/%s", w->dir, w->names[f]);
        for (size_t i = 0; i < llmt_st_count(w->files[f]); i++) {
            const llmt_st_tensor *t = llmt_st_tensor_at(w->files[f], i);
            const char *mapped = map ? llmt_json_string(llmt_json_get(map, t->name), NULL) : NULL;
            if (map && (!mapped || strcmp(mapped, w->names[f]) != 0)) {
                note(notes, cap, "ignored tensor \"%s\" in %s: the index maps it %s\n", t->name,
                     w->names[f], mapped ? "to another file" : "nowhere");
                continue;
            }
            const char *why = ignored_reason(t->name, m->cfg.tie_embeddings);
            int32_t pi = 0;
            if (why) {
                note(notes, cap, "ignored tensor \"%s\" in %s: %s\n", t->name, w->names[f], why);
                continue;
            }
            if (llmt_model_tensor_find(m, t->name, &pi))
                return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" is not a parameter of the "
                                 "model config.json describes", label, t->name);
            LLMT_TRY(check_shape(&m->params[pi], t, label));
            where[pi] = (located){f, i, 1};
        }
    }
    for (int32_t i = 0; i < m->n_params; i++)
        if (!where[i].found)
            return llmt_fail(LLMT_EINVAL, "%s: tensor \"%s\" is missing%s", w->dir,
                             m->params[i].name, map ? " (or not where the index says)" : "");
    return LLMT_OK;
}

/* Reads every parameter into the (new) model's weights. */
static int read_weights(llmt_model *m, const weight_files *w, const located *where)
{
    void *raw = malloc((size_t)LLMT_TRANSFER_CHUNK * sizeof(float));
    float *tmp = malloc((size_t)LLMT_TRANSFER_CHUNK * sizeof(float));
    int rc = raw && tmp ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "%s: out of host memory", w->dir);
    for (int32_t i = 0; i < m->n_params && !rc; i++)
        rc = llmt_transfer_tensor_in(m, m->weights.ptr, m->params[i].offset, m->params[i].numel,
                                     w->files[where[i].file], where[i].idx, raw, tmp);
    free(raw);
    free(tmp);
    return rc;
}

/* The precision matching the dtype of the embedding as stored. */
static int saved_precision(const weight_files *w)
{
    const char *name = "model.embed_tokens.weight";
    for (size_t f = 0; f < w->n; f++) {
        size_t idx = 0;
        if (llmt_st_find(w->files[f], name, &idx) == LLMT_OK) {
            int dt = llmt_st_tensor_at(w->files[f], idx)->dtype;
            return dt == LLMT_DTYPE_BF16  ? LLMT_PRECISION_BF16_MIXED
                   : dt == LLMT_DTYPE_F16 ? LLMT_PRECISION_FP16_MIXED
                                          : LLMT_PRECISION_FP32;
        }
    }
    return LLMT_PRECISION_FP32; /* the missing tensor is reported by locate */
}

int llmt_model_create_from_hf(llmt_model **out, llmt_context *ctx, const char *dir,
                              int32_t precision, char *notes, size_t notes_cap)
{
    const char *fn = "llmt_model_create_from_hf";
    if (!out)
        return llmt_fail(LLMT_EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (!ctx || !dir)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, ctx ? "dir" : "ctx");
    if (!notes && notes_cap)
        return llmt_fail(LLMT_EINVAL, "%s: notes is NULL but notes_cap = %zu", fn, notes_cap);
    if (precision < LLMT_PRECISION_AS_SAVED || precision > LLMT_PRECISION_BF16_PURE)
        return llmt_fail(LLMT_EINVAL, "%s: precision = %d (-1 for the weights' dtype, or an "
                         "llmt_precision)", fn, precision);
    if (strlen(dir) > PATH_CAP - 300)
        return llmt_fail(LLMT_EINVAL, "%s: dir is longer than %d bytes", fn, PATH_CAP - 300);
    if (notes_cap)
        notes[0] = '\0';
    llmt_model_config cfg;
    LLMT_TRY(llmt_hf_config_read(dir, &cfg));
    weight_files w = {.dir = dir};
    int rc = open_files(&w);
    if (!rc)
        cfg.precision = precision >= 0 ? precision : saved_precision(&w);
    llmt_model *m = NULL;
    if (!rc && (rc = llmt_model_create(&m, ctx, &cfg)) != LLMT_OK)
        llmt_fail_prefix(rc, "%s/%s", dir, LLMT_HF_CONFIG);
    located *where = m ? calloc((size_t)m->n_params, sizeof *where) : NULL;
    if (!rc && !where)
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    if (!rc)
        rc = locate(m, &w, where, notes, notes_cap);
    if (!rc)
        rc = read_weights(m, &w, where);
    free(where);
    files_free(&w);
    if (rc) {
        llmt_model_free(m);
        return rc;
    }
    *out = m;
    return LLMT_OK;
}
