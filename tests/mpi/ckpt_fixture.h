/* What the sharded-checkpoint tests under mpiexec share: the checkpoints
 * the save fixture left in DIR/ckpt (steps FIRST and HALF of dp_run.h's run,
 * saved by 4 ranks), copies of them to damage, and a resume over a copy. */
#ifndef LLMT_TEST_CKPT_FIXTURE_H
#define LLMT_TEST_CKPT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/manifest.h"
#include "dp_run.h"

enum { FIRST = 5 }; /* the earlier checkpoint, the fallback */

/* Runs the shell command fmt (two %s: a and b); aborts the job on failure. */
void sh(const char *fmt, const char *a, const char *b);

/* A copy of DIR/ckpt at DIR/<tag>-npN (out, cap bytes), made by rank 0. */
void copy_ckpt(const char *dir, const char *tag, char *out, size_t cap);

/* The trainer's log lines on this rank since the last resume (or since
 * log_text was emptied), kept by keep_log (an llmt_log_callback). */
extern char log_text[8192];
void keep_log(void *user, const char *line);

/* Opens a run over DIR's data with a store in ckpt (another seed: every
 * value must come from the checkpoint), its log into log_text, and resumes
 * it; *status gets the resume's. Returns the step every rank resumed from
 * (checked to be the same on all). */
int64_t resume(run *r, const char *dir, llmt_comm *comm, const char *ckpt, int *status);

/* Whether r's weights and this rank's range of the optimizer state are
 * those of the uninterrupted run (one process, ordered slicer, seed 77)
 * after steps steps, bit for bit. */
int same_as_uninterrupted(const run *r, const char *dir, int64_t steps);

/* Moves this rank into its simulated node's directory: base/A or base/B
 * (made by rank 0), after layout's letter for this rank ("AABB": ranks 0
 * and 1 on node A). A relative fast tier path then names a directory of
 * its node's own, as /dev/shm does on real nodes. Collective. */
void enter_node(const char *base, const char *layout);

/* Parses the MANIFEST of step in ckpt into m (aborts on failure). */
void read_manifest(const char *ckpt, int step, llmt_manifest *m);

/* Rewrites the MANIFEST of step HALF in ckpt with chunk checksums of 4 KiB
 * (computed here), so reads start and end inside chunks and cross their
 * bounds; with spoil >= 0, that chunk of the last optimizer file is recorded
 * wrong (a check of whole files still passes). Rank 0 only. */
void rechunk(const char *ckpt, int spoil);

#endif
