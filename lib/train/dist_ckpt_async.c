/* Async checkpoints of a data-parallel run: the protocol of dist_ckpt.c,
 * split at the writing. In the call, rank 0 opens the save and each rank
 * copies its part of the state into staging memory, then writes and fsyncs
 * its files from that copy on a thread of its own while training goes on.
 * The agreement, the records and rank 0's commit are collectives, so they
 * run on the caller's thread when the trainer joins the save, at a point
 * every rank reaches: a later step's save point once every rank's writer is
 * done, the next save, the step that reaches total_steps, the end of
 * llmt_trainer_run, an explicit wait (llmt_trainer_save) or a resume. No
 * collective runs on a writer thread, nor in llmt_trainer_free, which may
 * run on one rank alone (an error path before MPI_Abort): it joins this
 * rank's writer and abandons the save. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/dist_ckpt.h"
#include "util/task.h"

typedef struct llmt_dist_async llmt_dist_async;

/* A data-parallel run's async save: the save in flight (between
 * llmt_trainer_dist_save and the join that finishes it, the same on every
 * rank) and the staging its writer reads. */
struct llmt_dist_async {
    llmt_dist_save save;
    int pending;
    /* This rank's part of the state, copied: its optimizer range (what
     * `range` describes to the shard writer), then on rank 0 the weights
     * and the user blob. Kept for the next save. */
    llmt_buf staging;
    llmt_optimizer range;
    int32_t rank, size;
    llmt_task writer; /* this rank's writing (on a thread of its own if one can be had) */
};

static int write_part(void *arg)
{
    llmt_dist_async *a = arg;
    return llmt_dist_save_write(&a->save, &a->range, a->rank, a->size);
}

/* The staging of this rank's part: o's range of each state section (both
 * segments of an offloaded optimizer), and on rank 0 the weights and a
 * user blob of up to blob_cap bytes. */
static size_t staging_bytes(const llmt_optimizer *o, int root, size_t blob_cap)
{
    return o->hm.bytes + o->m.bytes + o->hv.bytes + o->v.bytes + o->hmaster.bytes +
           o->master.bytes + (root ? o->model->weights.bytes + blob_cap : 0);
}

/* Copies this rank's part of the state into a's staging: `range` becomes a
 * copy of o's range, whole in m, v and master (split = first: nothing
 * offloaded), what the shard writer reads; on rank 0 the snapshot's weights
 * and user blob then point into the staging. memcpy: the caller checked
 * that the model's backend keeps its buffers in host memory. */
static void stage(llmt_dist_async *a, const llmt_optimizer *o)
{
    char *at = a->staging.ptr;
    memset(&a->range, 0, sizeof a->range);
    a->range.model = o->model; /* its configuration only: constant during the run */
    a->range.cfg = o->cfg;
    a->range.steps = o->steps;
    a->range.state_dt = o->state_dt;
    a->range.first = o->first;
    a->range.end = o->end;
    a->range.split = o->first;
    a->range.has_master = o->has_master;
    llmt_buf *to[3] = {&a->range.m, &a->range.v, &a->range.master};
    for (int k = 0; k < 3; k++) {
        const llmt_buf *host, *dev;
        llmt_offload_section(o, k, &host, &dev);
        to[k]->category = dev->category;
        to[k]->bytes = host->bytes + dev->bytes;
        to[k]->ptr = to[k]->bytes ? at : NULL;
        if (host->bytes)
            memcpy(at, host->ptr, host->bytes); /* [first, split) */
        at += host->bytes;
        if (dev->bytes)
            memcpy(at, dev->ptr, dev->bytes); /* [split, end) */
        at += dev->bytes;
    }
    ckpt_snapshot *snap = &a->save.snap;
    if (a->rank != LLMT_DIST_ROOT)
        return;
    const llmt_model *m = o->model;
    memcpy(at, m->weights.ptr, m->weights.bytes);
    for (size_t i = 0; i < snap->n_model; i++) /* the same offsets, into the copy */
        snap->model_tensors[i].data =
            at + ((const char *)snap->model_tensors[i].data - (const char *)m->weights.ptr);
    at += m->weights.bytes;
    if (snap->user_size)
        memcpy(at, snap->user, snap->user_size);
    snap->user = at;
}

/* Makes a's staging the size this rank needs (the status is this rank's). */
static int reserve(llmt_trainer *tr, llmt_dist_async *a, size_t bytes)
{
    if (a->staging.bytes == bytes)
        return LLMT_OK;
    llmt_buf_free(tr->ctx, &a->staging);
    return llmt_buf_alloc(tr->ctx, &a->staging, LLMT_MEM_STAGING, bytes,
                          "data-parallel checkpoint staging");
}

int llmt_trainer_dist_save(llmt_trainer *tr, int32_t tier, int async)
{
    llmt_optimizer *o = tr->parts.optimizer;
    llmt_comm *c = o->comm;
    LLMT_TRY(llmt_trainer_dist_join(tr));
    if (!async)
        return llmt_dist_save_sync(tr, tier);
    char blob[256];
    const int root = llmt_comm_rank(c) == LLMT_DIST_ROOT;
    if (!o->model->ops->host_memory) { /* the same backend on every rank */
        llmt_trainer_log(tr, "checkpoint", "step %lld: the backend keeps the state in device "
                         "memory, which async saves do not stage; saving synchronously",
                         (long long)tr->step);
        return llmt_dist_save_sync(tr, tier);
    }
    if (!tr->dist_async && !(tr->dist_async = calloc(1, sizeof *tr->dist_async)))
        llmt_fail(LLMT_ENOMEM, "checkpoint: out of host memory");
    llmt_dist_async *a = tr->dist_async;
    int rc = a ? reserve(tr, a, staging_bytes(o, root, sizeof blob)) : LLMT_ENOMEM;
    int failed = LLMT_OK;
    rc = llmt_comm_agree_code(c, rc, &failed);
    if (rc && failed == LLMT_ENOMEM) { /* on any rank: every rank saves synchronously */
        llmt_trainer_log(tr, "checkpoint", "step %lld: async save does not fit (%s); saving "
                         "synchronously", (long long)tr->step, llmt_error_last());
        if (a) /* no staging kept charged for a save that did not use it */
            llmt_buf_free(tr->ctx, &a->staging);
        return llmt_dist_save_sync(tr, tier);
    }
    LLMT_TRY(rc);
    rc = llmt_dist_save_open(tr, tier, &a->save, blob, sizeof blob);
    if (rc) {
        tr->saved[tier] = -1;
        return rc;
    }
    a->rank = llmt_comm_rank(c);
    a->size = llmt_comm_size(c);
    stage(a, o);
    llmt_task_start(&a->writer, write_part, a, 1);
    a->pending = 1;
    tr->saved[tier] = tr->step;
    return LLMT_OK;
}

int llmt_trainer_dist_poll(llmt_trainer *tr)
{
    llmt_dist_async *a = tr->dist_async;
    if (!a || !a->pending)
        return LLMT_OK;
    int writing = !llmt_task_done(&a->writer);
    LLMT_TRY(llmt_trainer_dist_any(tr, &writing));
    return writing ? LLMT_OK : llmt_trainer_dist_join(tr);
}

/* Waits for this rank's writer (no collective); a's save is no longer in
 * flight. */
static void wait_writer(llmt_dist_async *a)
{
    llmt_task_wait(&a->writer);
    a->pending = 0;
}

int llmt_trainer_dist_join(llmt_trainer *tr)
{
    llmt_dist_async *a = tr->dist_async;
    if (!a || !a->pending)
        return LLMT_OK;
    wait_writer(a);
    const long long step = (long long)a->save.step;
    int rc = llmt_task_join(&a->writer); /* waited for: its status, its message raised */
    rc = llmt_dist_save_close(tr, &a->save, rc);
    return rc ? llmt_fail_prefix(rc, "the async save of step %lld failed", step) : LLMT_OK;
}

void llmt_trainer_dist_free(llmt_trainer *tr)
{
    llmt_dist_async *a = tr->dist_async;
    if (!a)
        return;
    if (a->pending) { /* local: the other ranks may be anywhere, or gone */
        wait_writer(a);
        llmt_trainer_log(tr, "checkpoint", "async save of step %lld abandoned: call "
                         "llmt_trainer_save (collective) before free%s%s",
                         (long long)a->save.step,
                         a->writer.rc ? "; its write had failed: " : "",
                         a->writer.rc ? a->writer.error : "");
        llmt_dist_save_abandon(&a->save);
    }
    llmt_buf_free(tr->ctx, &a->staging);
    free(a);
    tr->dist_async = NULL;
}
