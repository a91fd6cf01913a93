/* Sharded checkpoints (format_version 2, docs/checkpoint-format.md): the
 * optimizer state of a data-parallel save as one file per rank, written
 * into the temporary directory rank 0 made, and ranges of it read back at
 * any world size. The collective protocol around these is in
 * lib/train/dist_ckpt.c; rank 0 alone holds the store (and its lock, which
 * covers the temporary directory the other ranks write into). */
#ifndef LLMT_CKPT_SHARDS_H
#define LLMT_CKPT_SHARDS_H

#include "ckpt/store_internal.h"

/* Writes o's range [o->first, o->end) of each state section (exp_avg,
 * exp_avg_sq, master when present: 1-D tensors) into dir as rank's file of
 * a save of size ranks, fsynced when sync, and describes it in *out (name,
 * bytes, XXH3-64, range and chunk checksums: the file is read back once to
 * compute those). o's buffers are the backend's memory (on a backend whose
 * memory is not host memory, copied from the device as the file is
 * written). Release *out's chunks with free. No lock is taken: the
 * caller's rank 0 holds the store's. */
int llmt_ckpt_shard_write(const char *dir, const llmt_optimizer *o, int32_t rank, int32_t size,
                          int sync, llmt_manifest_shard *out);

/* Reads [o->first, o->end) of every state section of checkpoint directory
 * dir (manifest mf, already parsed) into o's buffers: from the shard files
 * that overlap the range (format 2), checking the file's size and the
 * chunk checksum of every chunk it reads before using a byte of it (the
 * header's chunks before parsing it), or, for format 1, from slices of
 * optimizer.safetensors (that file is checked whole by the caller first:
 * llmt_ckpt_latest, or LLMT_CKPT_CHECK_UNREAD on rank 0 of a data-parallel
 * resume); device memory is filled through a host buffer. No byte goes
 * unchecked that a caller uses; the chunks of a file no rank's range
 * overlaps are not read. Damage is
 * LLMT_ECORRUPT naming the file; an optimizer of another precision than the
 * checkpoint's LLMT_EINVAL. o->cfg and o->steps are left to the caller. */
int llmt_ckpt_shard_read(const char *dir, const llmt_manifest *mf, llmt_optimizer *o);

/* Rank 0's side of a sharded save of state (whose optimizer is sharded) in
 * tier: checks it as llmt_ckpt_save does, joins an async save, gathers the
 * state other than the optimizer tensors into *snap (its manifest format 2
 * with the optimizer's configuration, step count and world size) and makes
 * the step's temporary directory *tmp (malloc'ed). On failure nothing is
 * left to release. */
int llmt_ckpt_sharded_begin(llmt_ckpt_store *s, const llmt_train_state *st, int32_t tier,
                            ckpt_snapshot *snap, char **tmp);

/* Writes model.safetensors and user.bin of snap into tmp. */
int llmt_ckpt_sharded_write_common(const char *tmp, ckpt_snapshot *snap, int sync);

/* Writes text (len bytes: a formatted manifest of format 2, its shards
 * filled in, one record per rank) as tmp's MANIFEST and commits tmp as step
 * of tier (fsync, rename, and with rotation the rotation: llmt_ckpt_commit's
 * second half). tmp is removed on failure. A per-node fast tier's save
 * commits the same bytes on every node, each other node's leader into a
 * store of its own without rotation (lib/train/dist_fast_tier.c). */
int llmt_ckpt_commit_manifest(llmt_ckpt_store *s, int32_t tier, int64_t step, const char *tmp,
                              const char *text, size_t len, int rotation);

/* Deletes every checkpoint of tier whose step is not among keep[0..n): how
 * a per-node fast tier's other nodes follow rank 0's rotation (and drop
 * copies rank 0 never committed). */
int llmt_ckpt_keep_only(llmt_ckpt_store *s, int32_t tier, const int64_t *keep, size_t n);

#endif
