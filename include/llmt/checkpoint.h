/* llmt_ckpt_store: a directory of committed checkpoints of the full training
 * state (weights, optimizer moments and master weights, loss scaler, random
 * streams, data position, schedule and step, an opaque user blob), written
 * atomically, checksummed, verified before use, newest K kept; with an
 * optional fast tier (a directory on tmpfs) beside the durable one. The
 * on-disk format is specified in docs/checkpoint-format.md.
 *
 * A checkpoint is a directory step-NNNNNNNN holding model.safetensors,
 * optimizer.safetensors (or, saved by a data-parallel run, one
 * optimizer-RRRRR-of-NNNNN.safetensors per rank: format 2), user.bin (when
 * a blob is given) and MANIFEST, which lists every file's size and XXH3-64. It is written under a temporary name
 * and renamed into place after every file and the directory are synced, so a
 * crash at any instant leaves either the previous set of checkpoints or the
 * new one, never a half-written one under a checkpoint's name.
 *
 * Threads: a store is used by one thread at a time. An async save runs on a
 * thread of the store's; the next save, wait, or llmt_ckpt_store_free joins
 * it, and an error it met is returned by that next call. */
#ifndef LLMT_CHECKPOINT_H
#define LLMT_CHECKPOINT_H

#include "llmt/common.h"
#include "llmt/context.h"
#include "llmt/data.h"
#include "llmt/loss_scaler.h"
#include "llmt/model.h"
#include "llmt/optimizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_ckpt_store llmt_ckpt_store;

/* The two tiers. */
typedef enum llmt_ckpt_tier {
    LLMT_CKPT_DURABLE = 0, /* the store's directory, synced to disk */
    LLMT_CKPT_FAST = 1     /* the fast directory (tmpfs), not synced */
} llmt_ckpt_tier;

/* Version 2 appended read_only; a version 1 struct is still accepted. */
#define LLMT_CKPT_STORE_CONFIG_VERSION 2

typedef struct llmt_ckpt_store_config {
    uint32_t version;     /* LLMT_CKPT_STORE_CONFIG_VERSION */
    int32_t keep;         /* newest checkpoints kept in the durable tier: 5 */
    int32_t sync;         /* 1: fsync files and directories (durable tier): 1 */
    const char *fast_dir; /* the fast tier's directory, or NULL for none */
    int32_t fast_keep;    /* newest kept in the fast tier: 2 */
    int32_t read_only;    /* 1: open for reading only (no lock, no cleaning,
                             saves refused); the directories must exist: 0 */
} llmt_ckpt_store_config;

#define LLMT_CKPT_STORE_CONFIG_INIT {LLMT_CKPT_STORE_CONFIG_VERSION, 5, 1, 0, 2, 0}

/* Fills cfg with the defaults of LLMT_CKPT_STORE_CONFIG_INIT. It writes
 * sizeof(llmt_ckpt_store_config) bytes, which version 1 and 2 share (version
 * 2's read_only sits in version 1's tail padding), so a caller built against
 * either header may call it; see docs/API.md for appending fields. */
LLMT_API void llmt_ckpt_store_config_init(llmt_ckpt_store_config *cfg);

/* Opens (creating if needed) the durable directory dir and the fast one,
 * locks each, and finishes what an interrupted save left (step-*.tmp-*
 * directories are removed, a step-N.old-* one is put back when step-N is
 * missing). Leftovers that cannot be removed or put back because the store
 * is read-only (EROFS, EACCES, EPERM) are left, and llmt_ckpt_latest notes
 * them; any other failure fails the open naming the entry. cfg NULL means
 * LLMT_CKPT_STORE_CONFIG_INIT (no fast tier).
 *
 * Lock: a writing store takes an exclusive flock(2) on the file llmt.lock in
 * each directory, with this process's pid written in it, held until
 * llmt_ckpt_store_free. A second writing store on the same directory, in
 * another process or in this one, fails with LLMT_EBUSY naming the holder's
 * pid: at once, or within a second when the holder has just taken the lock
 * and not yet written its pid. A child made by fork(2) closes its copies of the lock as it
 * starts, before fork returns in it (its copy of the store can still list
 * and load, but not save), so the lock ends with the parent's store.
 *
 * Reading: with cfg->read_only, or when this process cannot write a
 * directory, that tier is opened for reading only (listing, verifying,
 * loading): it takes no lock, so any number of readers may open a store
 * beside the process training into it, and nothing is cleaned or written;
 * saving fails with LLMT_EIO saying why. A checkpoint that the writer
 * rotates away while a reader loads it fails that load (never loads wrong
 * bytes). A read_only store does not create directories: a missing one is
 * LLMT_ENOTFOUND.
 *
 * The store borrows ctx (for the STAGING buffer of async saves), which must
 * outlive it. Errors: LLMT_EINVAL, LLMT_EVERSION, LLMT_EBUSY, LLMT_ENOTFOUND,
 * LLMT_EIO naming the directory. */
LLMT_API int llmt_ckpt_store_open(llmt_ckpt_store **out, llmt_context *ctx, const char *dir,
                                  const llmt_ckpt_store_config *cfg);

/* Waits for an async save in flight, then releases the store and its locks;
 * NULL accepted. */
LLMT_API void llmt_ckpt_store_free(llmt_ckpt_store *store);

#define LLMT_TRAIN_STATE_VERSION 1

/* The objects and counters a checkpoint holds. model is required; the others
 * may be NULL (and are then neither saved nor loaded). */
typedef struct llmt_train_state {
    uint32_t version;             /* LLMT_TRAIN_STATE_VERSION */
    llmt_model *model;
    llmt_optimizer *optimizer;
    llmt_loss_scaler *scaler;
    llmt_loader *loader;
    int64_t step;                 /* training step: the checkpoint's name */
    int64_t tokens_seen;
    const void *user_blob;        /* the caller's own state (save), or NULL */
    size_t user_blob_size;
    const char *config_yaml;      /* the run's effective configuration (save), or NULL */
} llmt_train_state;

#define LLMT_TRAIN_STATE_INIT {LLMT_TRAIN_STATE_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/* Saves state as checkpoint state->step of tier, synchronously: returns once
 * it is committed (and, in the durable tier, synced). Rotation then deletes
 * the oldest beyond keep, never the one just committed. A failure removes
 * the temporary directory and leaves every earlier checkpoint as it was. A
 * checkpoint of the same step (valid or damaged) is replaced, atomically; a
 * non-directory of that name is not touched and the save fails. Errors:
 * LLMT_EIO naming the file (or the read-only tier), LLMT_EINVAL, and an
 * earlier async save's error. */
LLMT_API int llmt_ckpt_save(llmt_ckpt_store *store, const llmt_train_state *state, int32_t tier);

/* Like llmt_ckpt_save, but returns once the state has been copied into a
 * staging buffer (STAGING category, kept for the next save); a thread of the
 * store's writes and commits it. Changing the objects afterwards does not
 * change what is written. At most one save is in flight: this first waits
 * for the previous one (returning its error if it failed). */
LLMT_API int llmt_ckpt_save_async(llmt_ckpt_store *store, const llmt_train_state *state,
                                  int32_t tier);

/* Waits for an async save in flight; returns its status (LLMT_OK if none). */
LLMT_API int llmt_ckpt_wait(llmt_ckpt_store *store);

/* Steps of the committed checkpoints (directories step-N; anything else of
 * that name, such as a plain file, is ignored) of tier, ascending, into a
 * caller array of cap entries; *count receives how many there are (cap 0
 * asks for the count). Not verified: see llmt_ckpt_verify. */
LLMT_API int llmt_ckpt_list(llmt_ckpt_store *store, int32_t tier, int64_t *steps, size_t cap,
                            size_t *count);

/* Checks checkpoint step of tier completely: the manifest parses, its own
 * checksum holds and it names step, every listed file exists with the listed
 * size and XXH3-64, no other file is present. LLMT_ECORRUPT naming the file
 * for damage (a missing file included, and an entry that is not a regular
 * file: the store writes no links, directories or FIFOs there); LLMT_ENOTFOUND
 * ("no longer there") when the checkpoint's directory does not exist, as when
 * a writer beside a read_only store rotated it away; LLMT_EIO (a read that
 * failed) or LLMT_ENOMEM when the check could not be made, which says nothing
 * of the checkpoint. */
LLMT_API int llmt_ckpt_verify(llmt_ckpt_store *store, int64_t step, int32_t tier);

/* The newest checkpoint over both tiers that verifies (the higher step; the
 * durable one when both tiers hold it). Checkpoints passed over, entries
 * named like checkpoints that are not directories (ignored), and
 * step-N.old-* directories left by an interrupted save that could not be put
 * back, are described, one line each with the reason, in notes (a caller
 * buffer of notes_cap bytes, NUL-terminated, may be NULL with notes_cap 0).
 * Only damage (LLMT_ECORRUPT from llmt_ckpt_verify) passes a checkpoint
 * over: any other failure to check one (LLMT_EIO, LLMT_ENOMEM) stops the
 * search and is returned, since the checkpoint may well be good. A checkpoint
 * that is gone by the time it is checked (rotated away by a writer beside a
 * reader) is skipped, neither refused nor counted, and the directory is
 * listed again when nothing else verified. The checkpoints refused are
 * remembered: rotation neither counts them
 * toward keep nor deletes them (see llmt_ckpt_set_aside_invalid).
 * LLMT_ENOTFOUND when the store holds no checkpoint (a fresh start);
 * LLMT_ECORRUPT when it holds checkpoints and none verifies, the message
 * naming every one refused and why. */
LLMT_API int llmt_ckpt_latest(llmt_ckpt_store *store, int64_t *step, int32_t *tier, char *notes,
                              size_t notes_cap);

/* Verifies every checkpoint of both tiers and renames each damaged one
 * (LLMT_ECORRUPT) to step-N.refused-XXXXXX (a fresh unique name), a name no
 * listing takes for a checkpoint and rotation never deletes: what
 * llmt-train --start-over does before training from step 0 over them. Valid
 * checkpoints stay. *count (may be NULL) receives how many were set aside;
 * notes (may be NULL with notes_cap 0) one line per checkpoint set aside,
 * with the reason. Every checkpoint is verified before any is renamed: any
 * other failure to verify (LLMT_EIO, LLMT_ENOMEM) renames none. One node's
 * copy of a data-parallel checkpoint saved with a fast tier local to each
 * node (docs/distributed.md) does not verify alone, but a data-parallel
 * resume may load it: when such a copy passes the checks it can be given
 * here, nothing is renamed and LLMT_ESTATE names it. Errors: LLMT_EINVAL,
 * LLMT_EIO (a read-only tier, a failed rename, naming the path),
 * LLMT_ESTATE. */
LLMT_API int llmt_ckpt_set_aside_invalid(llmt_ckpt_store *store, size_t *count, char *notes,
                                         size_t notes_cap);

/* Loads checkpoint step of tier into the objects of state (which must match
 * what was saved: the model's configuration and precision, an optimizer and
 * scaler where the checkpoint has them, a loader over the same data), and
 * sets state->step and state->tokens_seen. The optimizer's hyper-parameters
 * and step count, the scaler's state, the context's random stream and the
 * loader's position are restored. The user blob goes into a caller buffer of
 * user_cap bytes (*user_size receives its size; cap 0 asks). Every byte is
 * checked against the manifest while it is read; on LLMT_ECORRUPT the
 * objects are partly overwritten and must be loaded again before use
 * (llmt_ckpt_latest verifies a checkpoint before naming it). Mismatches are
 * LLMT_EINVAL naming the field. */
LLMT_API int llmt_ckpt_load(llmt_ckpt_store *store, int64_t step, int32_t tier,
                            llmt_train_state *state, void *user_buf, size_t user_cap,
                            size_t *user_size);

/* The directory of checkpoint step of tier, into a caller buffer of cap
 * bytes (cap 0 asks for the size needed, NUL included). */
LLMT_API int llmt_ckpt_path(const llmt_ckpt_store *store, int64_t step, int32_t tier, char *out,
                            size_t cap, size_t *needed);

/* Rewrites checkpoint step of tier, a sharded one (format_version 2, saved
 * by a data-parallel run), in the single-file layout (format_version 1) as
 * out_dir/step-N: byte for byte what one process saving the same state
 * writes. The checkpoint is verified whole first; out_dir is created when
 * missing and step-N appears there complete (written under a temporary
 * name, fsynced, renamed) or not at all. Needs host memory for the weights
 * and the whole optimizer state. Errors: LLMT_EINVAL (NULL or empty
 * arguments, no such tier, a checkpoint that is not sharded, out_dir/step-N
 * already there, naming it), LLMT_ECORRUPT naming the damaged file,
 * LLMT_ENOTFOUND, LLMT_EIO naming the path, LLMT_ENOMEM. */
LLMT_API int llmt_ckpt_consolidate(llmt_ckpt_store *store, int64_t step, int32_t tier, const char *out_dir);

#define LLMT_CKPT_INFO_VERSION 1

/* What a checkpoint's MANIFEST says of it (llmt_ckpt_get_info). */
typedef struct llmt_ckpt_info {
    uint32_t version;            /* set by the caller: LLMT_CKPT_INFO_VERSION */
    int64_t step;                /* the training step: the checkpoint's name */
    int64_t epoch;               /* the data loader's epoch (0 without one) */
    int64_t tokens_seen;         /* training tokens consumed */
    int32_t format_version;      /* 1 single-file, 2 sharded (docs/checkpoint-format.md) */
    char library_version[32];    /* the writer's LLMT_VERSION_STRING, NUL-terminated */
    llmt_model_config model;     /* the model's configuration; model.precision the precision */
    int32_t has_optimizer;       /* 1: optimizer state saved */
    int32_t has_scaler;          /* 1: loss scaler state saved */
    int32_t has_data;            /* 1: a data loader's position saved */
    int64_t optimizer_steps;     /* updates the optimizer applied (0 without one) */
    int32_t world_size;          /* ranks of a sharded save; 0 for a single-file one */
    int32_t num_files;           /* the files the MANIFEST lists, shards included */
    uint64_t total_bytes;        /* their bytes (the MANIFEST itself not counted) */
} llmt_ckpt_info;

/* Fills info (its version set by the caller) from the MANIFEST of
 * checkpoint step of tier, after checking the manifest's own checksum and
 * that it names step; the other files are not read (llmt_ckpt_verify checks
 * them). First waits for an async save in flight, like llmt_ckpt_list.
 * Errors: LLMT_EINVAL (NULL arguments, no such tier, a negative step),
 * LLMT_EVERSION (info->version), LLMT_ENOTFOUND (no checkpoint step in that
 * tier, naming the directory), LLMT_ECORRUPT and LLMT_EIO naming the file. */
LLMT_API int llmt_ckpt_get_info(llmt_ckpt_store *store, int64_t step, int32_t tier, llmt_ckpt_info *info);

#ifdef __cplusplus
}
#endif

#endif
