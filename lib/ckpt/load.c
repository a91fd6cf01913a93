#define _GNU_SOURCE
/* Loading a checkpoint into existing objects. Each file is read once, in
 * file order, straight into its destination (through a bounce buffer when
 * device memory is not host memory), and every byte is hashed on the way:
 * the whole file's XXH3-64 must equal the manifest's. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "util/fsutil.h"
#include "util/hash_pipe.h"
#include "ckpt/shards.h"
#include "ckpt/store_internal.h"
#include "core/context_internal.h"
#include "core/error.h"
#include "model/config_json.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"

#define READ_CHUNK ((size_t)64 << 20)

/* A tensor the file must hold, and where its bytes go. */
typedef struct want {
    const char *name;
    int dtype, ndim;
    int64_t shape[2];
    char *dst;       /* device address */
    uint64_t begin;  /* in the data region, once found */
    uint64_t bytes;
} want;

static int by_begin(const void *a, const void *b)
{
    uint64_t x = ((const want *)a)->begin, y = ((const want *)b)->begin;
    return (x > y) - (x < y);
}

/* Matches the file's tensors against wants (same set, dtype and shape). */
static int match_tensors(llmt_st_file *f, want *w, size_t n, const char *file)
{
    if (llmt_st_count(f) != n)
        return llmt_fail(LLMT_ECORRUPT, "file %s: %zu tensors, expected %zu", file,
                         llmt_st_count(f), n);
    for (size_t i = 0; i < n; i++) {
        size_t idx = 0;
        if (llmt_st_find(f, w[i].name, &idx))
            return llmt_fail(LLMT_ECORRUPT, "file %s: tensor \"%s\" is missing", file, w[i].name);
        const llmt_st_tensor *t = llmt_st_tensor_at(f, idx);
        if (t->dtype != w[i].dtype || t->ndim != w[i].ndim || t->shape[0] != (uint64_t)w[i].shape[0] ||
            (w[i].ndim == 2 && t->shape[1] != (uint64_t)w[i].shape[1]))
            return llmt_fail(LLMT_ECORRUPT, "file %s: tensor \"%s\" has dtype %s and another "
                             "shape than the objects it is loaded into (%s)", file, w[i].name,
                             llmt_dtype_name(t->dtype), llmt_dtype_name(w[i].dtype));
        w[i].begin = t->begin;
        w[i].bytes = t->end - t->begin;
    }
    return LLMT_OK;
}

/* Reads bytes at offset into the device address dst, queueing them for
 * hashing. Host memory is read in place and hashed there while the next
 * chunk is read; otherwise two bounce buffers alternate, each copied to the
 * device and hashed while the other is being filled. */
static int read_into(int fd, const char *path, const llmt_model *m, char *dst, uint64_t bytes,
                     uint64_t offset, llmt_hash_pipe *h, char *bounce[2], uint64_t ticket[2])
{
    for (int k = 0; bytes; k ^= 1) {
        size_t take = bytes < READ_CHUNK ? (size_t)bytes : READ_CHUNK;
        char *to = dst;
        if (!m->ops->host_memory) {
            llmt_hash_pipe_wait(h, ticket[k]); /* that buffer's last range is hashed */
            to = bounce[k];
        }
        LLMT_TRY(llmt_pread_all(fd, path, to, take, offset));
        ticket[k] = llmt_hash_pipe_push(h, to, take);
        if (!m->ops->host_memory)
            LLMT_TRY(m->ops->copy_to_device(m->dev, dst, to, take));
        dst += take;
        bytes -= take;
        offset += take;
    }
    return LLMT_OK;
}

/* A file that cannot be parsed or does not hold what the model needs
 * (status rc) is damage when its bytes are not the ones the manifest
 * lists (the header is read before the checksum is known): LLMT_ECORRUPT,
 * naming the file, so a resume falls back; else rc with its message. */
static int damaged_or(const char *path, const llmt_manifest_file *entry, int rc)
{
    char why[512];
    snprintf(why, sizeof why, "%s", llmt_error_last());
    uint64_t size = 0, digest = 0;
    if (llmt_hash_file(path, &size, &digest) == LLMT_OK &&
        (size != entry->bytes || digest != entry->xxh3))
        return llmt_fail(LLMT_ECORRUPT, "file %s: checksum mismatch (%s)", entry->name, why);
    return llmt_fail(rc, "%s", why);
}

/* Loads one safetensors file of the checkpoint into the wants. */
static int load_file(const char *dir, const llmt_manifest_file *entry, const llmt_model *m,
                     want *w, size_t n)
{
    size_t plen = strlen(dir) + strlen(entry->name) + 2;
    char *path = malloc(plen);
    char *head = NULL, *bounce[2] = {NULL, NULL};
    uint64_t ticket[2] = {0, 0};
    llmt_hash_pipe *h = NULL;
    llmt_st_file *f = NULL;
    int fd = -1, rc = path ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "out of memory");
    if (!rc) {
        snprintf(path, plen, "%s/%s", dir, entry->name);
        rc = llmt_st_open(path, NULL, &f);
    }
    if (!rc)
        rc = match_tensors(f, w, n, entry->name);
    if (rc && rc != LLMT_EIO && rc != LLMT_ENOMEM && path)
        rc = damaged_or(path, entry, rc);
    struct stat st;
    if (!rc && ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &st) != 0))
        rc = llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (!rc && (uint64_t)st.st_size != entry->bytes)
        rc = llmt_fail(LLMT_ECORRUPT, "file %s: size %lld, the manifest says %llu", entry->name,
                       (long long)st.st_size, (unsigned long long)entry->bytes);
    /* The header, then the data in file order: the tensors tile the data. */
    uint64_t data_start = rc ? 0
                          : n ? llmt_st_tensor_at(f, 0)->file_offset - llmt_st_tensor_at(f, 0)->begin
                              : (uint64_t)st.st_size;
    if (!rc && !(head = malloc(data_start)))
        rc = llmt_fail(LLMT_ENOMEM, "out of memory");
    if (!rc && !m->ops->host_memory &&
        (!(bounce[0] = malloc(READ_CHUNK)) || !(bounce[1] = malloc(READ_CHUNK))))
        rc = llmt_fail(LLMT_ENOMEM, "out of memory");
    if (!rc)
        rc = llmt_hash_pipe_start(&h);
    if (!rc) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        rc = llmt_pread_all(fd, path, head, (size_t)data_start, 0);
        if (!rc)
            llmt_hash_pipe_push(h, head, (size_t)data_start);
    }
    qsort(w, n, sizeof *w, by_begin);
    for (size_t i = 0; i < n && !rc;) {
        /* A run of tensors contiguous both in the file and in memory: one read. */
        size_t j = i + 1;
        while (j < n && w[j].begin == w[j - 1].begin + w[j - 1].bytes &&
               w[j].dst == w[j - 1].dst + w[j - 1].bytes)
            j++;
        uint64_t bytes = w[j - 1].begin + w[j - 1].bytes - w[i].begin;
        rc = read_into(fd, path, m, w[i].dst, bytes, data_start + w[i].begin, h, bounce, ticket);
        i = j;
    }
    uint64_t digest = h ? llmt_hash_pipe_finish(h) : 0;
    if (!rc && digest != entry->xxh3)
        rc = llmt_fail(LLMT_ECORRUPT, "file %s: checksum mismatch", entry->name);
    if (fd >= 0)
        close(fd);
    llmt_st_close(f);
    free(head);
    free(bounce[0]);
    free(bounce[1]);
    free(path);
    return rc;
}

/* The wants of the model's weights, or of one optimizer state section. */
static void wants_for(const llmt_model *m, char *base, int dtype, const char *suffix, char *names,
                      want *w)
{
    for (int32_t i = 0; i < m->n_params; i++) {
        const llmt_param *p = &m->params[i];
        char *name = names + (size_t)i * 128;
        snprintf(name, 128, "%s%s", p->name, suffix);
        w[i] = (want){name, dtype, p->ndim, {p->shape[0], p->shape[1]},
                      base + (size_t)p->offset * llmt_dtype_size(dtype), 0, 0};
    }
}

/* wants_for of optimizer state section sec, each tensor read to where o
 * keeps it (its host or device segment: no tensor straddles the split). */
static void opt_wants(const llmt_optimizer *o, int sec, const char *suffix, char *names, want *w)
{
    const llmt_model *m = o->model;
    int dt = sec == 2 ? LLMT_DTYPE_F32 : o->state_dt;
    for (int32_t i = 0; i < m->n_params; i++) {
        const llmt_param *p = &m->params[i];
        char *name = names + (size_t)i * 128;
        snprintf(name, 128, "%s%s", p->name, suffix);
        int64_t at = 0;
        char *base = llmt_offload_state_base(o, sec, p->offset, &at);
        w[i] = (want){name, dt, p->ndim, {p->shape[0], p->shape[1]},
                      base + (size_t)at * llmt_dtype_size(dt), 0, 0};
    }
}

/* Refuses objects that do not match what the checkpoint holds. */
static int check_match(const llmt_manifest *mf, const llmt_train_state *st)
{
    char a[32], b[32];
    const char *field = llmt_model_config_mismatch(&mf->model, &st->model->cfg, a, b, sizeof a);
    if (field)
        return llmt_fail(LLMT_EINVAL, "the checkpoint's model has %s = %s, this model %s", field, a, b);
    if (mf->model.precision != st->model->cfg.precision)
        return llmt_fail(LLMT_EINVAL, "the checkpoint's precision is %d, this model's %d",
                         mf->model.precision, st->model->cfg.precision);
    if (st->optimizer && !mf->has_optimizer)
        return llmt_fail(LLMT_EINVAL, "the checkpoint has no optimizer state to load");
    if (st->scaler && !mf->has_scaler)
        return llmt_fail(LLMT_EINVAL, "the checkpoint has no loss scaler state to load");
    if (st->loader && !mf->has_loader)
        return llmt_fail(LLMT_EINVAL, "the checkpoint has no data position to load");
    if (st->optimizer) {
        int rc = llmt_optimizer_config_check(&mf->optimizer, "the checkpoint's optimizer");
        if (rc)
            return llmt_fail_prefix(LLMT_ECORRUPT, "manifest");
    }
    return LLMT_OK;
}

int llmt_ckpt_load_tensors(const char *dir, const llmt_manifest *mf, const llmt_train_state *st)
{
    llmt_model *m = st->model;
    llmt_optimizer *o = st->optimizer;
    int sections = o ? (o->has_master ? 3 : 2) : 0;
    size_t n = (size_t)m->n_params;
    want *w = malloc(n * (size_t)(sections > 1 ? sections : 1) * sizeof *w);
    char *names = malloc(n * (size_t)(sections > 1 ? sections : 1) * 128);
    int rc = w && names ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "out of memory");
    const llmt_manifest_file *mfile = llmt_manifest_find(mf, CKPT_MODEL_FILE);
    const llmt_manifest_file *ofile = llmt_manifest_find(mf, CKPT_OPTIMIZER_FILE);
    if (!rc && !mfile)
        rc = llmt_fail(LLMT_ECORRUPT, "manifest: %s not listed", CKPT_MODEL_FILE);
    if (!rc) {
        wants_for(m, m->weights.ptr, m->dt, "", names, w);
        rc = load_file(dir, mfile, m, w, n);
    }
    if (!rc && o && mf->format == LLMT_MANIFEST_FORMAT_SHARDED)
        rc = llmt_ckpt_shard_read(dir, mf, o);
    else if (!rc && o) {
        static const char *const suffix[3] = {".exp_avg", ".exp_avg_sq", ".master"};
        for (int sec = 0; sec < sections; sec++)
            opt_wants(o, sec, suffix[sec], names + (size_t)sec * n * 128, w + sec * n);
        rc = ofile ? load_file(dir, ofile, m, w, n * (size_t)sections)
                   : llmt_fail(LLMT_ECORRUPT, "manifest: %s not listed", CKPT_OPTIMIZER_FILE);
    }
    free(w);
    free(names);
    return rc;
}

int llmt_ckpt_load_user(const char *dir, const llmt_manifest *mf, void *buf, size_t cap,
                        size_t *size)
{
    const llmt_manifest_file *f = llmt_manifest_find(mf, CKPT_USER_FILE);
    if (size)
        *size = f ? (size_t)f->bytes : 0;
    if (!f || !cap)
        return LLMT_OK;
    if (cap < f->bytes)
        return llmt_fail(LLMT_EINVAL, "user_cap = %zu, the blob has %llu bytes", cap,
                         (unsigned long long)f->bytes);
    size_t plen = strlen(dir) + sizeof CKPT_USER_FILE + 1;
    char *path = malloc(plen), *data = NULL;
    size_t len = 0;
    int rc = path ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "out of memory");
    if (!rc) {
        snprintf(path, plen, "%s/%s", dir, CKPT_USER_FILE);
        rc = llmt_read_file(path, (size_t)f->bytes, &data, &len);
    }
    if (!rc && (len != f->bytes || XXH3_64bits(data, len) != f->xxh3))
        rc = llmt_fail(LLMT_ECORRUPT, "file %s: size or checksum mismatch", CKPT_USER_FILE);
    if (!rc)
        memcpy(buf, data, len);
    free(data);
    free(path);
    return rc;
}

/* Restores what is not tensors. */
static int restore_state(const llmt_manifest *mf, llmt_train_state *st)
{
    llmt_model *m = st->model;
    m->weights_epoch++; /* weights changed: a mixed-precision master elsewhere resyncs */
    if (st->optimizer) {
        st->optimizer->cfg = mf->optimizer;
        st->optimizer->steps = mf->optimizer_steps;
        st->optimizer->weights_epoch = m->weights_epoch; /* its master was loaded too */
    }
    int rc = LLMT_OK;
    if (st->scaler)
        rc = llmt_loss_scaler_set_state(st->scaler, &mf->scaler);
    if (!rc)
        rc = llmt_context_rng_set(m->ctx, &mf->context_rng);
    if (!rc && st->loader)
        rc = llmt_loader_set_state(st->loader, &mf->loader);
    st->step = mf->step;
    st->tokens_seen = mf->tokens_seen;
    return rc;
}

int llmt_ckpt_load(llmt_ckpt_store *s, int64_t step, int32_t tier, llmt_train_state *state,
                   void *user_buf, size_t user_cap, size_t *user_size)
{
    const char *fn = "llmt_ckpt_load";
    if (!s || !state || !state->model || (user_cap && !user_buf))
        return llmt_fail(LLMT_EINVAL, "%s: %s", fn, !s ? "store is NULL" : !state ? "state is NULL"
                         : !state->model ? "state->model is NULL" : "user_buf is NULL");
    if (state->version != LLMT_TRAIN_STATE_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: state->version = %u, this library knows %u", fn,
                         state->version, LLMT_TRAIN_STATE_VERSION);
    if ((tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST) || !s->dir[tier] || step < 0)
        return llmt_fail(LLMT_EINVAL, "%s: no tier %d in this store, or step %lld < 0", fn, tier,
                         (long long)step);
    if (state->optimizer && state->optimizer->comm)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: state->optimizer is sharded: a data-parallel "
                         "run resumes through llmt_trainer_resume_latest", fn);
    int rc = llmt_ckpt_join(s);
    if (rc)
        return rc;
    llmt_manifest mf;
    rc = llmt_ckpt_read_manifest(s, step, tier, &mf);
    if (rc)
        return rc;
    char name[64];
    llmt_ckpt_dirname(name, sizeof name, step);
    char *dir = llmt_ckpt_file(s, tier, step, NULL);
    rc = dir ? check_match(&mf, state) : llmt_fail(LLMT_ENOMEM, "out of memory");
    if (!rc)
        rc = llmt_ckpt_load_tensors(dir, &mf, state);
    if (!rc)
        rc = llmt_ckpt_load_user(dir, &mf, user_buf, user_cap, user_size);
    if (!rc)
        rc = restore_state(&mf, state);
    if (rc)
        llmt_fail_prefix(rc, "checkpoint %s (%s)", name, tier ? "fast" : "durable");
    else
        s->committed[tier] = step; /* every byte checked: what a save need not repeat */
    free(dir);
    llmt_manifest_clear(&mf);
    return rc;
}
