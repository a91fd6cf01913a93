/* llmt_model_export_hf: a model as a Hugging Face directory (config.json,
 * safetensors weights, single or sharded with an index, tokenizer files),
 * built in a temporary directory and renamed into place. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
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
/* Tokenizer files are copied whole; the largest real ones are tens of MiB. */
#define TOKENIZER_MAX_BYTES ((size_t)1 << 30)

/* The tokenizer files copied when present. */
static const char *const tokenizer_files[] = {
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json",
};

/* dir/name into out (PATH_CAP bytes); LLMT_EINVAL when it does not fit. */
static int join(char *out, const char *dir, const char *name)
{
    if ((size_t)snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return llmt_fail(LLMT_EINVAL, "%s/%s: path longer than %d bytes", dir, name, PATH_CAP);
    return LLMT_OK;
}

void llmt_hf_export_options_init(llmt_hf_export_options *opts)
{
    if (opts) {
        const llmt_hf_export_options defaults = LLMT_HF_EXPORT_OPTIONS_INIT;
        *opts = defaults;
    }
}

/* One shard: parameters [first, first + count) of the table. */
typedef struct shard {
    int32_t first, count;
} shard;

typedef struct export_job {
    const llmt_model *m;
    int dtype;     /* on disk */
    int32_t first; /* table index of the shard's tensor 0 */
    float *tmp;    /* LLMT_TRANSFER_CHUNK floats */
} export_job;

/* Produces bytes of the shard's tensor ti in the disk dtype. */
static int fill_tensor(void *user, size_t ti, size_t byte_offset, void *dst, size_t bytes)
{
    const export_job *job = user;
    const llmt_param *p = &job->m->params[job->first + (int32_t)ti];
    return llmt_transfer_weights_out(job->m, p->offset, job->dtype, byte_offset, bytes, dst,
                                     job->tmp);
}

static uint64_t param_bytes(const llmt_model *m, int32_t i, int dtype)
{
    return (uint64_t)m->params[i].numel * llmt_dtype_size(dtype);
}

/* Splits the table, in order, into shards of at most max tensor bytes (0:
 * one shard); a tensor larger than max gets a shard alone. shards holds
 * n_params entries; returns the count. */
static int32_t plan_shards(const llmt_model *m, int dtype, uint64_t max, shard *shards)
{
    int32_t n = 0;
    uint64_t used = 0;
    for (int32_t i = 0; i < m->n_params; i++) {
        uint64_t b = param_bytes(m, i, dtype);
        if (n == 0 || (max && used + b > max)) {
            shards[n++] = (shard){i, 0};
            used = 0;
        }
        shards[n - 1].count++;
        used += b;
    }
    return n;
}

/* The file name of shard k of n (model.safetensors when n is 1). */
static void shard_name(char *buf, size_t cap, int32_t k, int32_t n)
{
    if (n == 1)
        snprintf(buf, cap, "%s", LLMT_HF_WEIGHTS);
    else /* n <= n_params: the name fits (names are 38 bytes up to 99999 shards) */
        (void)(snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, n) < 0);
}

static int write_shard(const llmt_model *m, const char *path, const shard *s, export_job *job)
{
    llmt_st_write_tensor *t = calloc((size_t)s->count, sizeof *t);
    if (!t)
        return llmt_fail(LLMT_ENOMEM, "%s: out of host memory", path);
    for (int32_t i = 0; i < s->count; i++) {
        const llmt_param *p = &m->params[s->first + i];
        t[i] = (llmt_st_write_tensor){.name = p->name, .dtype = job->dtype, .ndim = p->ndim,
                                      .fill = fill_tensor, .user = job};
        t[i].shape[0] = (uint64_t)p->shape[0];
        t[i].shape[1] = (uint64_t)p->shape[1];
    }
    job->first = s->first;
    /* from_pretrained refuses safetensors files whose format is not "pt". */
    const llmt_st_meta meta[1] = {{"format", "pt"}};
    int rc = llmt_st_write(path, t, (size_t)s->count, meta, 1, NULL, NULL);
    free(t);
    return rc;
}

/* model.safetensors.index.json: {"metadata": {"total_size": bytes},
 * "weight_map": {tensor: shard file}}. */
static int write_index(const llmt_model *m, const char *path, const shard *shards, int32_t n,
                       int dtype)
{
    uint64_t total = 0;
    for (int32_t i = 0; i < m->n_params; i++)
        total += param_bytes(m, i, dtype);
    llmt_jw w;
    llmt_jw_init(&w);
    llmt_jw_begin_object(&w);
    llmt_jw_key(&w, "metadata", strlen("metadata"));
    llmt_jw_begin_object(&w);
    llmt_jw_key(&w, "total_size", strlen("total_size"));
    llmt_jw_uint64(&w, total);
    llmt_jw_end_object(&w);
    llmt_jw_key(&w, "weight_map", strlen("weight_map"));
    llmt_jw_begin_object(&w);
    for (int32_t k = 0; k < n; k++) {
        char name[64];
        shard_name(name, sizeof name, k, n);
        for (int32_t i = shards[k].first; i < shards[k].first + shards[k].count; i++) {
            llmt_jw_key(&w, m->params[i].name, strlen(m->params[i].name));
            llmt_jw_string(&w, name, strlen(name));
        }
    }
    llmt_jw_end_object(&w);
    llmt_jw_end_object(&w);
    const char *text = NULL;
    size_t len = 0;
    int rc = llmt_jw_finish(&w, &text, &len);
    if (!rc)
        rc = llmt_write_file(path, text, len, 1, NULL);
    llmt_jw_free(&w);
    return rc;
}

/* Copies the tokenizer files src holds into tmp; src must hold at least one. */
static int copy_tokenizer(const char *src, const char *tmp)
{
    int copied = 0;
    for (size_t i = 0; i < sizeof tokenizer_files / sizeof *tokenizer_files; i++) {
        char from[PATH_CAP], to[PATH_CAP];
        LLMT_TRY(join(from, src, tokenizer_files[i]));
        LLMT_TRY(join(to, tmp, tokenizer_files[i]));
        struct stat st;
        if (stat(from, &st) != 0 && errno == ENOENT)
            continue;
        char *data = NULL;
        size_t len = 0;
        LLMT_TRY(llmt_read_file(from, TOKENIZER_MAX_BYTES, &data, &len));
        int rc = llmt_write_file(to, data, len, 1, NULL);
        free(data);
        LLMT_TRY(rc);
        copied++;
    }
    if (!copied)
        return llmt_fail(LLMT_EINVAL, "%s: tokenizer_dir holds none of tokenizer.json, "
                         "tokenizer.model, tokenizer_config.json, special_tokens_map.json, "
                         "added_tokens.json", src);
    return LLMT_OK;
}

/* Everything but the final rename, into the temporary directory tmp. */
static int write_all(const llmt_model *m, const char *tmp, const llmt_hf_export_options *o)
{
    char path[PATH_CAP];
    shard *shards = calloc((size_t)m->n_params, sizeof *shards);
    export_job job = {m, o->dtype, 0, malloc((size_t)LLMT_TRANSFER_CHUNK * sizeof(float))};
    int rc = shards && job.tmp ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "%s: out of host memory", tmp);
    int32_t n = rc ? 0 : plan_shards(m, o->dtype, o->max_shard_bytes, shards);
    for (int32_t k = 0; k < n && !rc; k++) {
        char name[64];
        shard_name(name, sizeof name, k, n);
        rc = join(path, tmp, name);
        if (!rc)
            rc = write_shard(m, path, &shards[k], &job);
    }
    if (!rc && n > 1 && !(rc = join(path, tmp, LLMT_HF_INDEX)))
        rc = write_index(m, path, shards, n, o->dtype);
    if (!rc && !(rc = join(path, tmp, LLMT_HF_CONFIG)))
        rc = llmt_hf_config_write(path, &m->cfg, o);
    if (!rc && o->tokenizer_dir)
        rc = copy_tokenizer(o->tokenizer_dir, tmp);
    if (!rc)
        rc = llmt_sync_dir(tmp);
    free(shards);
    free(job.tmp);
    return rc;
}

/* Refuses a dir that exists and is not an empty directory. */
static int check_target(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) != 0)
        return errno == ENOENT ? LLMT_OK
                               : llmt_fail(LLMT_EIO, "%s: cannot stat: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return llmt_fail(LLMT_EINVAL, "%s: exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", dir, strerror(errno));
    int entries = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    if (entries)
        return llmt_fail(LLMT_EINVAL, "%s: exists and is not empty (export writes a new "
                         "directory; remove it or choose another)", dir);
    return LLMT_OK;
}

static int check_options(const llmt_hf_export_options *o, const char *fn)
{
    if (o->version != LLMT_HF_EXPORT_OPTIONS_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: opts->version = %u, this library knows %u", fn,
                         o->version, LLMT_HF_EXPORT_OPTIONS_VERSION);
    if (o->dtype != LLMT_DTYPE_F32 && o->dtype != LLMT_DTYPE_BF16 && o->dtype != LLMT_DTYPE_F16)
        return llmt_fail(LLMT_EINVAL, "%s: opts->dtype = %d (must be F32, BF16 or F16)", fn,
                         o->dtype);
    if (o->bos_token_id < -1 || o->eos_token_id < -1)
        return llmt_fail(LLMT_EINVAL, "%s: opts->%s_token_id = %d (must be >= -1)", fn,
                         o->bos_token_id < -1 ? "bos" : "eos",
                         o->bos_token_id < -1 ? o->bos_token_id : o->eos_token_id);
    struct stat st;
    if (o->tokenizer_dir && (stat(o->tokenizer_dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        return llmt_fail(LLMT_EINVAL, "%s: opts->tokenizer_dir = %s is not a directory", fn,
                         o->tokenizer_dir);
    return LLMT_OK;
}

int llmt_model_export_hf(const llmt_model *m, const char *dir, const llmt_hf_export_options *opts)
{
    const char *fn = "llmt_model_export_hf";
    if (!m || !dir || !*dir)
        return llmt_fail(LLMT_EINVAL, "%s: %s is %s", fn, m ? "dir" : "model",
                         m && dir ? "empty" : "NULL");
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    if (opts)
        o = *opts;
    LLMT_TRY(check_options(&o, fn));
    char target[PATH_CAP], tmp[PATH_CAP];
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/')
        len--;
    if (len + 300 >= sizeof target)
        return llmt_fail(LLMT_EINVAL, "%s: dir is longer than %d bytes", fn, PATH_CAP - 300);
    memcpy(target, dir, len);
    target[len] = '\0';
    LLMT_TRY(check_target(target));
    memcpy(tmp, target, len);
    memcpy(tmp + len, ".tmp-XXXXXX", sizeof ".tmp-XXXXXX");
    if (!mkdtemp(tmp))
        return llmt_fail(LLMT_EIO, "%s: cannot create a temporary directory beside it: %s",
                         target, strerror(errno));
    int rc = write_all(m, tmp, &o);
    /* rename replaces an empty directory and fails on anything else, so a
     * directory that appeared meanwhile is not overwritten. */
    if (!rc && rename(tmp, target) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: cannot rename %s into place: %s", target, tmp,
                       strerror(errno));
    if (!rc)
        rc = llmt_sync_parent(target);
    else
        llmt_remove_tree(tmp);
    if (rc)
        llmt_fail_prefix(rc, "%s", fn);
    return rc;
}
