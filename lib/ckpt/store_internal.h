/* Internals of the checkpoint store, shared by its files. */
#ifndef LLMT_CKPT_STORE_INTERNAL_H
#define LLMT_CKPT_STORE_INTERNAL_H

#include <pthread.h>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "core/buffer.h"
#include "llmt/checkpoint.h"

#define CKPT_MODEL_FILE "model.safetensors"
#define CKPT_OPTIMIZER_FILE "optimizer.safetensors"
#define CKPT_USER_FILE "user.bin"
#define CKPT_MANIFEST_FILE "MANIFEST"

/* Everything one save writes, gathered on the caller's thread: the
 * manifest (files filled in while writing), the tensors (pointing into the
 * objects, or into the staging buffer for an async save) and the user blob. */
typedef struct ckpt_snapshot {
    llmt_manifest manifest;
    int tier;
    llmt_st_write_tensor *model_tensors, *opt_tensors;
    size_t n_model, n_opt;
    char *names; /* storage of every tensor name */
    char *model_meta_config; /* llmt.model_config metadata (JSON) */
    const void *user;
    size_t user_size;
    /* For backends whose memory is not host memory (sync save only). */
    const struct llmt_model *model;
    const struct llmt_optimizer *optimizer;
} ckpt_snapshot;

#define CKPT_LOCK_FILE "llmt.lock"

struct llmt_ckpt_store {
    llmt_context *ctx;
    char *dir[2];
    int keep[2];
    int sync[2];
    /* The flock'ed lock file of each tier (-1: none), held until free; a
     * fork child closes its copies (lock.c). */
    int lock_fd[2];
    /* Why a tier cannot be saved into ("" when it can): the store was opened
     * read_only, or its directory is not writable, or this is a fork child's
     * copy. Such a tier is neither locked nor cleaned. */
    char read_only[2][256];
    /* Per tier, the step this store last committed or loaded (-1: none).
     * Written by the save thread, read after a join. */
    int64_t committed[2];
    /* Per tier, the steps llmt_ckpt_latest found damaged (ascending,
     * malloc'ed): rotation neither counts nor deletes them. */
    int64_t *refused[2];
    size_t n_refused[2];
    /* The list of open stores a fork child walks (lock.c). */
    struct llmt_ckpt_store *next_open;

    /* The async save: at most one in flight. */
    pthread_t thread;
    int in_flight;
    int async_rc;          /* status of a finished async save, not yet reported */
    char async_error[1024]; /* its message (messages are per thread) */
    llmt_buf staging;      /* STAGING copy of the state, kept for the next save */
    ckpt_snapshot job;
};

/* Gathers state into snap. With staging, copies the tensors and user blob
 * into store->staging (allocated or grown as needed) first. */
int llmt_ckpt_snapshot(llmt_ckpt_store *s, const llmt_train_state *state, int tier, int staging,
                       ckpt_snapshot *snap);
void llmt_ckpt_snapshot_free(ckpt_snapshot *snap);

/* Refuses what llmt_ckpt_save (named fn in the messages) cannot save: a
 * NULL or mismatched state, a sharded optimizer, a tier that is absent or
 * read-only, a negative step. */
int llmt_ckpt_check_save(llmt_ckpt_store *s, const llmt_train_state *st, int32_t tier,
                         const char *fn);

/* Loads the tensors of checkpoint directory dir (manifest mf) into st's
 * model and, when st has one, unsharded optimizer: model.safetensors, then
 * optimizer.safetensors (format 1) or the shard files (format 2). */
int llmt_ckpt_load_tensors(const char *dir, const llmt_manifest *mf, const llmt_train_state *st);

/* Reads dir's user.bin (checksummed) into buf of cap bytes; *size (may be
 * NULL) gets its size, 0 when there is none. cap 0 reads nothing. */
int llmt_ckpt_load_user(const char *dir, const llmt_manifest *mf, void *buf, size_t cap,
                        size_t *size);

/* Writes every file of snap, MANIFEST last, into the empty directory tmp
 * (fsynced, entries included, when sync). */
int llmt_ckpt_write_dir(const char *tmp, ckpt_snapshot *snap, int sync);

/* Writes snap into tier's directory and commits it, then rotates. */
int llmt_ckpt_commit(llmt_ckpt_store *s, ckpt_snapshot *snap);

/* A fresh empty directory "<dir>/<name>.<tag>-XXXXXX" (malloc'ed path; NULL
 * after setting LLMT_EIO or LLMT_ENOMEM). A directory can be renamed onto it. */
char *llmt_ckpt_fresh_dir(const char *dir, const char *name, const char *tag);

/* "step-NNNNNNNN" of step into buf. */
void llmt_ckpt_dirname(char *buf, size_t cap, int64_t step);

/* The path of file name (NULL: the directory) of checkpoint step of tier,
 * malloc'ed. */
char *llmt_ckpt_file(const llmt_ckpt_store *s, int tier, int64_t step, const char *name);

/* Reads and parses the manifest of checkpoint step of tier (its checksum
 * included; llmt_ckpt_read_manifest_at); messages name the checkpoint. */
int llmt_ckpt_read_manifest(const llmt_ckpt_store *s, int64_t step, int tier, llmt_manifest *m);

/* The committed steps of a tier (directories named step-N), ascending,
 * malloc'ed (NULL when none). Anything else named like a checkpoint (a plain
 * file, a symbolic link) is ignored; with ignored non-NULL, one line per such
 * entry is appended there (a NUL-terminated buffer of cap bytes). */
int llmt_ckpt_scan(const llmt_ckpt_store *s, int tier, int64_t **steps, size_t *n, char *ignored,
                   size_t cap);

/* Takes tier's lock (an exclusive flock on CKPT_LOCK_FILE in its
 * directory, the pid written in it) or fails with LLMT_EBUSY naming the
 * holder's pid. A directory that cannot be written is opened read-only
 * instead, unlocked (s->read_only[tier] says why; saves there are refused). */
int llmt_ckpt_lock(llmt_ckpt_store *s, int tier);

/* Releases the locks taken by llmt_ckpt_lock. */
void llmt_ckpt_unlock(llmt_ckpt_store *s);

/* Adds s to (or removes it from) the open stores whose lock descriptors a
 * fork child closes. */
void llmt_ckpt_track(llmt_ckpt_store *s, int open);

/* Decides for llmt_ckpt_pick whether checkpoint step of tier is usable
 * (and may load it meanwhile): LLMT_OK takes it, LLMT_ECORRUPT refuses it
 * (the message says why), LLMT_ENOTFOUND skips it (it went away); any other
 * status ends the search with it. */
typedef int (*llmt_ckpt_try_fn)(void *arg, llmt_ckpt_store *s, int64_t step, int32_t tier);

/* llmt_ckpt_latest (arguments checked by the caller) with try_one in place
 * of the whole-file verification of each candidate: the same order (newest
 * first, the durable tier first at equal steps), notes, refusals and
 * relisting. A data-parallel resume passes one that loads the candidate on
 * every rank (lib/train/dist_ckpt.c). */
int llmt_ckpt_pick(llmt_ckpt_store *s, llmt_ckpt_try_fn try_one, void *arg, int64_t *step,
                   int32_t *tier, char *notes, size_t notes_cap);

/* Whether step of tier is one llmt_ckpt_latest refused. */
int llmt_ckpt_is_refused(const llmt_ckpt_store *s, int tier, int64_t step);

/* Forgets that step of tier was refused (it was replaced or set aside). */
void llmt_ckpt_forget_refused(llmt_ckpt_store *s, int tier, int64_t step);

/* The step this store last committed (or loaded) in tier, -1 for none:
 * what the trainer need not save again. Call after a join. */
int64_t llmt_ckpt_committed(const llmt_ckpt_store *s, int tier);

/* Joins an async save in flight; returns and clears its status, re-raising
 * its message on this thread. */
int llmt_ckpt_join(llmt_ckpt_store *s);

#endif
