/* The fast tier of a data-parallel run, when its directory is local to each
 * node (tmpfs, a local disk): the same path names a different directory on
 * each node. The ranks find out once which of them share a directory (a
 * probe: each rank leaves a file there and lists who else did), and the
 * lowest rank of each group leads it: it makes the step's temporary
 * directory there, writes the MANIFEST (the same bytes on every node) and
 * commits that node's copy in a store of its own. Rank 0 commits last, and
 * the other nodes delete old copies only after that (keeping the steps rank
 * 0 lists), so a checkpoint rank 0 lists is on every node. A copy
 * holds its node's ranks' optimizer files (and on rank 0's node the common
 * files); it resumes only with the ranks where they were (dist_resume.c
 * falls back to an older or durable checkpoint otherwise). When every rank
 * sees one directory, nothing here changes the shared tier's protocol. */
#ifndef LLMT_TRAIN_DIST_FAST_TIER_H
#define LLMT_TRAIN_DIST_FAST_TIER_H

#include "train/dist_ckpt.h"

/* What this rank learnt of the fast tier (the trainer's dist_fast). */
typedef struct llmt_dist_fast {
    int per_node;  /* the ranks see more than one directory under the path */
    int leader;    /* this rank makes and commits its node's copy, and deletes old ones */
    int32_t nodes; /* directories seen (1 when shared, or no fast tier) */
    /* A leader other than rank 0: its node's directory as the store's
     * tier 0 (locked, cleaned at open; its copies deleted as rank 0's are:
     * llmt_dist_fast_rotate_nodes). */
    llmt_ckpt_store *store;
} llmt_dist_fast;

/* Collective, once per trainer (later calls return at once): learns from
 * rank 0's store whether there is a fast tier and, with more than one rank,
 * which ranks share its directory; opens the store of each other node's
 * leader. Fails on every rank (naming the rank and the path) when a rank
 * cannot reach the path, or ranks disagree on whom they share it with. */
int llmt_dist_fast_layout(llmt_trainer *tr);

/* Whether a save in tier is written per node. */
int llmt_dist_fast_per_node(const llmt_trainer *tr, int32_t tier);

/* After rank 0 made the step's temporary directory sv->dir: each other
 * node's leader makes the same path on its node (sv->tmp, so a failed save
 * removes it). Agreed. A no-op unless the save is per node. */
int llmt_dist_fast_begin(llmt_trainer *tr, llmt_dist_save *sv);

/* After every rank wrote and rank 0 formatted the MANIFEST (*text, *len on
 * rank 0): every rank receives the bytes (into *text, malloc'ed) and each
 * other node's leader commits its copy of sv (no rotation yet). Agreed. A
 * no-op unless the save is per node. A failure here leaves the nodes that
 * committed with a copy rank 0 does not list: never loaded (a resume
 * compares each rank's MANIFEST with rank 0's), deleted by the next save's
 * llmt_dist_fast_rotate_nodes. */
int llmt_dist_fast_commit_nodes(llmt_trainer *tr, llmt_dist_save *sv, char **text, size_t *len);

/* After rank 0 committed sv and rotated its fast tier: each other node's
 * leader deletes the copies whose steps rank 0 no longer lists (its
 * rotation's, and copies of saves rank 0 did not commit). Rotating only
 * now, not at its own commit, keeps every step rank 0 lists on every node
 * whatever instant a rank dies at. Agreed. A no-op unless the save is per
 * node. */
int llmt_dist_fast_rotate_nodes(llmt_trainer *tr, const llmt_dist_save *sv);

/* Releases what llmt_dist_fast_layout made (no collective). */
void llmt_dist_fast_free(llmt_trainer *tr);

#endif
