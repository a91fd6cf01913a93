/* A fast tier local to each node (see dist_fast_tier.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/shards.h"
#include "core/error.h"
#include "dist/comm_internal.h"
#include "optim/optim_internal.h"
#include "train/dist_fast_tier.h"
#include "util/fsutil.h"

#define ROOT LLMT_DIST_ROOT
#define PATH_CAP LLMT_DIST_PATH_CAP

/* What rank 0 tells the others about its fast tier. */
typedef struct fast_tier {
    int64_t has;
    uint64_t nonce; /* names this probe's directory */
    char path[PATH_CAP];
} fast_tier;

/* This rank's mark in the probe directory: dir (made on the first rank of a
 * node to get there) and the file `file` ("rank-R") in it. */
static int leave_mark(const char *path, const char *dir, const char *file)
{
    int rc = llmt_mkdirs(path);
    if (!rc && mkdir(dir, 0700) != 0 && errno != EEXIST)
        rc = llmt_fail(LLMT_EIO, "%s: %s", dir, strerror(errno));
    int fd = rc ? -1 : open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (!rc && fd < 0)
        rc = llmt_fail(LLMT_EIO, "%s: %s", file, strerror(errno));
    if (fd >= 0)
        close(fd);
    return rc ? llmt_fail_prefix(rc, "the fast checkpoint directory") : rc;
}

/* The ranks whose marks dir holds: seen[r] = 1 (n ranks). */
static int read_marks(const char *dir, uint8_t *seen, int32_t n)
{
    DIR *d = opendir(dir);
    if (!d)
        return llmt_fail(LLMT_EIO, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end = NULL;
        long r = strncmp(e->d_name, "rank-", 5) == 0 ? strtol(e->d_name + 5, &end, 10) : -1;
        if (end && !*end && r >= 0 && r < n)
            seen[r] = 1;
    }
    closedir(d);
    return LLMT_OK;
}

/* Whom this rank shares its directory with (seen) against every rank's
 * leader: a rank sees exactly those with its leader. */
static int check_groups(const uint8_t *seen, const int32_t *leaders, int32_t n, int32_t me,
                        const char *path)
{
    for (int32_t r = 0; r < n; r++)
        if (!seen[r] != (leaders[r] != leaders[me]))
            return llmt_fail(LLMT_EIO, "fast checkpoint directory %s: rank %d %s rank %d's "
                             "files there, but ranks %d and %d disagree on that (a "
                             "directory shared by some ranks of a node but not all?)",
                             path, (int)me, seen[r] ? "sees" : "does not see", (int)r,
                             (int)me, (int)r);
    return LLMT_OK;
}

/* The probe (collective): every rank leaves its mark under msg's path,
 * reads whose marks it sees there, and the ranks compare. Fills f. */
static int probe(llmt_comm *c, const fast_tier *msg, llmt_dist_fast *f)
{
    const int32_t n = llmt_comm_size(c), me = llmt_comm_rank(c);
    char dir[PATH_CAP + 64], file[PATH_CAP + 96];
    snprintf(dir, sizeof dir, "%s/step-probe.tmp-%016llx", msg->path,
             (unsigned long long)msg->nonce); /* a name the stores clean up at open */
    snprintf(file, sizeof file, "%s/rank-%d", dir, (int)me);
    uint8_t *seen = calloc((size_t)n, 1);
    int32_t *leaders = calloc((size_t)n, sizeof *leaders);
    int rc = seen && leaders ? leave_mark(msg->path, dir, file)
                             : llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory");
    rc = llmt_dist_agree(c, rc);
    if (!rc)
        rc = llmt_dist_agree(c, read_marks(dir, seen, n));
    int32_t lead = 0;
    while (!rc && lead < me && !seen[lead]) /* seen[me], else check_groups fails */
        lead++;
    if (!rc) {
        leaders[me] = lead;
        rc = llmt_comm_allgather_items(c, "fast tier", leaders, sizeof *leaders);
    }
    if (!rc)
        rc = llmt_dist_agree(c, check_groups(seen, leaders, n, me, msg->path));
    /* Whatever the outcome (short of a failed collective), no mark stays:
     * each rank removes its own, and once all have, the directory goes. */
    unlink(file);
    if (rc != LLMT_ECOMM && !llmt_dist_agree(c, LLMT_OK))
        rmdir(dir);
    f->nodes = 0;
    for (int32_t r = 0; !rc && r < n; r++)
        f->nodes += leaders[r] == r;
    f->per_node = f->nodes > 1;
    f->leader = !rc && lead == me;
    free(leaders);
    free(seen);
    return rc;
}

int llmt_dist_fast_layout(llmt_trainer *tr)
{
    if (tr->dist_fast)
        return LLMT_OK;
    llmt_comm *c = tr->parts.optimizer->comm;
    const int32_t me = llmt_comm_rank(c);
    fast_tier *msg = calloc(1, sizeof *msg);
    llmt_dist_fast *f = calloc(1, sizeof *f);
    int rc = msg && f ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory");
    const llmt_ckpt_store *s = tr->parts.store;
    /* A read-only fast tier takes no saves: nothing to probe (a resume from
     * it passes over a checkpoint that some rank's node lacks). */
    if (!rc && me == ROOT && s && s->dir[LLMT_CKPT_FAST] && !s->read_only[LLMT_CKPT_FAST][0]) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        msg->has = 1;
        msg->nonce = ((uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec) ^
                     ((uint64_t)getpid() << 40);
        if (strlen(s->dir[LLMT_CKPT_FAST]) >= sizeof msg->path - 64)
            rc = llmt_fail(LLMT_EINVAL, "checkpoint: %s: path too long", s->dir[LLMT_CKPT_FAST]);
        else
            snprintf(msg->path, sizeof msg->path, "%s", s->dir[LLMT_CKPT_FAST]);
    }
    rc = llmt_dist_agree(c, rc);
    if (!rc)
        rc = llmt_comm_broadcast(c, "fast tier", msg, sizeof *msg, ROOT);
    if (!rc) {
        f->nodes = 1;
        f->leader = me == ROOT;
    }
    if (!rc && msg->has && llmt_comm_size(c) > 1)
        rc = probe(c, msg, f);
    if (!rc && f->per_node && f->leader && me != ROOT) {
        llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
        sc.sync = 0; /* as rank 0's fast tier (its rotation: llmt_dist_fast_rotate_nodes) */
        rc = llmt_ckpt_store_open(&f->store, tr->ctx, msg->path, &sc);
        if (rc)
            llmt_fail_prefix(rc, "the fast checkpoint directory of this rank's node");
    }
    rc = llmt_dist_agree(c, rc);
    if (!rc && f->per_node && me == ROOT)
        llmt_trainer_log(tr, "checkpoint", "fast checkpoint directory %s is local to each "
                         "node (%d directories): each keeps its own ranks' files, and a resume "
                         "from it needs every rank to find its files on its own node",
                         msg->path, (int)f->nodes);
    if (rc && f)
        llmt_ckpt_store_free(f->store);
    if (rc)
        free(f);
    else
        tr->dist_fast = f;
    free(msg);
    return rc;
}

/* Rank 0's *bytes bytes at *buf onto every rank (collective): the others
 * get a malloc'ed copy in *buf (NULL when empty) and the size in *bytes.
 * Agreed. */
static int broadcast_blob(llmt_comm *c, const char *what, void **buf, size_t *bytes)
{
    int64_t n = (int64_t)*bytes;
    LLMT_TRY(llmt_comm_broadcast(c, what, &n, sizeof n, ROOT));
    *bytes = (size_t)n;
    const int other = llmt_comm_rank(c) != ROOT;
    LLMT_TRY(llmt_dist_agree(c, other && n > 0 && !(*buf = malloc((size_t)n))
                                    ? llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory")
                                    : LLMT_OK));
    return n > 0 ? llmt_comm_broadcast_all(c, what, *buf, (size_t)n, ROOT) : LLMT_OK;
}

int llmt_dist_fast_per_node(const llmt_trainer *tr, int32_t tier)
{
    return tier == LLMT_CKPT_FAST && tr->dist_fast && tr->dist_fast->per_node;
}

int llmt_dist_fast_begin(llmt_trainer *tr, llmt_dist_save *sv)
{
    if (!llmt_dist_fast_per_node(tr, sv->tier))
        return LLMT_OK;
    llmt_comm *c = tr->parts.optimizer->comm;
    const int32_t me = llmt_comm_rank(c);
    int rc = LLMT_OK;
    if (tr->dist_fast->leader && me != ROOT) {
        if (mkdir(sv->dir, 0700) != 0)
            rc = llmt_fail(LLMT_EIO, "%s: cannot create the step's directory on this rank's "
                           "node's fast tier: %s", sv->dir, strerror(errno));
        else if (!(sv->tmp = strdup(sv->dir)))
            rc = llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory");
        if (rc == LLMT_ENOMEM)
            rmdir(sv->dir);
    }
    return llmt_dist_agree(c, rc);
}

int llmt_dist_fast_commit_nodes(llmt_trainer *tr, llmt_dist_save *sv, char **text, size_t *len)
{
    if (!llmt_dist_fast_per_node(tr, sv->tier))
        return LLMT_OK;
    llmt_comm *c = tr->parts.optimizer->comm;
    const int32_t me = llmt_comm_rank(c);
    int rc = broadcast_blob(c, "checkpoint manifest", (void **)text, len);
    if (!rc && tr->dist_fast->leader && me != ROOT) {
        rc = llmt_ckpt_commit_manifest(tr->dist_fast->store, LLMT_CKPT_DURABLE, sv->step,
                                       sv->tmp, *text, *len, 0); /* rotated after rank 0 */
        if (rc)
            llmt_fail_prefix(rc, "this rank's node's fast tier");
        free(sv->tmp); /* committed, or removed by the commit */
        sv->tmp = NULL;
    }
    return llmt_dist_agree(c, rc);
}

int llmt_dist_fast_rotate_nodes(llmt_trainer *tr, const llmt_dist_save *sv)
{
    if (!llmt_dist_fast_per_node(tr, sv->tier))
        return LLMT_OK;
    llmt_comm *c = tr->parts.optimizer->comm;
    const int32_t me = llmt_comm_rank(c);
    int64_t *steps = NULL;
    size_t n = 0;
    int rc = me == ROOT ? llmt_ckpt_scan(tr->parts.store, LLMT_CKPT_FAST, &steps, &n, NULL, 0)
                        : LLMT_OK;
    size_t bytes = n * sizeof *steps;
    rc = llmt_dist_agree(c, rc);
    if (!rc)
        rc = broadcast_blob(c, "fast tier rotation", (void **)&steps, &bytes);
    int mine = LLMT_OK;
    if (!rc && tr->dist_fast->leader && me != ROOT &&
        (mine = llmt_ckpt_keep_only(tr->dist_fast->store, LLMT_CKPT_DURABLE, steps,
                                    bytes / sizeof *steps)))
        llmt_fail_prefix(mine, "this rank's node's fast tier");
    free(steps);
    return rc ? rc : llmt_dist_agree(c, mine);
}

void llmt_dist_fast_free(llmt_trainer *tr)
{
    if (!tr->dist_fast)
        return;
    llmt_ckpt_store_free(tr->dist_fast->store);
    free(tr->dist_fast);
    tr->dist_fast = NULL;
}
