/* The directories of a checkpoint test and the store over them, shared by
 * the checkpoint tests: a temporary root holding the training fixture's
 * shards (data), the durable tier (ckpt) and the fast tier (fast). */
#ifndef LLMT_TEST_STORE_FIXTURE_H
#define LLMT_TEST_STORE_FIXTURE_H

#include "llmt/llmt.h"

typedef struct store_dirs {
    char root[64], data[128], store[128], fast[128];
} store_dirs;

/* Creates /tmp/llmt-<name>-XXXXXX and the shards in its data directory (the
 * store directories are left to the store to create). 0, or -1. */
int store_dirs_create(store_dirs *d, const char *name);

/* Removes the whole root; an llmt status. */
int store_dirs_remove(const store_dirs *d);

/* Opens a store on d's durable directory (and its fast one with with_fast),
 * keeping keep checkpoints, unsynced (test files need not reach the disk).
 * Aborts with the library's message when it cannot. */
llmt_ckpt_store *store_dirs_open(const store_dirs *d, llmt_context *ctx, int keep, int with_fast);

#endif
