/* The protocol of a data-parallel (sharded) save, lib/train/dist_ckpt.c, in
 * the steps its async form (dist_ckpt_async.c) runs apart: open and write
 * in the call (the writing on a thread), close at the join; and the
 * agreement the resume (dist_resume.c) shares. */
#ifndef LLMT_TRAIN_DIST_CKPT_H
#define LLMT_TRAIN_DIST_CKPT_H

#include "ckpt/store_internal.h"
#include "train/trainer_internal.h"

#define LLMT_DIST_ROOT 0 /* the rank that holds the store and commits */
#define LLMT_DIST_PATH_CAP 4096

/* llmt_comm_agree, except that every rank fails with the lowest failed
 * rank's status (not LLMT_ECOMM), so a damaged file one rank found is
 * LLMT_ECORRUPT, and named, on all of them. Collective. */
int llmt_dist_agree(llmt_comm *c, int rc);

/* One save across the ranks: rank 0's snapshot of the common state and the
 * step's temporary directory (tmp: the one this rank made, to remove on
 * failure: rank 0's, and with a fast tier local to each node each other
 * node's leader's; NULL elsewhere; dir: its path on every rank), and this
 * rank's file record. */
typedef struct llmt_dist_save {
    int32_t tier;
    int64_t step;
    int sync;
    char dir[LLMT_DIST_PATH_CAP];
    char *tmp;
    ckpt_snapshot snap;
    llmt_manifest_shard mine;
} llmt_dist_save;

/* Rank 0 checks the save, snapshots the common state (the user blob into
 * blob, cap bytes) and makes the step's temporary directory; every rank
 * learns its path. The status is agreed; on failure nothing is left. */
int llmt_dist_save_open(llmt_trainer *tr, int32_t tier, llmt_dist_save *sv, char *blob,
                        size_t cap);

/* This rank's files of sv: its range of o's state, and on rank 0 the
 * weights and the user blob. No collective: an async save runs it on its
 * writer thread. */
int llmt_dist_save_write(llmt_dist_save *sv, const llmt_optimizer *o, int32_t rank,
                         int32_t size);

/* After every rank wrote (rc: this rank's status): the ranks agree, send
 * rank 0 their records, and rank 0 commits (with a fast tier local to each
 * node, the other nodes' leaders first); or, on a failure anywhere, the
 * ranks that made a temporary directory remove it. The status is agreed; sv is
 * released, and on failure the trainer forgets having saved the step. */
int llmt_dist_save_close(llmt_trainer *tr, llmt_dist_save *sv, int rc);

/* Drops sv without a collective (its writing done): a rank that made a
 * temporary directory removes it; sv is released. */
void llmt_dist_save_abandon(llmt_dist_save *sv);

/* The three, one after the other: a synchronous save of tr in tier. */
int llmt_dist_save_sync(llmt_trainer *tr, int32_t tier);

#endif
