#define _GNU_SOURCE /* renameat2 */
/* llmt_ckpt_consolidate: a sharded checkpoint (format 2) rewritten in the
 * single-file layout (format 1), byte for byte what one process saving the
 * same state writes: the state is loaded into a model and an unsharded
 * optimizer on a CPU context of its own, and written by the same code. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/check.h"
#include "ckpt/store_internal.h"
#include "core/error.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "util/fsutil.h"

/* The objects the state is loaded into. */
typedef struct holder {
    llmt_context *ctx;
    llmt_model *model;
    llmt_optimizer *opt;
    char *user;
} holder;

static void holder_free(holder *h)
{
    llmt_optimizer_free(h->opt);
    llmt_model_free(h->model);
    llmt_context_free(h->ctx);
    free(h->user);
}

/* Loads checkpoint directory dir (manifest mf, verified) into h and gathers
 * it into snap with mf's fields (format 1, its own file list). */
static int load_and_snapshot(llmt_ckpt_store *s, const char *dir, llmt_manifest *mf, holder *h,
                             ckpt_snapshot *snap)
{
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    LLMT_TRY(llmt_context_create(&h->ctx, &cc));
    LLMT_TRY(llmt_model_create(&h->model, h->ctx, &mf->model));
    LLMT_TRY(llmt_optimizer_create(&h->opt, h->model, &mf->optimizer));
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    st.model = h->model;
    st.optimizer = h->opt;
    LLMT_TRY(llmt_ckpt_load_tensors(dir, mf, &st));
    h->opt->steps = mf->optimizer_steps;
    const llmt_manifest_file *u = llmt_manifest_find(mf, CKPT_USER_FILE);
    size_t size = u ? (size_t)u->bytes : 0;
    if (size && !(h->user = malloc(size)))
        return llmt_fail(LLMT_ENOMEM, "out of memory");
    LLMT_TRY(llmt_ckpt_load_user(dir, mf, h->user, size, NULL));
    st.user_blob = h->user;
    st.user_blob_size = size;
    st.step = mf->step;
    LLMT_TRY(llmt_ckpt_snapshot(s, &st, 0, 0, snap));
    /* The run's own fields, as the sharded save recorded them. */
    llmt_manifest_clear(&snap->manifest);
    snap->manifest = *mf;
    memset(mf, 0, sizeof *mf); /* moved: config_yaml and shards are snap's now */
    llmt_manifest *m = &snap->manifest;
    for (int32_t r = 0; r < m->world_size; r++)
        free(m->shards[r].chunks);
    free(m->shards);
    m->shards = NULL;
    m->world_size = 0;
    m->num_elements = 0;
    m->chunk_bytes = 0;
    m->format = LLMT_MANIFEST_FORMAT;
    m->n_files = 0;
    return LLMT_OK;
}

/* Renames directory tmp to final unless final exists (-1 with errno EEXIST
 * then, final untouched; a plain rename would replace an empty directory).
 * Where the file system refuses RENAME_NOREPLACE (EINVAL; ENOSYS without
 * the system call), final is claimed with mkdir, which fails when it
 * exists, and tmp renamed onto that empty directory of ours: link + unlink,
 * the fallback for files, cannot move a directory. */
static int rename_noreplace(const char *tmp, const char *final)
{
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS)
        return -1;
    if (mkdir(final, 0700) != 0)
        return -1;
    if (rename(tmp, final) == 0)
        return 0;
    int err = errno;
    rmdir(final); /* ours, still empty; fails harmlessly if someone filled it */
    errno = err;
    return -1;
}

/* Refuses final, which exists: when it is an empty directory, the message
 * says how one comes about (the fallback above claims final, then renames
 * onto it: a crash in between leaves it empty) and what to do. */
static int exists(const char *final, const char *when)
{
    DIR *d = opendir(final);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    const int empty = d && !entries;
    if (d)
        closedir(d);
    return llmt_fail(LLMT_EINVAL, "%s already exists%s%s", final, when,
                     empty ? " (an empty directory: a consolidation that crashed between "
                             "claiming it and renaming its output there leaves one; remove it "
                             "and consolidate again)"
                           : "");
}

int llmt_ckpt_consolidate(llmt_ckpt_store *store, int64_t step, int32_t tier, const char *out_dir)
{
    const char *fn = "llmt_ckpt_consolidate";
    if (!store || !out_dir || !out_dir[0])
        return llmt_fail(LLMT_EINVAL, "%s: %s", fn,
                         !store ? "store is NULL" : "out_dir is NULL or empty");
    if ((tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST) || !store->dir[tier] || step < 0)
        return llmt_fail(LLMT_EINVAL, "%s: no tier %d in this store, or step %lld < 0", fn, tier,
                         (long long)step);
    LLMT_TRY(llmt_ckpt_join(store));
    char name[64], label[128];
    llmt_ckpt_dirname(name, sizeof name, step);
    snprintf(label, sizeof label, "checkpoint %s (%s)", name, tier ? "fast" : "durable");
    char *dir = llmt_ckpt_file(store, tier, step, NULL);
    size_t n = strlen(out_dir) + strlen(name) + 2;
    char *final = malloc(n), *tmp = NULL;
    llmt_manifest mf;
    memset(&mf, 0, sizeof mf);
    holder h = {0, 0, 0, 0};
    ckpt_snapshot snap;
    memset(&snap, 0, sizeof snap);
    int rc = dir && final ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "out of memory");
    struct stat st;
    if (!rc) {
        snprintf(final, n, "%s/%s", out_dir, name);
        if (lstat(final, &st) == 0)
            rc = exists(final, "");
    }
    if (!rc)
        rc = llmt_ckpt_check_dir(dir, label, step, 1, &mf);
    if (!rc && mf.format != LLMT_MANIFEST_FORMAT_SHARDED)
        rc = llmt_fail(LLMT_EINVAL, "%s is not sharded (format_version %lld): it is in the "
                       "single-file layout already", label, (long long)mf.format);
    if (!rc)
        rc = load_and_snapshot(store, dir, &mf, &h, &snap);
    if (!rc)
        rc = llmt_mkdirs(out_dir);
    if (!rc && !(tmp = llmt_ckpt_fresh_dir(out_dir, name, "tmp")))
        rc = LLMT_EIO;
    if (!rc)
        rc = llmt_ckpt_write_dir(tmp, &snap, 1);
    if (!rc && rename_noreplace(tmp, final) != 0)
        rc = errno == EEXIST || errno == ENOTEMPTY
                 ? exists(final, " (created while consolidating): not replaced")
                 : llmt_fail(LLMT_EIO, "%s: cannot rename into place: %s", final, strerror(errno));
    if (!rc)
        rc = llmt_sync_dir(out_dir);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", llmt_error_last());
        if (tmp)
            llmt_remove_tree(tmp); /* may fail in turn: the first error is the one to tell */
        llmt_fail(rc, "%s: %s", fn, why);
    }
    llmt_ckpt_snapshot_free(&snap);
    llmt_manifest_clear(&mf);
    holder_free(&h);
    free(tmp);
    free(final);
    free(dir);
    return rc;
}
