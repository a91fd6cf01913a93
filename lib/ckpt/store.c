/* llmt_ckpt_store: opening, listing, verifying and choosing checkpoints, and
 * running saves (synchronously or on the store's thread). */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fsutil.h"
#include "ckpt/check.h"
#include "ckpt/store_internal.h"
#include "optim/optim_internal.h"
#include "core/error.h"

static const char *const tier_names[2] = {"durable", "fast"};

/* The layout of a version 1 llmt_ckpt_store_config, as callers built
 * against that header allocate it. */
typedef struct {
    uint32_t version;
    int32_t keep, sync;
    const char *fast_dir;
    int32_t fast_keep;
} store_config_v1;

/* llmt_ckpt_store_config_init writes the whole current struct, and callers
 * built against the version 1 header pass a struct of their own size: safe
 * only while appended fields stay in version 1's size (read_only lies in its
 * tail padding). A field that grows the struct needs a versioned init
 * instead (docs/API.md, "Appending fields"). */
_Static_assert(sizeof(llmt_ckpt_store_config) == sizeof(store_config_v1),
               "llmt_ckpt_store_config outgrew version 1: init would write past old callers");

void llmt_ckpt_store_config_init(llmt_ckpt_store_config *cfg)
{
    if (cfg) {
        const llmt_ckpt_store_config defaults = LLMT_CKPT_STORE_CONFIG_INIT;
        *cfg = defaults;
    }
}

void llmt_ckpt_dirname(char *buf, size_t cap, int64_t step)
{
    snprintf(buf, cap, "step-%08lld", (long long)step);
}

char *llmt_ckpt_file(const llmt_ckpt_store *s, int tier, int64_t step, const char *name)
{
    char dir[64];
    llmt_ckpt_dirname(dir, sizeof dir, step);
    size_t n = strlen(s->dir[tier]) + strlen(dir) + (name ? strlen(name) : 0) + 3;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s%s%s", s->dir[tier], dir, name ? "/" : "", name ? name : "");
    return p;
}

/* Whether errno says the store cannot be changed (a read-only file system
 * or directory): a leftover is then left where it is. */
static int read_only_errno(int err)
{
    return err == EROFS || err == EACCES || err == EPERM;
}

/* Why a leftover at path in dir cannot be changed (access(2)'s errno: EROFS,
 * EACCES), 0 when both can be written. Asked afresh after a removal failed:
 * errno does not survive llmt_remove_tree's message. The store's leftovers
 * are one level deep, so these two are the directories that matter. */
static int write_errno(const char *dir, const char *path)
{
    if (access(dir, W_OK) != 0 || access(path, W_OK) != 0)
        return errno;
    return 0;
}

/* Finishes what interrupted saves left in dir: temporary directories are
 * removed; a checkpoint moved aside to be replaced is put back when its
 * replacement never arrived, else removed. What the store's permissions
 * keep in place is left (no such name is taken for a checkpoint, and
 * llmt_ckpt_latest notes a step-N.old-* left); any other failure is an
 * error naming the entry, lest a checkpoint go silently missing. */
static int clean_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", dir, strerror(errno));
    int rc = LLMT_OK;
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        const char *tmp = strstr(e->d_name, ".tmp-"), *old = strstr(e->d_name, ".old-");
        if (strncmp(e->d_name, "step-", 5) != 0 || (!tmp && !old))
            continue;
        size_t n = strlen(dir) + strlen(e->d_name) + 2;
        char *path = malloc(n), *final = malloc(n);
        if (!path || !final) {
            free(path);
            free(final);
            rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", dir);
            break;
        }
        snprintf(path, n, "%s/%s", dir, e->d_name);
        snprintf(final, n, "%s/%.*s", dir, (int)((tmp ? tmp : old) - e->d_name), e->d_name);
        struct stat st;
        /* An old one is removed only once its replacement is in place. */
        if (old && !(lstat(final, &st) == 0 && S_ISDIR(st.st_mode))) {
            if (rename(path, final) != 0 && !read_only_errno(errno))
                rc = llmt_fail(LLMT_EIO, "%s: cannot put back as %s (an interrupted save moved "
                               "it aside): %s", path, final, strerror(errno));
        } else if (llmt_remove_tree(path) != LLMT_OK &&
                   !read_only_errno(write_errno(dir, path))) {
            rc = llmt_fail_prefix(LLMT_EIO, "%s: a leftover of an interrupted save", dir);
        }
        free(path);
        free(final);
    }
    closedir(d);
    return rc;
}

/* Opens tier t of a store: created, locked and cleaned, or, read-only,
 * found as it is. */
static int open_tier(llmt_ckpt_store *s, int t, int read_only)
{
    struct stat st;
    if (read_only) {
        snprintf(s->read_only[t], sizeof s->read_only[t], "opened with read_only");
        if (stat(s->dir[t], &st) != 0)
            return llmt_fail(errno == ENOENT ? LLMT_ENOTFOUND : LLMT_EIO, "%s: cannot open for "
                             "reading: %s", s->dir[t], strerror(errno));
        return S_ISDIR(st.st_mode) ? LLMT_OK
                                   : llmt_fail(LLMT_EIO, "%s: not a directory", s->dir[t]);
    }
    LLMT_TRY(llmt_mkdirs(s->dir[t]));
    LLMT_TRY(llmt_ckpt_lock(s, t));
    /* Locked before cleaning: what another process's save left in progress
     * is its own. A reader does not clean: a writer may be saving. */
    return s->read_only[t][0] ? LLMT_OK : clean_dir(s->dir[t]);
}

int llmt_ckpt_store_open(llmt_ckpt_store **out, llmt_context *ctx, const char *dir,
                         const llmt_ckpt_store_config *cfg)
{
    const char *fn = "llmt_ckpt_store_open";
    if (!out)
        return llmt_fail(LLMT_EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (!ctx || !dir)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, !ctx ? "ctx" : "dir");
    const llmt_ckpt_store_config defaults = LLMT_CKPT_STORE_CONFIG_INIT;
    if (!cfg)
        cfg = &defaults;
    if (cfg->version < 1 || cfg->version > LLMT_CKPT_STORE_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows 1 to %u", fn,
                         cfg->version, LLMT_CKPT_STORE_CONFIG_VERSION);
    int32_t read_only = cfg->version >= 2 ? cfg->read_only : 0; /* appended in version 2 */
    if (cfg->keep < 1 || cfg->fast_keep < 1 || (cfg->sync != 0 && cfg->sync != 1) ||
        (read_only != 0 && read_only != 1))
        return llmt_fail(LLMT_EINVAL, "%s: keep = %d, fast_keep = %d, sync = %d, read_only = %d "
                         "(keeps must be >= 1, sync and read_only 0 or 1)", fn, cfg->keep,
                         cfg->fast_keep, cfg->sync, read_only);
    if (!dir[0] || (cfg->fast_dir && !cfg->fast_dir[0]))
        return llmt_fail(LLMT_EINVAL, "%s: an empty directory name", fn);
    llmt_ckpt_store *s = calloc(1, sizeof *s);
    if (!s)
        return llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    s->ctx = ctx;
    s->dir[LLMT_CKPT_DURABLE] = strdup(dir);
    s->dir[LLMT_CKPT_FAST] = cfg->fast_dir ? strdup(cfg->fast_dir) : NULL;
    s->keep[LLMT_CKPT_DURABLE] = cfg->keep;
    s->keep[LLMT_CKPT_FAST] = cfg->fast_keep;
    s->sync[LLMT_CKPT_DURABLE] = cfg->sync;
    s->sync[LLMT_CKPT_FAST] = 0; /* tmpfs: nothing to sync to */
    s->lock_fd[0] = s->lock_fd[1] = -1;
    s->committed[0] = s->committed[1] = -1;
    llmt_ckpt_track(s, 1);
    int rc = s->dir[0] && (!cfg->fast_dir || s->dir[1]) ? LLMT_OK
                                                        : llmt_fail(LLMT_ENOMEM, "%s: out of memory", fn);
    for (int t = 0; t < 2 && !rc; t++)
        if (s->dir[t])
            rc = open_tier(s, t, read_only);
    if (rc) {
        llmt_ckpt_store_free(s);
        return rc;
    }
    *out = s;
    return LLMT_OK;
}

void llmt_ckpt_store_free(llmt_ckpt_store *s)
{
    if (!s)
        return;
    llmt_ckpt_join(s);
    llmt_ckpt_unlock(s); /* while tracked: a fork meanwhile closes the child's copies */
    llmt_ckpt_track(s, 0);
    llmt_buf_free(s->ctx, &s->staging);
    free(s->dir[0]);
    free(s->dir[1]);
    free(s->refused[0]);
    free(s->refused[1]);
    free(s);
}

/* ---- saving */

/* The save thread: writes and commits the job, keeping its status and message. */
static void *save_thread(void *arg)
{
    llmt_ckpt_store *s = arg;
    s->async_rc = llmt_ckpt_commit(s, &s->job);
    snprintf(s->async_error, sizeof s->async_error, "%s", s->async_rc ? llmt_error_last() : "");
    llmt_ckpt_snapshot_free(&s->job);
    return NULL;
}

int llmt_ckpt_join(llmt_ckpt_store *s)
{
    if (s->in_flight) {
        pthread_join(s->thread, NULL);
        s->in_flight = 0;
    }
    int rc = s->async_rc;
    s->async_rc = LLMT_OK;
    if (rc)
        llmt_fail(rc, "the previous async save failed: %s", s->async_error);
    return rc;
}

int llmt_ckpt_wait(llmt_ckpt_store *s)
{
    if (!s)
        return llmt_fail(LLMT_EINVAL, "llmt_ckpt_wait: store is NULL");
    return llmt_ckpt_join(s);
}

int llmt_ckpt_check_save(llmt_ckpt_store *s, const llmt_train_state *st, int32_t tier,
                         const char *fn)
{
    if (!s || !st)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, s ? "state" : "store");
    if (st->version != LLMT_TRAIN_STATE_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: state->version = %u, this library knows %u", fn,
                         st->version, LLMT_TRAIN_STATE_VERSION);
    if (!st->model)
        return llmt_fail(LLMT_EINVAL, "%s: state->model is NULL", fn);
    if (st->optimizer && st->optimizer->comm)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: state->optimizer is sharded: a data-parallel "
                         "run saves through llmt_trainer_save (every rank writes its shard)", fn);
    if (tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST)
        return llmt_fail(LLMT_EINVAL, "%s: tier = %d is not a tier", fn, tier);
    if (!s->dir[tier])
        return llmt_fail(LLMT_EINVAL, "%s: the store has no fast tier (cfg->fast_dir)", fn);
    if (s->read_only[tier][0])
        return llmt_fail(LLMT_EIO, "%s: %s was opened for reading only (%s): nothing can be "
                         "saved there", fn, s->dir[tier], s->read_only[tier]);
    if (st->step < 0 || st->tokens_seen < 0 || (st->user_blob_size && !st->user_blob))
        return llmt_fail(LLMT_EINVAL, "%s: step = %lld, tokens_seen = %lld, user_blob %s", fn,
                         (long long)st->step, (long long)st->tokens_seen,
                         st->user_blob ? "given" : "NULL");
    return LLMT_OK;
}

int llmt_ckpt_save(llmt_ckpt_store *s, const llmt_train_state *state, int32_t tier)
{
    int rc = llmt_ckpt_check_save(s, state, tier, "llmt_ckpt_save");
    if (!rc)
        rc = llmt_ckpt_join(s);
    if (rc)
        return rc;
    ckpt_snapshot snap;
    rc = llmt_ckpt_snapshot(s, state, tier, 0, &snap);
    if (!rc)
        rc = llmt_ckpt_commit(s, &snap);
    llmt_ckpt_snapshot_free(&snap);
    return rc;
}

int llmt_ckpt_save_async(llmt_ckpt_store *s, const llmt_train_state *state, int32_t tier)
{
    int rc = llmt_ckpt_check_save(s, state, tier, "llmt_ckpt_save_async");
    if (!rc)
        rc = llmt_ckpt_join(s);
    if (!rc)
        rc = llmt_ckpt_snapshot(s, state, tier, 1, &s->job);
    if (rc)
        return rc;
    if (pthread_create(&s->thread, NULL, save_thread, s) != 0) {
        llmt_ckpt_snapshot_free(&s->job);
        return llmt_fail(LLMT_ENOMEM, "llmt_ckpt_save_async: cannot start the save thread");
    }
    s->in_flight = 1;
    return LLMT_OK;
}

/* ---- listing and verifying */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Appends a formatted line to a NUL-terminated buffer of cap bytes (NULL: none). */
static void note(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(char *buf, size_t cap, const char *fmt, ...)
{
    if (!buf || !cap)
        return;
    size_t used = strnlen(buf, cap);
    if (used + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, cap - used, fmt, ap);
    va_end(ap);
}

int llmt_ckpt_scan(const llmt_ckpt_store *s, int tier, int64_t **steps, size_t *n, char *ignored,
                   size_t cap)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(s->dir[tier]);
    if (!d)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", s->dir[tier], strerror(errno));
    size_t room = 0;
    int rc = LLMT_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step = llmt_ckpt_step_of(e->d_name);
        const char *old = strstr(e->d_name, ".old-");
        if (step < 0 && old && strncmp(e->d_name, "step-", 5) == 0)
            note(ignored, cap, "%s/%s (%s): moved aside by a save that was interrupted or is in "
                 "progress, and not put back (rename it to %.*s to use it)\n", s->dir[tier],
                 e->d_name, tier_names[tier], (int)(old - e->d_name), e->d_name);
        if (step < 0)
            continue;
        /* Only a directory is a checkpoint; a stray file of that name is
         * neither loaded nor rotated (lstat: a link is not followed). */
        size_t len = strlen(s->dir[tier]) + strlen(e->d_name) + 2;
        char *path = malloc(len);
        if (!path) {
            rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", s->dir[tier]);
            break;
        }
        snprintf(path, len, "%s/%s", s->dir[tier], e->d_name);
        struct stat st;
        int is_dir = lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
        free(path);
        if (!is_dir) {
            note(ignored, cap, "%s/%s (%s): not a directory, ignored\n", s->dir[tier], e->d_name,
                 tier_names[tier]);
            continue;
        }
        if (*n == room) {
            int64_t *grown = realloc(*steps, (room = room ? 2 * room : 16) * sizeof **steps);
            if (!grown) {
                rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", s->dir[tier]);
                break;
            }
            *steps = grown;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
    } else if (*n) {
        qsort(*steps, *n, sizeof **steps, cmp_i64);
    }
    return rc;
}

int llmt_ckpt_list(llmt_ckpt_store *s, int32_t tier, int64_t *steps, size_t cap, size_t *count)
{
    const char *fn = "llmt_ckpt_list";
    if (!s || !count || (cap && !steps))
        return llmt_fail(LLMT_EINVAL, "%s: a required argument is NULL", fn);
    if ((tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST) || !s->dir[tier])
        return llmt_fail(LLMT_EINVAL, "%s: tier = %d is not a tier of this store", fn, tier);
    int rc = llmt_ckpt_join(s);
    int64_t *all = NULL;
    size_t n = 0;
    if (!rc)
        rc = llmt_ckpt_scan(s, tier, &all, &n, NULL, 0);
    if (rc)
        return rc;
    *count = n;
    if (cap) {
        if (cap < n) {
            free(all);
            return llmt_fail(LLMT_EINVAL, "%s: cap = %zu, %zu checkpoints", fn, cap, n);
        }
        if (n) /* all is NULL when there is none */
            memcpy(steps, all, n * sizeof *steps);
    }
    free(all);
    return LLMT_OK;
}

/* "checkpoint step-N (tier)", the label of a checkpoint's messages. */
static void label_of(char *buf, size_t cap, int64_t step, int tier)
{
    char name[64];
    llmt_ckpt_dirname(name, sizeof name, step);
    snprintf(buf, cap, "checkpoint %s (%s)", name, tier_names[tier]);
}

int llmt_ckpt_read_manifest(const llmt_ckpt_store *s, int64_t step, int tier, llmt_manifest *m)
{
    memset(m, 0, sizeof *m);
    char label[128], *dir = llmt_ckpt_file(s, tier, step, NULL);
    label_of(label, sizeof label, step, tier);
    int rc = dir ? llmt_ckpt_read_manifest_at(dir, label, step, m)
                 : llmt_fail(LLMT_ENOMEM, "%s: out of memory", label);
    free(dir);
    return rc;
}

/* Verifies a checkpoint (files, sizes, checksums, nothing extra). */
/* llmt_ckpt_check_dir of checkpoint step of tier in mode what (the
 * manifest into m, may be NULL). */
static int check_step(const llmt_ckpt_store *s, int64_t step, int tier, int what,
                      llmt_manifest *m)
{
    char label[128], *dir = llmt_ckpt_file(s, tier, step, NULL);
    label_of(label, sizeof label, step, tier);
    int rc = dir ? llmt_ckpt_check_dir(dir, label, step, what, m)
                 : llmt_fail(LLMT_ENOMEM, "%s: out of memory", label);
    free(dir);
    return rc;
}

static int verify(const llmt_ckpt_store *s, int64_t step, int tier)
{
    return check_step(s, step, tier, LLMT_CKPT_CHECK_ALL, NULL);
}

int llmt_ckpt_verify(llmt_ckpt_store *s, int64_t step, int32_t tier)
{
    if (!s || (tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST) || !s->dir[tier] || step < 0)
        return llmt_fail(LLMT_EINVAL, "llmt_ckpt_verify: %s", !s ? "store is NULL"
                                                                 : "no such tier or a negative step");
    int rc = llmt_ckpt_join(s);
    return rc ? rc : verify(s, step, tier);
}

int llmt_ckpt_is_refused(const llmt_ckpt_store *s, int tier, int64_t step)
{
    for (size_t k = 0; k < s->n_refused[tier]; k++)
        if (s->refused[tier][k] == step)
            return 1;
    return 0;
}

int64_t llmt_ckpt_committed(const llmt_ckpt_store *s, int tier)
{
    return s->committed[tier];
}

void llmt_ckpt_forget_refused(llmt_ckpt_store *s, int tier, int64_t step)
{
    for (size_t k = 0; k < s->n_refused[tier]; k++)
        if (s->refused[tier][k] == step) {
            s->refused[tier][k] = s->refused[tier][s->n_refused[tier] - 1];
            s->n_refused[tier]--;
            return;
        }
}

/* Remembers that checkpoint step of tier is damaged. */
static int refuse(llmt_ckpt_store *s, int tier, int64_t step)
{
    if (llmt_ckpt_is_refused(s, tier, step))
        return LLMT_OK;
    int64_t *grown = realloc(s->refused[tier], (s->n_refused[tier] + 1) * sizeof *grown);
    if (!grown)
        return llmt_fail(LLMT_ENOMEM, "llmt_ckpt_latest: out of memory");
    s->refused[tier] = grown;
    grown[s->n_refused[tier]++] = step;
    return LLMT_OK;
}

/* Lists the checkpoints of both tiers (llmt_ckpt_scan; notes restarted).
 * *unsettled says whether a writer may have been at work: a directory
 * changed while it was listed, or the listing is empty. readdir is not
 * atomic against renames, so such a listing may miss a checkpoint (and
 * directory timestamps are coarse, so an empty one is worth repeating too). */
static int list_tiers(const llmt_ckpt_store *s, int64_t *steps[2], size_t n[2], char *notes,
                      size_t notes_cap, int *unsettled)
{
    if (notes_cap)
        notes[0] = '\0';
    *unsettled = 0;
    int rc = LLMT_OK;
    for (int t = 0; t < 2 && !rc; t++) {
        struct stat before, after;
        if (!s->dir[t])
            continue;
        int b = stat(s->dir[t], &before);
        rc = llmt_ckpt_scan(s, t, &steps[t], &n[t], notes, notes_cap);
        if (b != 0 || stat(s->dir[t], &after) != 0 ||
            before.st_mtim.tv_sec != after.st_mtim.tv_sec ||
            before.st_mtim.tv_nsec != after.st_mtim.tv_nsec)
            *unsettled = 1;
    }
    if (!n[0] && !n[1])
        *unsettled = 1;
    return rc;
}

/* verify, as an llmt_ckpt_try_fn. */
static int verify_whole(void *arg, llmt_ckpt_store *s, int64_t step, int32_t tier)
{
    (void)arg;
    return verify(s, step, tier);
}

int llmt_ckpt_latest(llmt_ckpt_store *s, int64_t *step, int32_t *tier, char *notes,
                     size_t notes_cap)
{
    if (!s || !step || !tier || (notes_cap && !notes))
        return llmt_fail(LLMT_EINVAL, "llmt_ckpt_latest: a required argument is NULL");
    return llmt_ckpt_pick(s, verify_whole, NULL, step, tier, notes, notes_cap);
}

int llmt_ckpt_pick(llmt_ckpt_store *s, llmt_ckpt_try_fn try_one, void *arg, int64_t *step,
                   int32_t *tier, char *notes, size_t notes_cap)
{
    const char *fn = "llmt_ckpt_latest";
    if (notes_cap)
        notes[0] = '\0';
    int rc = llmt_ckpt_join(s);
    if (rc)
        return rc;
    /* Newest first; at equal steps the durable tier first. Each refusal is
     * kept (refused, "; "-separated) for the error when none verifies. A
     * checkpoint a writer rotated away since the listing is skipped, neither
     * refused nor counted. When none was found and the listing was unsettled
     * (see list_tiers) or one went away, the directories are listed again,
     * notes and refusals afresh, a few times at most. */
    char refused[3072];
    size_t n_refused = 0;
    int found = 0, again = 1;
    for (int pass = 0; pass < 4 && again && !found && !rc; pass++) {
        int64_t *steps[2] = {NULL, NULL};
        size_t n[2] = {0, 0};
        refused[0] = '\0';
        n_refused = 0;
        rc = list_tiers(s, steps, n, notes, notes_cap, &again);
        size_t i[2] = {n[0], n[1]};
        while (!rc && !found && (i[0] || i[1])) {
            int t = !i[0] ? 1 : !i[1] ? 0 : steps[1][i[1] - 1] > steps[0][i[0] - 1] ? 1 : 0;
            int64_t cand = steps[t][--i[t]];
            int v = try_one(arg, s, cand, t);
            if (v == LLMT_OK) {
                *step = cand;
                *tier = t;
                found = 1;
            } else if (v == LLMT_ENOTFOUND) {
                note(notes, notes_cap, "%s\n", llmt_error_last());
                again = 1;
            } else if (v != LLMT_ECORRUPT) { /* could not check it: it may be good */
                rc = llmt_fail_prefix(v, "%s: cannot tell whether a checkpoint is usable", fn);
            } else {
                char why[1024];
                snprintf(why, sizeof why, "%s", llmt_error_last());
                note(notes, notes_cap, "%s\n", why);
                note(refused, sizeof refused, "%s%s", refused[0] ? "; " : "", why);
                rc = refuse(s, t, cand);
                n_refused++;
            }
        }
        free(steps[0]);
        free(steps[1]);
    }
    if (rc || found)
        return rc;
    const char *dirs[2] = {s->dir[0], s->dir[1] ? s->dir[1] : ""};
    if (!n_refused) /* an empty store (or emptied meanwhile): a fresh start */
        return llmt_fail(LLMT_ENOTFOUND, "%s: no checkpoint in %s%s%s", fn, dirs[0],
                         s->dir[1] ? " or " : "", dirs[1]);
    return llmt_fail(LLMT_ECORRUPT, "%s: none of the %zu checkpoints in %s%s%s verifies: %s", fn,
                     n_refused, dirs[0], s->dir[1] ? " or " : "", dirs[1], refused);
}

/* Renames damaged checkpoint step of tier onto a fresh empty directory
 * step-N.refused-XXXXXX (unique: the same step may be set aside again). */
static int set_aside(llmt_ckpt_store *s, int tier, int64_t step)
{
    char name[64];
    llmt_ckpt_dirname(name, sizeof name, step);
    char *from = llmt_ckpt_file(s, tier, step, NULL);
    char *to = from ? llmt_ckpt_fresh_dir(s->dir[tier], name, "refused") : NULL;
    int rc = LLMT_OK;
    if (!from)
        rc = llmt_fail(LLMT_ENOMEM, "llmt_ckpt_set_aside_invalid: out of memory");
    else if (!to)
        rc = LLMT_EIO; /* or LLMT_ENOMEM: the message says */
    else if (rename(from, to) != 0) {
        rc = llmt_fail(LLMT_EIO, "%s: cannot rename to %s: %s", from, to, strerror(errno));
        rmdir(to);
    }
    if (!rc && s->sync[tier])
        rc = llmt_sync_dir(s->dir[tier]);
    if (!rc && s->committed[tier] == step)
        s->committed[tier] = -1;
    if (!rc)
        llmt_ckpt_forget_refused(s, tier, step); /* gone: no longer in the way */
    free(from);
    free(to);
    return rc;
}

/* A checkpoint llmt_ckpt_set_aside_invalid found damaged. */
typedef struct damaged {
    int tier;
    int64_t step;
    char why[1024];
} damaged;

int llmt_ckpt_set_aside_invalid(llmt_ckpt_store *s, size_t *count, char *notes, size_t notes_cap)
{
    const char *fn = "llmt_ckpt_set_aside_invalid";
    if (!s || (notes_cap && !notes))
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, s ? "notes" : "store");
    if (count)
        *count = 0;
    if (notes_cap)
        notes[0] = '\0';
    for (int t = 0; t < 2; t++)
        if (s->dir[t] && s->read_only[t][0])
            return llmt_fail(LLMT_EIO, "%s: %s is read-only (%s): nothing can be set aside", fn,
                             s->dir[t], s->read_only[t]);
    LLMT_TRY(llmt_ckpt_join(s));
    /* Every checkpoint is judged before any is renamed, so a refusal leaves
     * the directories as they were. */
    int64_t *steps[2] = {NULL, NULL};
    size_t n[2] = {0, 0}, n_bad = 0;
    int rc = LLMT_OK;
    for (int t = 0; t < 2 && !rc; t++)
        rc = s->dir[t] ? llmt_ckpt_scan(s, t, &steps[t], &n[t], NULL, 0) : LLMT_OK;
    damaged *bad = rc ? NULL : calloc(n[0] + n[1] + 1, sizeof *bad);
    if (!rc && !bad)
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", fn);
    /* One check each, which is verification except for one node's copy of
     * a checkpoint saved with a fast tier local to each node: that passes
     * when its own files are intact, and is not set aside (a data-parallel
     * resume with the ranks on the nodes that saved it may load it). */
    for (int t = 0; t < 2 && !rc; t++)
        for (size_t k = 0; k < n[t] && !rc; k++) {
            llmt_manifest mf;
            int v = check_step(s, steps[t][k], t, LLMT_CKPT_CHECK_NODE_COPY, &mf);
            if (v == LLMT_ECORRUPT) {
                damaged *d = &bad[n_bad++];
                *d = (damaged){t, steps[t][k], ""};
                snprintf(d->why, sizeof d->why, "%s", llmt_error_last());
            } else if (!v && mf.per_node) {
                char *dir = llmt_ckpt_file(s, t, steps[t][k], NULL);
                rc = llmt_fail(LLMT_ESTATE, "%s: %s is one node's copy of a checkpoint saved "
                               "with a fast tier local to each node; its own files are intact, "
                               "and a data-parallel resume with the ranks on the nodes that "
                               "saved it may load it, so it is not set aside (resume it, or "
                               "remove it by hand)", fn, dir ? dir : "a checkpoint");
                free(dir);
            } else if (v && v != LLMT_ENOTFOUND) { /* gone meanwhile: nothing to set aside */
                rc = llmt_fail_prefix(v, "%s: cannot tell whether a checkpoint is usable", fn);
            }
            if (!v)
                llmt_manifest_clear(&mf);
        }
    for (size_t i = 0; i < n_bad && !rc; i++) {
        rc = set_aside(s, bad[i].tier, bad[i].step);
        if (!rc)
            note(notes, notes_cap, "%s: set aside\n", bad[i].why);
        if (!rc && count)
            (*count)++;
    }
    free(bad);
    free(steps[0]);
    free(steps[1]);
    return rc;
}

int llmt_ckpt_path(const llmt_ckpt_store *s, int64_t step, int32_t tier, char *out, size_t cap,
                   size_t *needed)
{
    if (!s || (tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST) || !s->dir[tier] ||
        (cap && !out))
        return llmt_fail(LLMT_EINVAL, "llmt_ckpt_path: bad argument");
    char *p = llmt_ckpt_file(s, tier, step, NULL);
    if (!p)
        return llmt_fail(LLMT_ENOMEM, "llmt_ckpt_path: out of memory");
    size_t n = strlen(p) + 1;
    if (needed)
        *needed = n;
    int rc = LLMT_OK;
    if (cap && cap < n)
        rc = llmt_fail(LLMT_EINVAL, "llmt_ckpt_path: cap = %zu, %zu needed", cap, n);
    else if (cap)
        memcpy(out, p, n);
    free(p);
    return rc;
}
