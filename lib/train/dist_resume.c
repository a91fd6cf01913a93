/* The resume of a data-parallel run: one pass over the checkpoint's bytes,
 * split over the ranks (docs/checkpoint-format.md, "Loading at any world
 * size"). Rank 0 alone holds the store. It takes the candidates newest
 * first (llmt_ckpt_pick) and runs the cheap checks on one (the MANIFEST,
 * the files' presence and sizes); every rank then reads its own range of
 * the optimizer state, checking each chunk it reads, on a thread of its own
 * while rank 0 loads the weights and the run's position (those files
 * checked whole as they are read) and broadcasts them. The ranks agree on
 * the outcome: when any rank found damage, every rank goes on with the next
 * older candidate together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/check.h"
#include "ckpt/shards.h"
#include "core/error.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/dist_ckpt.h"
#include "train/trainer_internal.h"
#include "util/task.h"

#define ROOT LLMT_DIST_ROOT
#define PATH_CAP LLMT_DIST_PATH_CAP

/* What rank 0 tells the others, twice per candidate: the checkpoint to
 * load (more = 1; found, tier, dir and the optimizer's configuration, after
 * the cheap checks), then the run's position in it (after loading it); or
 * that the search is over (more = 0; found: the step resumed from, -1 for
 * none). */
typedef struct position {
    int64_t more, found, step, tokens_seen;
    int32_t tier;
    int32_t per_node;  /* a per-node fast tier's checkpoint (llmt_manifest.per_node) */
    uint64_t manifest; /* rank 0's MANIFEST checksum: every rank's copy must match */
    uint64_t blob_len;
    char blob[256];
    llmt_loader_state loader;
    llmt_loss_scaler_state scaler;
    llmt_optimizer_config opt_cfg;
    int64_t opt_steps;
    llmt_rng_state rng; /* the context's random stream */
    char dir[PATH_CAP]; /* the checkpoint's directory */
} position;

/* ---- this rank's range of the optimizer state */

/* A read of this rank's range (the task's argument), on a thread of its
 * own when the state is in host memory (else in place: device copies stay
 * on the caller's thread). It has its own copy of what it needs of the
 * position, which the next broadcast overwrites. */
typedef struct range_read {
    llmt_optimizer *o;
    int64_t step;
    uint64_t manifest;
    char dir[PATH_CAP];
    llmt_task task;
} range_read;

/* The MANIFEST of checkpoint step in dir into mf (label: for messages),
 * which must be the one rank 0 read (its checksum): a per-node fast tier's
 * copy on this rank's node may be left from a save that rank 0 did not
 * commit. */
static int read_rank0_manifest(const char *dir, const char *label, int64_t step,
                               uint64_t checksum, llmt_manifest *mf)
{
    int rc = llmt_ckpt_read_manifest_at(dir, label, step, mf);
    if (!rc && mf->checksum != checksum) {
        llmt_manifest_clear(mf);
        rc = llmt_fail(LLMT_ECORRUPT, "%s: file %s: not the one rank 0 read (a save of this "
                       "step that did not complete on every node)", label, CKPT_MANIFEST_FILE);
    }
    return rc;
}

/* From the files of the checkpoint in rr->dir, whose MANIFEST must be the
 * one rank 0 read (a per-node fast tier's copy on this rank's node may be
 * left from a save that rank 0 did not commit). */
static int read_range(void *arg)
{
    range_read *rr = arg;
    char label[PATH_CAP + 16];
    snprintf(label, sizeof label, "checkpoint %s", rr->dir);
    llmt_manifest mf;
    int rc = read_rank0_manifest(rr->dir, label, rr->step, rr->manifest, &mf);
    if (!rc && (rc = llmt_ckpt_shard_read(rr->dir, &mf, rr->o)))
        llmt_fail_prefix(rc, "%s", label);
    llmt_manifest_clear(&mf);
    return rc;
}

static void range_read_start(range_read *rr, llmt_optimizer *o, const position *pos)
{
    rr->o = o;
    rr->step = pos->found;
    rr->manifest = pos->manifest;
    memcpy(rr->dir, pos->dir, sizeof rr->dir);
    llmt_task_start(&rr->task, read_range, rr, o->model->ops->host_memory);
}

/* ---- rank 0's part of a candidate */

/* A resume's search on rank 0 (the argument of its llmt_ckpt_try_fn). */
typedef struct search {
    llmt_trainer *tr;
    position *pos;
    int touched; /* a candidate got past the cheap checks: objects overwritten */
} search;

/* The cheap checks of checkpoint step of tier (llmt_ckpt_check_dir
 * LLMT_CKPT_CHECK_UNREAD: no file hashed that a later read checks), and
 * the first half of pos. */
static int root_check(search *sr, llmt_ckpt_store *s, int64_t step, int32_t tier)
{
    position *pos = sr->pos;
    char name[64], label[128];
    llmt_ckpt_dirname(name, sizeof name, step);
    snprintf(label, sizeof label, "checkpoint %s (%s)", name, tier ? "fast" : "durable");
    size_t need = 0;
    llmt_manifest mf;
    LLMT_TRY(llmt_ckpt_path(s, step, tier, pos->dir, sizeof pos->dir, &need));
    LLMT_TRY(llmt_ckpt_check_dir(pos->dir, label, step, LLMT_CKPT_CHECK_UNREAD, &mf));
    int rc = mf.has_optimizer ? llmt_optimizer_config_check(&mf.optimizer, "the checkpoint's "
                                                            "optimizer")
                              : llmt_fail(LLMT_EINVAL, "%s: the checkpoint has no optimizer "
                                          "state", label);
    pos->more = 1;
    pos->found = step;
    pos->tier = tier;
    pos->opt_cfg = mf.optimizer;
    pos->opt_steps = mf.optimizer_steps;
    pos->per_node = mf.per_node;
    pos->manifest = mf.checksum;
    llmt_manifest_clear(&mf);
    return rc;
}

/* Loads the candidate in pos into the trainer's objects but the optimizer's
 * tensors (each file checked whole as it is read) and fills the rest of
 * pos. */
static int root_load(search *sr)
{
    llmt_trainer *tr = sr->tr;
    const llmt_trainer_parts *p = &tr->parts;
    position *pos = sr->pos;
    sr->touched = 1;
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    char own_blob[256];
    llmt_trainer_fill_state(tr, &st, own_blob, sizeof own_blob);
    st.optimizer = NULL; /* each rank reads its range of it */
    size_t len = 0;
    LLMT_TRY(llmt_ckpt_load(p->store, pos->found, pos->tier, &st, pos->blob, sizeof pos->blob - 1,
                            &len));
    pos->blob[len] = '\0';
    LLMT_TRY(llmt_trainer_restore_blob(tr, pos->blob, len));
    tr->step = pos->step = st.step;
    tr->tokens_seen = pos->tokens_seen = st.tokens_seen;
    pos->blob_len = len;
    pos->loader.version = LLMT_LOADER_STATE_VERSION;
    pos->scaler.version = LLMT_LOSS_SCALER_STATE_VERSION;
    LLMT_TRY(llmt_loader_get_state(p->loader, &pos->loader));
    if (p->scaler)
        LLMT_TRY(llmt_loss_scaler_get_state(p->scaler, &pos->scaler));
    return llmt_context_rng_get(tr->parts.model->ctx, &pos->rng);
}

/* ---- every rank's part of a candidate */

/* Applies rank 0's position on another rank. */
static int take_position(llmt_trainer *tr, const position *pos)
{
    const llmt_trainer_parts *p = &tr->parts;
    LLMT_TRY(llmt_loader_set_state(p->loader, &pos->loader));
    if (p->scaler)
        LLMT_TRY(llmt_loss_scaler_set_state(p->scaler, &pos->scaler));
    LLMT_TRY(llmt_trainer_restore_blob(tr, pos->blob, (size_t)pos->blob_len));
    LLMT_TRY(llmt_context_rng_set(p->model->ctx, &pos->rng));
    tr->step = pos->step;
    tr->tokens_seen = pos->tokens_seen;
    return LLMT_OK;
}

/* The ranks' agreement on their reads of a candidate, damage first: when
 * any rank found damage (LLMT_ECORRUPT) every rank returns LLMT_ECORRUPT
 * with the lowest such rank's message, so all fall back together whatever
 * else failed elsewhere (a rank's other failure is logged); else the
 * lowest failed rank's status (llmt_dist_agree). */
static int agree_damage_first(llmt_trainer *tr, int rc)
{
    llmt_comm *c = tr->parts.optimizer->comm;
    int64_t damaged = rc == LLMT_ECORRUPT;
    char why[1024] = "";
    if (rc)
        snprintf(why, sizeof why, "%s", llmt_error_last());
    int sent = llmt_comm_allreduce_i64(c, "resume", &damaged, 1, LLMT_COMM_MAX);
    if (sent)
        return sent;
    if (!damaged)
        return llmt_dist_agree(c, rc ? llmt_fail(rc, "%s", why) : LLMT_OK);
    if (rc && rc != LLMT_ECORRUPT)
        llmt_trainer_log(tr, "resume", "rank %d: %s (another rank found damage: every rank "
                         "tries the next older checkpoint)", llmt_comm_rank(c), why);
    /* Only the damaged ranks fail here: every rank gets LLMT_ECORRUPT. */
    return llmt_dist_agree(c, rc == LLMT_ECORRUPT ? llmt_fail(rc, "%s", why) : LLMT_OK);
}

/* Whether this rank can load its part of the candidate in pos, checked
 * before anything is loaded: it sees the checkpoint's directory (the
 * durable one is shared; a fast one may be local to each node); and in one
 * node's copy of a per-node fast tier's checkpoint, its node's MANIFEST is
 * rank 0's and holds the files of this rank's range (else the ranks are not
 * where they were at the save). LLMT_ECORRUPT makes every rank go on to the
 * next candidate. */
static int can_load_here(const llmt_optimizer *o, const position *pos)
{
    const char *why = "a fast tier local to each node: a rank resumes from it only where its "
                      "files are, as where the ranks were at the save";
    if (access(pos->dir, R_OK | X_OK) != 0)
        return pos->tier == LLMT_CKPT_FAST
                   ? llmt_fail(LLMT_ECORRUPT, "checkpoint %s: not on this rank's node (%s)",
                               pos->dir, why)
                   : llmt_fail(LLMT_EIO, "cannot read the checkpoint %s (the durable directory "
                               "must be one file system that every rank sees)", pos->dir);
    if (!pos->per_node)
        return LLMT_OK;
    char label[PATH_CAP + 16];
    snprintf(label, sizeof label, "checkpoint %s", pos->dir);
    llmt_manifest mf;
    int rc = read_rank0_manifest(pos->dir, label, pos->found, pos->manifest, &mf);
    for (int32_t r = 0; !rc && r < mf.world_size; r++) {
        const llmt_manifest_shard *sh = &mf.shards[r];
        if (sh->end <= o->first || o->end <= sh->first || sh->first == sh->end)
            continue;
        char path[PATH_CAP + 80];
        snprintf(path, sizeof path, "%s/%s", pos->dir, sh->file.name);
        if (access(path, F_OK) != 0)
            rc = llmt_fail(LLMT_ECORRUPT, "%s: file %s: not on this rank's node (%s)", label,
                           sh->file.name, why);
    }
    llmt_manifest_clear(&mf);
    return rc;
}

/* Once rank 0 sent the candidate (pos, first half; sr: rank 0's search,
 * NULL elsewhere): this rank's range of the optimizer state read while rank
 * 0 loads the rest; then the weights and the position from rank 0. The
 * status is agreed: a rank that found damage makes it LLMT_ECORRUPT on
 * every rank, its message (naming the rank, the path and the file) passed
 * on. */
static int load_everywhere(llmt_trainer *tr, position *pos, search *sr)
{
    llmt_optimizer *o = tr->parts.optimizer;
    llmt_model *m = tr->parts.model;
    llmt_comm *c = o->comm;
    LLMT_TRY(agree_damage_first(tr, can_load_here(o, pos)));
    range_read rr; /* rank 0 too: two streams read faster than one after the other */
    range_read_start(&rr, o, pos);
    int rc = llmt_dist_agree(c, sr ? root_load(sr) : LLMT_OK);
    if (!rc)
        rc = llmt_comm_broadcast(c, "resume", pos, sizeof *pos, ROOT);
    if (!rc)
        rc = llmt_comm_broadcast_all(c, "resume: weights", m->weights.ptr, m->weights.bytes, ROOT);
    /* The agreed failure keeps its message (the join may set another). */
    char why[1024] = "";
    if (rc)
        snprintf(why, sizeof why, "%s", llmt_error_last());
    int mine = llmt_task_join(&rr.task);
    if (rc)
        return llmt_fail(rc, "%s", why);
    if (!sr)
        m->weights_epoch++; /* the weights changed under the optimizer (rank 0's load did it) */
    if (!mine && !sr)
        mine = take_position(tr, pos);
    o->cfg = pos->opt_cfg;
    o->steps = pos->opt_steps;
    o->weights_epoch = m->weights_epoch; /* the master came with the weights */
    return agree_damage_first(tr, mine);
}

/* llmt_ckpt_pick's try on rank 0: the cheap checks alone (no collective
 * when they fail: the others wait for the next candidate), then the load
 * on every rank. A step that did not load is no longer the store's last
 * loaded one. */
static int try_everywhere(void *arg, llmt_ckpt_store *s, int64_t step, int32_t tier)
{
    search *sr = arg;
    int rc = root_check(sr, s, step, tier);
    if (!rc)
        rc = llmt_comm_broadcast(sr->tr->parts.optimizer->comm, "resume", sr->pos,
                                 sizeof *sr->pos, ROOT);
    if (!rc)
        rc = load_everywhere(sr->tr, sr->pos, sr);
    if (rc && s->committed[tier] == step)
        s->committed[tier] = -1;
    return rc;
}

/* ---- the search */

/* Rank 0's side: the candidates newest first, each loaded on every rank
 * until one loads everywhere; then the end of the search, and its status,
 * to every rank. */
static int root_resume(llmt_trainer *tr, position *pos)
{
    const char *fn = "llmt_trainer_resume_latest";
    llmt_comm *c = tr->parts.optimizer->comm;
    search sr = {tr, pos, 0};
    int64_t found = -1;
    int32_t tier = 0;
    char notes[4096] = "";
    int rc = tr->parts.store ? llmt_ckpt_pick(tr->parts.store, try_everywhere, &sr, &found, &tier,
                                              notes, sizeof notes)
                             : llmt_fail(LLMT_ESTATE, "the trainer has no store");
    if (notes[0])
        llmt_trainer_log(tr, "resume", "checkpoints passed over:\n%s", notes);
    if (rc == LLMT_ENOTFOUND && !sr.touched) { /* an empty store: a fresh start */
        rc = LLMT_OK;
        found = -1;
    } else if (rc && sr.touched) { /* never a fresh start from half-loaded objects */
        char why[3072];
        snprintf(why, sizeof why, "%s", llmt_error_last());
        llmt_fail(rc, "%s: no checkpoint loaded, and the model's weights and the run's state "
                  "may be partly overwritten by those tried (recreate them before training): %s",
                  fn, why);
    } else if (rc) {
        llmt_fail_prefix(rc, "%s", fn);
    } else {
        llmt_trainer_log(tr, "resume", "resumed from step %lld (%s tier)", (long long)found,
                         tier ? "fast" : "durable");
    }
    pos->more = 0;
    pos->found = rc ? -1 : found;
    int sent = llmt_comm_broadcast(c, "resume", pos, sizeof *pos, ROOT);
    return sent ? sent : llmt_dist_agree(c, rc);
}

/* Another rank's side: loads each candidate rank 0 sends until the end of
 * the search (logging each refusal); then rank 0's status. */
static int follow_resume(llmt_trainer *tr, position *pos)
{
    llmt_comm *c = tr->parts.optimizer->comm;
    for (;;) {
        LLMT_TRY(llmt_comm_broadcast(c, "resume", pos, sizeof *pos, ROOT));
        if (!pos->more)
            return llmt_dist_agree(c, LLMT_OK);
        if (load_everywhere(tr, pos, NULL) == LLMT_ECORRUPT)
            llmt_trainer_log(tr, "resume", "checkpoint %s refused: %s", pos->dir,
                             llmt_error_last());
    }
}

int llmt_trainer_dist_resume(llmt_trainer *tr, int64_t *step)
{
    llmt_optimizer *o = tr->parts.optimizer;
    LLMT_TRY(llmt_trainer_dist_join(tr)); /* the save in flight is committed first */
    position *pos = calloc(1, sizeof *pos);
    int rc = llmt_dist_agree(o->comm, pos ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "resume: out of "
                                                                "memory"));
    if (!rc)
        rc = llmt_comm_rank(o->comm) == ROOT ? root_resume(tr, pos) : follow_resume(tr, pos);
    if (!rc && pos->found >= 0)
        tr->saved[pos->tier] = pos->found; /* its state is this checkpoint */
    *step = rc ? -1 : pos->found;
    free(pos);
    return rc;
}
