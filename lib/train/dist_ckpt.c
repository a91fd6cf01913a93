/* Checkpoints of a data-parallel run (format_version 2: docs/checkpoint-
 * format.md, "Sharded checkpoints"). Rank 0 alone holds the store and its
 * lock. Saving, it makes the step's temporary directory and tells the
 * others its path; every rank writes and fsyncs its optimizer range there,
 * rank 0 the weights and the user blob besides; the ranks agree, send rank 0
 * their file records, and rank 0 writes the MANIFEST and renames. A failure
 * anywhere removes the temporary directory: the previous checkpoint stays
 * the newest valid one (dist_ckpt_async.c runs the same protocol with the
 * writing on a thread of each rank's own; dist_resume.c loads). A fast tier
 * local to each node has a leader on each other node that makes, fills and
 * commits that node's copy before rank 0 commits (dist_fast_tier.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/shards.h"
#include "core/error.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/dist_ckpt.h"
#include "train/dist_fast_tier.h"
#include "train/trainer_internal.h"
#include "util/fsutil.h"
#include "util/task.h"

#define ROOT LLMT_DIST_ROOT
#define PATH_CAP LLMT_DIST_PATH_CAP

int llmt_dist_agree(llmt_comm *c, int rc)
{
    int failed = LLMT_OK;
    int agreed = llmt_comm_agree_code(c, rc, &failed);
    return agreed == LLMT_ECOMM && !rc && failed ? failed : agreed;
}

/* A rank's file record, as sent to rank 0 (its chunk checksums follow
 * separately). */
typedef struct record {
    char name[64];
    uint64_t bytes, xxh3, n_chunks;
    int64_t first, end;
} record;

/* Sends every rank's shard record to every rank (all-gathers: two
 * collectives, records then chunk checksums) and, on root, builds the
 * manifest's shard table into *out (malloc'ed). */
static int exchange_records(llmt_comm *c, const llmt_manifest_shard *mine,
                            llmt_manifest_shard **out)
{
    const int32_t n = llmt_comm_size(c), me = llmt_comm_rank(c);
    *out = NULL;
    record *recs = calloc((size_t)n, sizeof *recs);
    size_t *bytes = calloc((size_t)n * 2, sizeof *bytes);
    llmt_manifest_shard *sh = calloc((size_t)n, sizeof *sh);
    uint64_t *chunks = NULL;
    int rc = recs && bytes && sh ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory");
    rc = llmt_dist_agree(c, rc); /* no rank skips the collectives below alone */
    if (!rc) {
        record *r = &recs[me];
        snprintf(r->name, sizeof r->name, "%s", mine->file.name);
        r->bytes = mine->file.bytes;
        r->xxh3 = mine->file.xxh3;
        r->n_chunks = mine->n_chunks;
        r->first = mine->first;
        r->end = mine->end;
        rc = llmt_comm_allgather_items(c, "checkpoint records", recs, sizeof *recs);
    }
    const int reached = !rc; /* every rank got here, or none did */
    size_t total = 0;
    for (int32_t i = 0; i < n && !rc; i++) {
        bytes[i] = (size_t)recs[i].n_chunks * sizeof *chunks;
        bytes[n + i] = total;
        total += bytes[i];
    }
    if (!rc && !(chunks = malloc(total ? total : 1)))
        rc = llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory");
    if (reached)
        rc = llmt_dist_agree(c, rc);
    if (!rc) {
        if (bytes[me])
            memcpy((char *)chunks + bytes[n + me], mine->chunks, bytes[me]);
        rc = llmt_comm_allgatherv(c, "checkpoint records", (char *)chunks + bytes[n + me],
                                  chunks, bytes, bytes + n);
    }
    for (int32_t i = 0; i < n && !rc && me == ROOT; i++) {
        snprintf(sh[i].file.name, sizeof sh[i].file.name, "%s", recs[i].name);
        sh[i].file.bytes = recs[i].bytes;
        sh[i].file.xxh3 = recs[i].xxh3;
        sh[i].first = recs[i].first;
        sh[i].end = recs[i].end;
        sh[i].n_chunks = (size_t)recs[i].n_chunks;
        if (bytes[i] && !(sh[i].chunks = malloc(bytes[i])))
            rc = llmt_fail(LLMT_ENOMEM, "checkpoint: out of memory");
        else if (bytes[i])
            memcpy(sh[i].chunks, (char *)chunks + bytes[n + i], bytes[i]);
    }
    if (!rc && me == ROOT) {
        *out = sh;
        sh = NULL;
    }
    for (int32_t i = 0; sh && i < n; i++)
        free(sh[i].chunks);
    free(sh);
    free(chunks);
    free(bytes);
    free(recs);
    return rc;
}

/* What rank 0 tells the others before they write. */
typedef struct save_start {
    int64_t sync;
    char tmp[PATH_CAP];
} save_start;

/* Releases what sv holds; a rank that made a temporary directory (sv->tmp)
 * removes it when the save failed (rc), keeping rc's message. */
static int discard(llmt_dist_save *sv, int rc)
{
    if (rc && sv->tmp) {
        char why[1024];
        snprintf(why, sizeof why, "%s", llmt_error_last());
        llmt_remove_tree(sv->tmp);
        llmt_fail(rc, "%s", why);
    }
    llmt_ckpt_snapshot_free(&sv->snap); /* the shards included */
    free(sv->mine.chunks);
    free(sv->tmp);
    memset(sv, 0, sizeof *sv);
    return rc;
}

/* Rank 0 checks the save, snapshots the common state (the user blob into
 * blob, cap bytes) and makes the step's temporary directory; every rank
 * learns its path. The status is agreed; on failure nothing is left. */
int llmt_dist_save_open(llmt_trainer *tr, int32_t tier, llmt_dist_save *sv, char *blob,
                        size_t cap)
{
    llmt_comm *c = tr->parts.optimizer->comm;
    memset(sv, 0, sizeof *sv);
    if (tier == LLMT_CKPT_FAST)
        LLMT_TRY(llmt_dist_fast_layout(tr));
    sv->tier = tier;
    sv->step = tr->step;
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    llmt_trainer_fill_state(tr, &st, blob, cap);
    save_start start;
    memset(&start, 0, sizeof start);
    int rc = LLMT_OK;
    if (llmt_comm_rank(c) == ROOT) {
        llmt_ckpt_store *s = tr->parts.store;
        rc = s ? llmt_ckpt_sharded_begin(s, &st, tier, &sv->snap, &sv->tmp)
               : llmt_fail(LLMT_ESTATE, "checkpoint: rank 0 has no checkpoint store");
        if (!rc && strlen(sv->tmp) >= sizeof start.tmp)
            rc = llmt_fail(LLMT_EINVAL, "checkpoint: %s: path too long", sv->tmp);
        if (!rc) {
            snprintf(start.tmp, sizeof start.tmp, "%s", sv->tmp);
            start.sync = s->sync[tier];
        }
    }
    rc = llmt_dist_agree(c, rc);
    if (!rc)
        rc = llmt_comm_broadcast(c, "checkpoint start", &start, sizeof start, ROOT);
    memcpy(sv->dir, start.tmp, sizeof sv->dir);
    sv->sync = (int)start.sync;
    if (!rc)
        rc = llmt_dist_fast_begin(tr, sv); /* the same directory on each node */
    return rc ? discard(sv, rc) : LLMT_OK;
}

/* This rank's range of the optimizer state (a task's argument). */
typedef struct range_write {
    llmt_dist_save *sv;
    const llmt_optimizer *o;
    int32_t rank, size;
} range_write;

static int write_range(void *arg)
{
    const range_write *w = arg;
    return llmt_ckpt_shard_write(w->sv->dir, w->o, w->rank, w->size, w->sv->sync, &w->sv->mine);
}

/* Rank 0's common files: the weights and the user blob. */
static int write_common(void *arg)
{
    llmt_dist_save *sv = arg;
    return llmt_ckpt_sharded_write_common(sv->dir, &sv->snap, sv->sync);
}

/* This rank's files of sv: its range of o's state, and on rank 0 the
 * weights and the user blob (no collective: an async save runs it on its
 * writer thread). Rank 0 writes its range (on a thread of its own) and the
 * common files at once, as two ranks do, where the state is in host memory
 * (device copies would stay on this thread, one file after the other);
 * they fill disjoint parts of sv (sv->mine; the snapshot's manifest). */
int llmt_dist_save_write(llmt_dist_save *sv, const llmt_optimizer *o, int32_t rank,
                         int32_t size)
{
    range_write w = {sv, o, rank, size};
    const int root = rank == ROOT;
    int rc = llmt_task_pair(write_range, &w, root ? write_common : NULL, sv,
                            root && o->model->ops->host_memory);
    return rc ? llmt_fail_prefix(rc, "checkpoint step %lld", (long long)sv->step) : LLMT_OK;
}

/* After every rank wrote (rc: this rank's status): the ranks agree, send
 * rank 0 their records, and rank 0 commits (the other nodes' leaders of a
 * per-node fast tier first, and their rotation after); or, on a failure
 * anywhere, the ranks that made a temporary directory remove it. The
 * status is agreed. */
int llmt_dist_save_close(llmt_trainer *tr, llmt_dist_save *sv, int rc)
{
    llmt_comm *c = tr->parts.optimizer->comm;
    const int root = llmt_comm_rank(c) == ROOT;
    rc = llmt_dist_agree(c, rc);
    llmt_manifest_shard *shards = NULL;
    if (!rc)
        rc = llmt_dist_agree(c, exchange_records(c, &sv->mine, &shards));
    if (shards) { /* rank 0's manifest owns them from here on */
        sv->snap.manifest.shards = shards;
        sv->snap.manifest.world_size = llmt_comm_size(c);
        sv->snap.manifest.per_node = llmt_dist_fast_per_node(tr, sv->tier);
    }
    char *text = NULL;
    size_t len = 0;
    if (!rc)
        rc = llmt_dist_agree(c, root ? llmt_manifest_format(&sv->snap.manifest, &text, &len)
                                     : LLMT_OK);
    if (!rc) /* a per-node fast tier: the other nodes first */
        rc = llmt_dist_fast_commit_nodes(tr, sv, &text, &len);
    if (!rc) { /* rank 0 commits (or removes tmp); the ranks learn how it went */
        rc = llmt_dist_agree(c, root ? llmt_ckpt_commit_manifest(tr->parts.store, sv->tier,
                                                                 sv->step, sv->tmp, text, len, 1)
                                     : LLMT_OK);
        free(sv->tmp); /* committed, or removed by the commit */
        sv->tmp = NULL;
    }
    if (!rc) /* a per-node fast tier: the other nodes follow rank 0's rotation */
        rc = llmt_dist_fast_rotate_nodes(tr, sv);
    free(text);
    if (rc && tr->saved[sv->tier] == sv->step)
        tr->saved[sv->tier] = -1;
    return discard(sv, rc);
}

void llmt_dist_save_abandon(llmt_dist_save *sv)
{
    if (sv->tmp)
        llmt_remove_tree(sv->tmp);
    discard(sv, LLMT_OK);
}

int llmt_dist_save_sync(llmt_trainer *tr, int32_t tier)
{
    llmt_optimizer *o = tr->parts.optimizer;
    llmt_dist_save sv;
    char blob[256];
    LLMT_TRY(llmt_dist_save_open(tr, tier, &sv, blob, sizeof blob));
    int rc = llmt_dist_save_write(&sv, o, llmt_comm_rank(o->comm), llmt_comm_size(o->comm));
    rc = llmt_dist_save_close(tr, &sv, rc);
    tr->saved[tier] = rc ? -1 : tr->step;
    return rc;
}
