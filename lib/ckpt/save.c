/* Saving a checkpoint: gathering the state (in place, or copied into the
 * staging buffer for an async save), writing its files into a temporary
 * directory, committing it by rename, and rotating. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/fsutil.h"
#include "ckpt/device_fill.h"
#include "ckpt/shards.h"
#include "ckpt/store_internal.h"
#include "core/context_internal.h"
#include "core/error.h"
#include "model/config_json.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "util/task.h"

/* The optimizer's state tensors, in file order: name suffixes. */
static const char *const state_suffix[3] = {".exp_avg", ".exp_avg_sq", ".master"};

/* Fills the tensor table of one file: entry i is parameter i % n_params of
 * section i / n_params, whose bytes start at bases[section] + offset, or
 * where the optimizer `placed` keeps them (its host or device segment) when
 * not NULL. */
static int build_tensors(const llmt_model *m, int sections, const char *const *bases,
                         const llmt_optimizer *placed, const int *dtypes,
                         const char *const *suffixes, int host, char **names_at,
                         llmt_st_write_tensor *t, llmt_ckpt_device_src *src)
{
    for (int sec = 0; sec < sections; sec++)
        for (int32_t i = 0; i < m->n_params; i++) {
            const llmt_param *p = &m->params[i];
            llmt_st_write_tensor *x = &t[sec * m->n_params + i];
            int n = sprintf(*names_at, "%s%s", p->name, suffixes ? suffixes[sec] : "");
            x->name = *names_at;
            *names_at += n + 1;
            x->dtype = dtypes[sec];
            x->ndim = p->ndim;
            x->shape[0] = (uint64_t)p->shape[0];
            x->shape[1] = (uint64_t)p->shape[1];
            int64_t at_elem = p->offset;
            const char *base = placed ? llmt_offload_state_base(placed, sec, p->offset, &at_elem)
                                      : bases[sec];
            const char *at = base + (size_t)at_elem * llmt_dtype_size(dtypes[sec]);
            if (host) {
                x->data = at;
            } else {
                x->fill = llmt_ckpt_fill_from_device;
                x->user = src;
                src[sec * m->n_params + i] = (llmt_ckpt_device_src){.m = m, .base = at};
            }
        }
    return LLMT_OK;
}

void llmt_ckpt_snapshot_free(ckpt_snapshot *snap)
{
    llmt_manifest_clear(&snap->manifest);
    if (snap->model_tensors && snap->model_tensors[0].fill)
        free(snap->model_tensors[0].user);
    if (snap->opt_tensors && snap->opt_tensors[0].fill)
        free(snap->opt_tensors[0].user);
    free(snap->model_tensors);
    free(snap->opt_tensors);
    free(snap->names);
    free(snap->model_meta_config);
    memset(snap, 0, sizeof *snap);
}

/* The manifest's fields other than the file list. */
static int fill_manifest(const llmt_train_state *st, llmt_manifest *m)
{
    const llmt_model *model = st->model;
    snprintf(m->library_version, sizeof m->library_version, "%s", LLMT_VERSION_STRING);
    m->format = LLMT_MANIFEST_FORMAT;
    m->step = st->step;
    m->tokens_seen = st->tokens_seen;
    uint64_t epoch = 0;
    if (st->loader)
        llmt_loader_epoch(st->loader, &epoch); /* cannot fail: both given */
    m->epoch = (int64_t)epoch;
    m->model = model->cfg;
    if (st->optimizer) {
        m->has_optimizer = 1;
        m->optimizer = st->optimizer->cfg;
        m->optimizer_steps = st->optimizer->steps;
    }
    int rc = LLMT_OK;
    if (st->scaler) {
        m->has_scaler = 1;
        m->scaler.version = LLMT_LOSS_SCALER_STATE_VERSION;
        rc = llmt_loss_scaler_get_config(st->scaler, &m->scaler_config);
        if (!rc)
            rc = llmt_loss_scaler_get_state(st->scaler, &m->scaler);
    }
    if (!rc)
        rc = llmt_context_rng_get(model->ctx, &m->context_rng);
    if (!rc && st->loader) {
        m->has_loader = 1;
        m->loader.version = LLMT_LOADER_STATE_VERSION;
        rc = llmt_loader_get_state(st->loader, &m->loader);
    }
    if (!rc && st->config_yaml && !(m->config_yaml = strdup(st->config_yaml)))
        rc = llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory");
    return rc;
}

/* Copies the tensors and the blob into the store's staging buffer (grown to
 * fit, and kept: a buffer reused save after save is already paged in) and
 * returns the host addresses of each part. */
static int stage(llmt_ckpt_store *s, const llmt_train_state *st, const char **w,
                 const char **opt, const void **user)
{
    const llmt_model *m = st->model;
    const llmt_optimizer *o = st->optimizer;
    /* Each state section is its host segment, then its device segment. */
    const llmt_buf *host[4] = {NULL, o ? &o->hm : NULL, o ? &o->hv : NULL, o ? &o->hmaster : NULL};
    const llmt_buf *dev[4] = {&m->weights, o ? &o->m : NULL, o ? &o->v : NULL,
                              o ? &o->master : NULL};
    size_t parts[5] = {0, 0, 0, 0, st->user_blob_size};
    size_t total = parts[4];
    for (int i = 0; i < 4; i++) {
        parts[i] = (host[i] ? host[i]->bytes : 0) + (dev[i] ? dev[i]->bytes : 0);
        total += parts[i];
    }
    if (s->staging.bytes != total) {
        llmt_buf_free(s->ctx, &s->staging);
        LLMT_TRY(llmt_buf_alloc(s->ctx, &s->staging, LLMT_MEM_STAGING, total, "checkpoint staging"));
    }
    char *at = s->staging.ptr;
    for (int i = 0; i < 4; i++) {
        size_t hb = host[i] ? host[i]->bytes : 0;
        if (hb)
            LLMT_TRY(m->ops->copy_to_host(m->dev, at, host[i]->ptr, hb));
        if (dev[i] && dev[i]->bytes)
            LLMT_TRY(m->ops->copy_to_host(m->dev, at + hb, dev[i]->ptr, dev[i]->bytes));
        if (i == 0)
            *w = at;
        else
            opt[i - 1] = at;
        at += parts[i];
    }
    if (parts[4])
        memcpy(at, st->user_blob, parts[4]);
    *user = at;
    return LLMT_OK;
}

int llmt_ckpt_snapshot(llmt_ckpt_store *s, const llmt_train_state *st, int tier, int staging,
                       ckpt_snapshot *snap)
{
    memset(snap, 0, sizeof *snap);
    snap->tier = tier;
    const llmt_model *m = st->model;
    const llmt_optimizer *o = st->optimizer;
    int sections = o ? (o->has_master ? 3 : 2) : 0;
    size_t np = m->n_params > 0 ? (size_t)m->n_params : 0;
    size_t name_bytes = 0;
    for (int32_t i = 0; i < m->n_params; i++)
        name_bytes += (strlen(m->params[i].name) + 16) * (size_t)(1 + sections);
    snap->names = malloc(name_bytes);
    snap->model_tensors = calloc(np, sizeof *snap->model_tensors);
    snap->opt_tensors = sections ? calloc((size_t)sections * np, sizeof *snap->opt_tensors) : NULL;
    int host = staging || m->ops->host_memory;
    llmt_ckpt_device_src *msrc = host ? NULL : calloc(np, sizeof *msrc);
    llmt_ckpt_device_src *osrc =
        host || !sections ? NULL : calloc((size_t)sections * np, sizeof *osrc);
    int rc = LLMT_OK;
    if (!snap->names || !snap->model_tensors || (sections && !snap->opt_tensors) ||
        (!host && (!msrc || (sections && !osrc)))) {
        free(msrc);
        free(osrc);
        rc = llmt_fail(LLMT_ENOMEM, "checkpoint: out of host memory");
    }
    if (!rc)
        rc = fill_manifest(st, &snap->manifest);
    const char *w = m->weights.ptr;
    const char *opt[3] = {o ? o->m.ptr : NULL, o ? o->v.ptr : NULL, o ? o->master.ptr : NULL};
    snap->user = st->user_blob;
    if (!rc && staging)
        rc = stage(s, st, &w, opt, &snap->user);
    snap->user_size = st->user_blob_size;
    if (!rc) {
        char *names_at = snap->names;
        const int wdt[1] = {m->dt};
        const int odt[3] = {o ? o->state_dt : 0, o ? o->state_dt : 0, LLMT_DTYPE_F32};
        build_tensors(m, 1, &w, NULL, wdt, NULL, host, &names_at, snap->model_tensors, msrc);
        snap->n_model = np;
        if (sections) {
            /* Unstaged, each tensor is read where the optimizer keeps it:
             * split is a parameter boundary, so no tensor straddles it. */
            build_tensors(m, sections, opt, staging ? NULL : o, odt, state_suffix, host,
                          &names_at, snap->opt_tensors, osrc);
            snap->n_opt = (size_t)sections * np;
        }
    }
    if (!rc) {
        llmt_jw jw;
        llmt_jw_init(&jw);
        const char *text = NULL;
        size_t len = 0;
        rc = llmt_model_config_write_json(&jw, &m->cfg);
        if (!rc)
            rc = llmt_jw_finish(&jw, &text, &len);
        if (!rc && !(snap->model_meta_config = strdup(text)))
            rc = llmt_fail(LLMT_ENOMEM, "checkpoint: out of host memory");
        llmt_jw_free(&jw);
    }
    if (rc)
        llmt_ckpt_snapshot_free(snap);
    return rc;
}

/* ---- committing */

char *llmt_ckpt_fresh_dir(const char *dir, const char *name, const char *tag)
{
    size_t n = strlen(dir) + strlen(name) + strlen(tag) + 12;
    char *p = malloc(n);
    if (p) {
        snprintf(p, n, "%s/%s.%s-XXXXXX", dir, name, tag);
        if (!mkdtemp(p)) {
            llmt_fail(LLMT_EIO, "%s: cannot create a directory: %s", dir, strerror(errno));
            free(p);
            return NULL;
        }
    } else {
        llmt_fail(LLMT_ENOMEM, "out of memory");
    }
    return p;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* One safetensors file of the checkpoint (a task's argument). */
typedef struct tensor_file {
    const char *tmp, *file;
    const llmt_st_write_tensor *t;
    size_t n;
    const llmt_st_meta *meta;
    size_t n_meta;
    int sync;
    llmt_manifest_file *entry; /* filled once the file is written */
} tensor_file;

static int write_tensors(void *arg)
{
    const tensor_file *w = arg;
    char *path = join(w->tmp, w->file);
    if (!path)
        return llmt_fail(LLMT_ENOMEM, "out of memory");
    llmt_st_write_opts opts = LLMT_ST_WRITE_OPTS_INIT;
    opts.durable = w->sync;
    llmt_st_write_result res = {0, 0, NULL, 0};
    int rc = llmt_st_write(path, w->t, w->n, w->meta, w->n_meta, &opts, &res);
    if (!rc) {
        snprintf(w->entry->name, sizeof w->entry->name, "%s", w->file);
        w->entry->bytes = res.file_bytes;
        w->entry->xxh3 = res.xxh3;
    }
    free(path);
    return rc;
}

/* Writes the files of snap other than MANIFEST into the empty directory
 * tmp, listing them in snap's manifest: the optimizer state (on a thread
 * of its own) and the weights at once where both are in host memory,
 * else one after the other (device copies stay on this thread; a failure
 * stops there); then the user blob. */
static int write_data(const char *tmp, ckpt_snapshot *snap, int sync)
{
    llmt_manifest *m = &snap->manifest;
    m->n_files = 0;
    const llmt_st_meta meta[2] = {{"format", "pt"}, {"llmt.model_config", snap->model_meta_config}};
    tensor_file model = {tmp, CKPT_MODEL_FILE, snap->model_tensors, snap->n_model, meta, 2, sync,
                         &m->files[0]};
    tensor_file opt = {tmp, CKPT_OPTIMIZER_FILE, snap->opt_tensors, snap->n_opt, meta, 1, sync,
                       &m->files[1]};
    const int host = (!snap->n_model || !snap->model_tensors[0].fill) &&
                     (!snap->n_opt || !snap->opt_tensors[0].fill);
    int rc = snap->n_opt ? llmt_task_pair(write_tensors, &opt, write_tensors, &model, host)
                         : write_tensors(&model);
    if (rc)
        return rc;
    m->n_files = snap->n_opt ? 2 : 1;
    if (snap->user_size) {
        char *path = join(tmp, CKPT_USER_FILE);
        llmt_manifest_file *f = &m->files[m->n_files];
        rc = path ? llmt_write_file(path, snap->user, snap->user_size, sync, &f->xxh3)
                  : llmt_fail(LLMT_ENOMEM, "out of memory");
        free(path);
        if (rc)
            return rc;
        snprintf(f->name, sizeof f->name, "%s", CKPT_USER_FILE);
        f->bytes = snap->user_size;
        m->n_files++;
    }
    return LLMT_OK;
}

/* Writes text (len bytes) as tmp's MANIFEST, last, and makes tmp's entries
 * durable. */
static int write_manifest_text(const char *tmp, const char *text, size_t len, int sync)
{
    char *path = join(tmp, CKPT_MANIFEST_FILE);
    int rc = path ? llmt_write_file(path, text, len, sync, NULL)
                  : llmt_fail(LLMT_ENOMEM, "out of memory");
    free(path);
    return !rc && sync ? llmt_sync_dir(tmp) : rc;
}

/* Writes m as tmp's MANIFEST (write_manifest_text). */
static int write_manifest(const char *tmp, const llmt_manifest *m, int sync)
{
    char *text = NULL;
    size_t len = 0;
    int rc = llmt_manifest_format(m, &text, &len);
    if (!rc)
        rc = write_manifest_text(tmp, text, len, sync);
    free(text);
    return rc;
}

int llmt_ckpt_write_dir(const char *tmp, ckpt_snapshot *snap, int sync)
{
    LLMT_TRY(write_data(tmp, snap, sync));
    return write_manifest(tmp, &snap->manifest, sync);
}

/* Deletes checkpoint step of tier: first renamed to a temporary name, so a
 * crash part-way leaves something the next open removes rather than a
 * damaged checkpoint. */
static int remove_step(const llmt_ckpt_store *s, int tier, int64_t step)
{
    char name[64];
    llmt_ckpt_dirname(name, sizeof name, step);
    char *victim = llmt_ckpt_file(s, tier, step, NULL);
    char *gone = victim ? llmt_ckpt_fresh_dir(s->dir[tier], name, "tmp") : NULL;
    int rc = LLMT_OK;
    if (!gone)
        rc = victim ? LLMT_EIO : llmt_fail(LLMT_ENOMEM, "out of memory");
    else if (rename(victim, gone) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: cannot move aside for deletion: %s", victim, strerror(errno));
    else
        rc = llmt_remove_tree(gone);
    free(victim);
    free(gone);
    return rc;
}

/* Deletes the oldest checkpoints of tier beyond keep, never `protect`.
 * Checkpoints llmt_ckpt_latest refused are neither counted nor deleted: a
 * damaged one must not crowd out a valid one. */
static int rotate(const llmt_ckpt_store *s, int tier, int64_t protect)
{
    size_t n = 0, kept = 0;
    int64_t *steps = NULL;
    int rc = llmt_ckpt_scan(s, tier, &steps, &n, NULL, 0);
    for (size_t i = 0; !rc && i < n; i++) /* the candidates, in place */
        if (!llmt_ckpt_is_refused(s, tier, steps[i]))
            steps[kept++] = steps[i];
    n = rc ? 0 : kept;
    for (size_t i = 0; !rc && n - i > (size_t)s->keep[tier]; i++)
        if (steps[i] != protect)
            rc = remove_step(s, tier, steps[i]);
    free(steps);
    return rc;
}

int llmt_ckpt_keep_only(llmt_ckpt_store *s, int32_t tier, const int64_t *keep, size_t n_keep)
{
    size_t n = 0;
    int64_t *steps = NULL;
    int rc = llmt_ckpt_scan(s, tier, &steps, &n, NULL, 0);
    for (size_t i = 0; !rc && i < n; i++) {
        size_t k = 0;
        while (k < n_keep && keep[k] != steps[i])
            k++;
        if (k == n_keep)
            rc = remove_step(s, tier, steps[i]);
    }
    free(steps);
    return rc;
}

/* Commits tmp, complete (or rc, the failure that stopped writing it), as
 * checkpoint step of tier: rename, fsync, and with rotation the rotation;
 * tmp is removed when that fails. */
static int publish(llmt_ckpt_store *s, int tier, int64_t step, const char *tmp, int rc,
                   int rotation)
{
    int sync = s->sync[tier];
    const char *dir = s->dir[tier];
    char name[64];
    llmt_ckpt_dirname(name, sizeof name, step);
    char *final = llmt_ckpt_file(s, tier, step, NULL);
    char *old = NULL;
    if (!rc && !final)
        rc = llmt_fail(LLMT_ENOMEM, "out of memory");
    struct stat st;
    if (!rc && lstat(final, &st) == 0 && !S_ISDIR(st.st_mode)) /* not ours to remove */
        rc = llmt_fail(LLMT_EIO, "%s exists and is not a directory (not a checkpoint): remove "
                       "or rename it", final);
    /* The same step again (or a damaged one under its name): the old one is
     * moved aside, replaced, then removed; a crash in between leaves it to be
     * put back or removed by the next open. */
    if (!rc && lstat(final, &st) == 0) {
        old = llmt_ckpt_fresh_dir(dir, name, "old");
        if (!old || rename(final, old) != 0)
            rc = old ? llmt_fail(LLMT_EIO, "%s: cannot move aside: %s", final, strerror(errno)) : LLMT_EIO;
    }
    if (!rc && rename(tmp, final) != 0) {
        rc = llmt_fail(LLMT_EIO, "%s: cannot rename into place: %s", final, strerror(errno));
        if (old)
            rename(old, final); /* put the previous one back */
    }
    if (!rc && sync)
        rc = llmt_sync_dir(dir);
    if (rc) {
        char why[1024];
        llmt_fail_prefix(rc, "checkpoint %s", name);
        snprintf(why, sizeof why, "%s", llmt_error_last());
        if (tmp)
            llmt_remove_tree(tmp); /* may fail in turn: the first error is the one to tell */
        llmt_fail(rc, "%s", why);
    } else {
        if (old)
            llmt_remove_tree(old);
        s->committed[tier] = step;
        llmt_ckpt_forget_refused(s, tier, step); /* replaced by a valid one */
        rc = rotation ? rotate(s, tier, step) : LLMT_OK;
    }
    free(final);
    free(old);
    return rc;
}

int llmt_ckpt_commit(llmt_ckpt_store *s, ckpt_snapshot *snap)
{
    int tier = snap->tier, sync = s->sync[tier];
    char name[64];
    llmt_ckpt_dirname(name, sizeof name, snap->manifest.step);
    char *tmp = llmt_ckpt_fresh_dir(s->dir[tier], name, "tmp");
    int rc = tmp ? llmt_ckpt_write_dir(tmp, snap, sync) : LLMT_EIO;
    rc = publish(s, tier, snap->manifest.step, tmp, rc, 1);
    free(tmp);
    return rc;
}

/* ---- sharded saves (format 2; the protocol is in lib/train/dist_ckpt.c) */

int llmt_ckpt_sharded_begin(llmt_ckpt_store *s, const llmt_train_state *st, int32_t tier,
                            ckpt_snapshot *snap, char **tmp)
{
    *tmp = NULL;
    memset(snap, 0, sizeof *snap);
    const llmt_optimizer *o = st->optimizer;
    llmt_train_state common = *st; /* everything but the optimizer's tensors */
    common.optimizer = NULL;
    LLMT_TRY(llmt_ckpt_check_save(s, &common, tier, "checkpoint"));
    LLMT_TRY(llmt_ckpt_join(s));
    LLMT_TRY(llmt_ckpt_snapshot(s, &common, tier, 0, snap));
    llmt_manifest *m = &snap->manifest;
    m->format = LLMT_MANIFEST_FORMAT_SHARDED;
    m->has_optimizer = 1;
    m->optimizer = o->cfg;
    m->optimizer_steps = o->steps;
    m->num_elements = o->model->num_params;
    m->chunk_bytes = LLMT_MANIFEST_CHUNK_BYTES;
    char name[64];
    llmt_ckpt_dirname(name, sizeof name, st->step);
    if (!(*tmp = llmt_ckpt_fresh_dir(s->dir[tier], name, "tmp"))) {
        llmt_ckpt_snapshot_free(snap);
        return LLMT_EIO;
    }
    return LLMT_OK;
}

int llmt_ckpt_sharded_write_common(const char *tmp, ckpt_snapshot *snap, int sync)
{
    return write_data(tmp, snap, sync);
}

int llmt_ckpt_commit_manifest(llmt_ckpt_store *s, int32_t tier, int64_t step, const char *tmp,
                              const char *text, size_t len, int rotation)
{
    int rc = write_manifest_text(tmp, text, len, s->sync[tier]);
    return publish(s, tier, step, tmp, rc, rotation);
}
