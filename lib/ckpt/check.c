/* Checking a checkpoint directory against its MANIFEST (see check.h). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/check.h"
#include "ckpt/store_internal.h"
#include "core/error.h"
#include "util/fsutil.h"

int64_t llmt_ckpt_step_of(const char *name)
{
    const char *slash = strrchr(name, '/');
    name = slash ? slash + 1 : name;
    size_t digits = strlen(name + (strncmp(name, "step-", 5) == 0 ? 5 : 0));
    if (strncmp(name, "step-", 5) != 0 || !digits || digits > 18 ||
        strspn(name + 5, "0123456789") != digits)
        return -1;
    int64_t step = strtoll(name + 5, NULL, 10);
    char canonical[64];
    llmt_ckpt_dirname(canonical, sizeof canonical, step);
    return strcmp(name, canonical) == 0 ? step : -1;
}

/* dir/name, malloc'ed (NULL after setting LLMT_ENOMEM). */
static char *path_in(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    else
        llmt_fail(LLMT_ENOMEM, "%s: out of memory", dir);
    return p;
}

/* What the entry path of checkpoint directory dir is, checked before it is
 * opened (a FIFO would block open) and again after a read failed:
 * LLMT_ENOTFOUND when dir itself is gone (a writer rotated the checkpoint
 * away while it was read: not damage); LLMT_ECORRUPT when path is missing or
 * not a regular file (the store writes only regular files, never links);
 * LLMT_EIO when it cannot be told; LLMT_OK for a regular file. */
static int entry_state(const char *dir, const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0)
        return S_ISREG(st.st_mode) ? LLMT_OK
                                   : llmt_fail(LLMT_ECORRUPT, "%s: not a regular file", path);
    int err = errno;
    if (err == ENOENT && lstat(dir, &st) != 0 && errno == ENOENT)
        return llmt_fail(LLMT_ENOTFOUND, "no longer there (removed while being read: a writer "
                         "rotated it away)");
    return llmt_fail(err == ENOENT ? LLMT_ECORRUPT : LLMT_EIO, "%s: %s", path, strerror(err));
}

/* After a read of path failed with rc: LLMT_ENOTFOUND or LLMT_ECORRUPT when
 * the entry went away or changed kind meanwhile, else rc (a file that is
 * there but could not be read proves nothing about the checkpoint). */
static int read_failure(const char *dir, const char *path, int rc)
{
    if (rc != LLMT_EIO)
        return rc;
    char why[512];
    snprintf(why, sizeof why, "%s", llmt_error_last());
    int now = entry_state(dir, path);
    return now == LLMT_ENOTFOUND || now == LLMT_ECORRUPT ? now : llmt_fail(rc, "%s", why);
}

int llmt_ckpt_read_manifest_at(const char *dir, const char *label, int64_t step, llmt_manifest *m)
{
    memset(m, 0, sizeof *m); /* clearable even when the file cannot be read */
    char *path = path_in(dir, CKPT_MANIFEST_FILE), *text = NULL;
    size_t len = 0;
    int rc = path ? entry_state(dir, path) : LLMT_ENOMEM;
    if (!rc)
        rc = read_failure(dir, path, llmt_read_file(path, LLMT_MANIFEST_MAX_BYTES, &text, &len));
    if (!rc)
        rc = llmt_manifest_parse(text, len, m);
    if (!rc && step >= 0 && m->step != step)
        rc = llmt_fail(LLMT_ECORRUPT, "manifest says step %lld", (long long)m->step);
    if (rc) {
        llmt_manifest_clear(m);
        llmt_fail_prefix(rc, "%s: file %s", label, CKPT_MANIFEST_FILE);
    }
    free(path);
    free(text);
    return rc;
}

/* Checks one listed file: its size, and with hash its XXH3-64 too. */
static int check_file(const char *dir, const char *label, const llmt_manifest_file *f, int hash)
{
    char *path = path_in(dir, f->name);
    uint64_t size = 0, xxh3 = 0;
    struct stat st;
    int rc = path ? entry_state(dir, path) : LLMT_ENOMEM;
    if (!rc && hash)
        rc = read_failure(dir, path, llmt_hash_file(path, &size, &xxh3));
    else if (!rc && lstat(path, &st) != 0)
        rc = read_failure(dir, path, llmt_fail(LLMT_EIO, "%s: %s", path, strerror(errno)));
    else if (!rc)
        size = (uint64_t)st.st_size;
    if (!rc && size != f->bytes)
        rc = llmt_fail(LLMT_ECORRUPT, "size %" PRIu64 ", the manifest says %" PRIu64, size, f->bytes);
    else if (!rc && hash && xxh3 != f->xxh3)
        rc = llmt_fail(LLMT_ECORRUPT, "checksum mismatch (XXH3-64 %016" PRIx64 ", the manifest "
                       "says %016" PRIx64 ")", xxh3, f->xxh3);
    if (rc)
        llmt_fail_prefix(rc, "%s: file %s", label, f->name);
    free(path);
    return rc;
}

/* Fails with LLMT_ECORRUPT on a file in dir that m does not list. */
static int check_nothing_extra(const char *dir, const char *label, const llmt_manifest *m)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? llmt_fail(LLMT_ENOTFOUND, "%s: no longer there (removed while "
                                           "being read: a writer rotated it away)", label)
                               : llmt_fail(LLMT_EIO, "%s: cannot open %s: %s", label, dir,
                                           strerror(errno));
    int rc = LLMT_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            strcmp(e->d_name, CKPT_MANIFEST_FILE) && !llmt_manifest_find(m, e->d_name))
            rc = llmt_fail(LLMT_ECORRUPT, "%s: file %s: not listed in the manifest", label,
                           e->d_name);
    closedir(d);
    return rc;
}

/* Whether file f is absent from dir (in a per-node fast tier's copy: a
 * file of another node's). */
static int on_another_node(const char *dir, const llmt_manifest_file *f)
{
    char *path = path_in(dir, f->name);
    struct stat st;
    int absent = path && lstat(path, &st) != 0 && errno == ENOENT;
    free(path);
    return absent;
}

/* Whether a check in mode what hashes file f of manifest m whole. */
static int hashed(int what, const llmt_manifest *m, const llmt_manifest_file *f)
{
    if (what == LLMT_CKPT_CHECK_ALL || what == LLMT_CKPT_CHECK_NODE_COPY)
        return 1;
    if (what == LLMT_CKPT_CHECK_MODEL)
        return strcmp(f->name, CKPT_MODEL_FILE) == 0;
    /* LLMT_CKPT_CHECK_UNREAD: all but what the load checks as it reads. */
    if (strcmp(f->name, CKPT_MODEL_FILE) == 0 || strcmp(f->name, CKPT_USER_FILE) == 0)
        return 0;
    for (int32_t r = 0; r < m->world_size; r++)
        if (&m->shards[r].file == f)
            return m->shards[r].first == m->shards[r].end;
    return 1; /* optimizer.safetensors, read in unchecked slices */
}

/* Checks file f that manifest m lists (a shard file when shard). In one
 * node's copy of a per-node fast tier's checkpoint (m->per_node) a missing
 * file is on another node: passed over for a shard in the resume's first
 * pass (LLMT_CKPT_CHECK_UNREAD: the ranks that read it find out) and for
 * any file in LLMT_CKPT_CHECK_NODE_COPY, damage that says so otherwise. */
static int check_listed(const char *dir, const char *label, const llmt_manifest *m,
                        const llmt_manifest_file *f, int what, int shard)
{
    if (!m->per_node || !on_another_node(dir, f))
        return check_file(dir, label, f, hashed(what, m, f));
    if ((shard && what == LLMT_CKPT_CHECK_UNREAD) || what == LLMT_CKPT_CHECK_NODE_COPY)
        return LLMT_OK;
    return llmt_fail(LLMT_ECORRUPT, "%s: file %s: not in this directory, one node's copy of a "
                     "checkpoint saved with a fast tier local to each node (the file is in "
                     "another node's copy)", label, f->name);
}

int llmt_ckpt_check_dir(const char *dir, const char *label, int64_t step, int what,
                        llmt_manifest *m)
{
    llmt_manifest own;
    llmt_manifest *man = m ? m : &own;
    LLMT_TRY(llmt_ckpt_read_manifest_at(dir, label, step, man));
    int rc = LLMT_OK;
    const int every = what != LLMT_CKPT_CHECK_MODEL;
    if (!llmt_manifest_find(man, CKPT_MODEL_FILE))
        rc = llmt_fail(LLMT_ECORRUPT, "%s: file %s: not listed in the manifest", label,
                       CKPT_MODEL_FILE);
    for (int i = 0; i < man->n_files && !rc; i++)
        if (every || strcmp(man->files[i].name, CKPT_MODEL_FILE) == 0)
            rc = check_listed(dir, label, man, &man->files[i], what, 0);
    for (int32_t r = 0; every && r < man->world_size && !rc; r++) /* format 2 */
        rc = check_listed(dir, label, man, &man->shards[r].file, what, 1);
    if (!rc && every)
        rc = check_nothing_extra(dir, label, man);
    if (!m || rc)
        llmt_manifest_clear(man);
    return rc;
}
