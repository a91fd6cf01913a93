/* What a checkpoint is, for every reader: a directory named step-N whose
 * MANIFEST parses, names step N, and matches the files beside it. Used by the
 * store (verify, latest, load) and by llmt_model_create_from_file. */
#ifndef LLMT_CKPT_CHECK_H
#define LLMT_CKPT_CHECK_H

#include <stdint.h>

#include "ckpt/manifest.h"

/* The step of a checkpoint directory's name (its last path component), or
 * -1: exactly "step-" and the 8 or more digits llmt_ckpt_dirname gives
 * ("step-35", "step-foo" and "step-00000035.old-x" are not checkpoints). */
int64_t llmt_ckpt_step_of(const char *name);

/* Reads and parses dir/MANIFEST (its own checksum included) into m (cleared
 * on failure); with step >= 0 the manifest must name that step. Messages
 * start with label and the file. A missing manifest, or one that is not a
 * regular file, is damage (LLMT_ECORRUPT); dir itself missing is
 * LLMT_ENOTFOUND (a writer rotated it away); a manifest that exists but
 * cannot be read keeps its own status (LLMT_EIO, LLMT_ENOMEM): that is no
 * evidence of damage. */
int llmt_ckpt_read_manifest_at(const char *dir, const char *label, int64_t step, llmt_manifest *m);

/* What llmt_ckpt_check_dir checks besides the manifest. */
enum {
    /* model.safetensors: its size and XXH3-64 (llmt_model_create_from_file). */
    LLMT_CKPT_CHECK_MODEL = 0,
    /* Every listed file's size and XXH3-64 (a sharded checkpoint's
     * optimizer files included), and that no unlisted file is present. */
    LLMT_CKPT_CHECK_ALL = 1,
    /* The first pass of a data-parallel resume, whose reads check what they
     * read (model.safetensors and user.bin whole on rank 0, each shard
     * file's chunks by the ranks that read them): every listed file present
     * as a regular file of its listed size, no unlisted file, and the
     * XXH3-64 of every file no such read covers: optimizer.safetensors
     * (format 1, read in unchecked slices) and shard files of an empty
     * range (no rank reads them; a header only). In a per-node fast
     * tier's copy (llmt_manifest.per_node) a missing shard file is passed
     * over: it is on another node, and the ranks that read it find out. */
    LLMT_CKPT_CHECK_UNREAD = 2,
    /* As LLMT_CKPT_CHECK_ALL, but in a per-node fast tier's copy any listed
     * file that is missing is passed over (another node's): whether the
     * files this copy holds are intact. */
    LLMT_CKPT_CHECK_NODE_COPY = 3,
};

/* Checks checkpoint directory dir: the manifest (as above), then what
 * `what` (LLMT_CKPT_CHECK_*) says. The manifest goes into m (the caller's
 * to clear) when m is not NULL. LLMT_ECORRUPT for damage (a missing or
 * mismatching file, an extra one, an entry that is not a regular file);
 * LLMT_ENOTFOUND when dir is gone (not damage: nothing is there to refuse);
 * any other status (LLMT_EIO for a read that failed, LLMT_ENOMEM) says the
 * check could not be made. */
int llmt_ckpt_check_dir(const char *dir, const char *label, int64_t step, int what,
                        llmt_manifest *m);

#endif
