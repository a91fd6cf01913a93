/* Where the model's gradients live (gradient offload, issue 15): the
 * elements [0, grad_split) in host memory, moved through a device bucket
 * (two slots where the host cannot read device memory, so that one is
 * stored while backward writes the other) while backward writes them, the
 * rest on the device. Shared by the model, the optimizer and the planner,
 * so plan and placement agree. */
#ifndef LLMT_MODEL_GRAD_PLACE_H
#define LLMT_MODEL_GRAD_PLACE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model_internal.h"

/* Elements of host gradients uploaded at once for the norm (and a sharded
 * optimizer's exchange) on a backend whose memory the host cannot read (a
 * multiple of LLMT_SHARD_GRANULE). */
#define LLMT_GRAD_STATS_CHUNK ((int64_t)1 << 20)

/* Where the host cannot read device memory, an offloaded bucket starts in
 * the device bucket at the alignment, modulo this many bytes, that it has
 * in a whole gradient buffer; the bucket has LLMT_GRAD_BUCKET_PAD elements
 * more for it (at least this many bytes for 2- and 4-byte elements). */
#define LLMT_GRAD_BUCKET_ALIGN 256
#define LLMT_GRAD_BUCKET_PAD ((int64_t)LLMT_GRAD_BUCKET_ALIGN / 2)

/* The gradient split for an offloaded prefix [0, prefix): prefix rounded
 * down to a multiple of LLMT_SHARD_GRANULE, so that no granule of the
 * gradient norm's partial sums is split between host and device. */
int64_t llmt_grad_split(int64_t prefix);

/* Buckets in flat order: 0 the embedding, 1 + l layer l, num_layers + 1 the
 * tail (final norm, and the LM head when untied). */
int32_t llmt_grad_bucket_count(const llmt_model *m);

/* The element range [*start, *end) of bucket b. Needs only the parameter
 * table (llmt_model_build_params). */
void llmt_grad_bucket_range(const llmt_model *m, int32_t b, int64_t *start, int64_t *end);

/* Slots of the device bucket: 1 where the host can read device memory
 * (the CPU: every copy is synchronous), else 2, bucket b written in slot
 * b % 2 (grad_buckets.c says why that is safe). */
int32_t llmt_grad_bucket_slots(int host_memory);

/* Elements of one slot for gradient split `split`: the largest bucket
 * starting below split (whole, straddle included); where the host cannot
 * read device memory at least min(split, LLMT_GRAD_STATS_CHUNK) for the
 * norm's uploads (into slot 0), plus LLMT_GRAD_BUCKET_PAD, rounded up to a
 * multiple of LLMT_GRAD_BUCKET_PAD (so each slot starts on an
 * LLMT_GRAD_BUCKET_ALIGN boundary); 0 when split is 0. */
int64_t llmt_grad_slot_elems(const llmt_model *m, int64_t split, int host_memory);

/* Elements of the whole device bucket: slots x slot elements. */
int64_t llmt_grad_bucket_elems(const llmt_model *m, int64_t split, int host_memory);

/* Elements of the offloaded gradients [0, split) that host memory holds
 * (host_grads' room) kept on demand (llmt_grads_home_on_demand, a
 * data-parallel step): what its stores need, the host part of a tied
 * model's embedding bucket (bucket 0, which the LM head writes in the
 * forward, so it is stored until the embedding's backward), none for an
 * untied model. The planner's and the controller's figure. */
int64_t llmt_grad_home_elems(const llmt_model *m, int64_t split);

/* Elements of the offloaded gradients [0, split) that rank keeps in host
 * memory in a data-parallel step of count micro-batches over size ranks
 * in reduce_mode (dist/shard.h): with from_slots (the engine sends them
 * from the device bucket's slots: NCCL on a backend whose memory the host
 * cannot read), all where it adds two micro-batches before an exchange,
 * else kept (llmt_grad_home_elems's, also on a rank that runs
 * none); without from_slots, all. */
int64_t llmt_dp_grad_home(int64_t split, int64_t kept, int from_slots, int32_t reduce_mode,
                          int32_t count, int32_t size, int32_t rank);

/* Whether the offloaded gradients' host copy is kept on demand. 0 (the
 * default): host_grads has room for the whole offloaded prefix from the
 * gradients' allocation on (llmt_grads_ensure, llmt_grads_place). 1: for
 * what a step keeps (llmt_grad_home_elems) from the allocation on, and
 * what the stores need, grown by a store to the end of the stored bucket's
 * host part and by llmt_grads_settle (and so a write of llmt_grads_io, but
 * not a read) to the whole prefix (each growth holds the old and new
 * copies for its moment), and brought back by llmt_grads_zero to what a
 * step keeps (llmt_grad_home_elems). For a step that sends every offloaded
 * bucket from its slot (llmt_grads_sent) and stores none but a tied
 * embedding's: llmt_optimizer_reduce_overlaps sets it, before the step's
 * rounds zero the gradients. */
void llmt_grads_home_on_demand(llmt_model *m, int on_demand);

/* Placement (grad_buckets.c). Each returns a status with a message set.
 * The gradients are allocated at their first use (llmt_grads_ensure), not
 * with the model, so a placement chosen before it (an optimizer created
 * with gradient offload) never holds every gradient on the device. */

/* Allocates the gradients, zero, at the model's grad_split where they are
 * not yet; the functions below that touch them call it. */
int llmt_grads_ensure(llmt_model *m);

/* Moves the gradients to split (0: all on the device; else a multiple of
 * LLMT_SHARD_GRANULE up to num_params, LLMT_EINVAL otherwise): allocates the
 * new buffers first, copies the settled values (none when every gradient
 * is zero), frees the old ones. Kept on demand, the new host copy has room
 * for what the old one held below split, or for all of it where values
 * move in from the device (zero gradients: for what a step keeps). On
 * failure (a budget refusing a buffer) no value and not the placement
 * changes (the settle before the allocation may have grown the room).
 * Before the gradients are allocated it only records split. */
int llmt_grads_place(llmt_model *m, int64_t split);

/* *base = the device address of bucket b's first element (element off of
 * the bucket at base + (off - start) * dtype size). A bucket on the device
 * is addressed in grads, with no copy. An offloaded one is loaded into its
 * slot of grad_bucket, after storing the bucket loaded before (if another)
 * and after the slot's last store has finished: its host part uploaded
 * from host_grads (or zeroed where host_valid says it holds none), its part
 * at or past grad_split copied from the device segment. Nothing here makes
 * the host wait for the device. */
int llmt_grads_acquire(llmt_model *m, int32_t bucket, char **base);

/* *at = the device address of gradient element off, which lies in bucket b
 * (llmt_grads_acquire of b). */
int llmt_grads_at(llmt_model *m, int32_t bucket, int64_t off, void **at);

/* Stores the loaded bucket (host part into host_grads, marking it valid;
 * the straddling part back into the device segment); none is loaded after.
 * Where the backend has copy_to_host_async the host part's store is queued
 * on the copy stream and may still run on return: host_grads is for the
 * host to read only after llmt_grads_settle. */
int llmt_grads_flush(llmt_model *m);

/* The loaded bucket b was sent from its slot by an exchange queued on the
 * engine (an overlapped reduction, grad_buckets.c's invariant 5): it is
 * dropped, not stored; its host part then reads as zero (its values went
 * to their owners), its part past grad_split stays in the device segment,
 * and its slot is marked in slots_sent, so that a load into it is refused
 * until the engine is joined. LLMT_EINVAL when b is not the loaded one. */
int llmt_grads_sent(llmt_model *m, int32_t b);

/* The engine was joined, or what it queued will not be used (it failed or
 * was aborted): no slot is marked any more. */
void llmt_grads_sent_joined(llmt_model *m);

/* Gives host_grads room for the whole offloaded prefix (where it is kept
 * on demand), flushes, waits for every queued store and upload of
 * host_grads, then zero-fills the host part of every offloaded bucket whose
 * host_valid is 0: host_grads then holds exactly the gradients, for the
 * host to read and write until the next acquire. */
int llmt_grads_settle(llmt_model *m);

/* Sets every gradient to zero: the device segment zeroed, every host part
 * marked as holding none (no host memory is written), the loaded bucket
 * dropped; kept on demand, the host copy's room back to what a step keeps.
 * Until the next acquire or write the model knows them zero
 * (llmt_grads_place then copies nothing). */
int llmt_grads_zero(llmt_model *m);

/* Copies the n gradients from element off between the model and the fp32
 * buffer buf (to_grads: buf -> gradients, rounded to nearest even), across
 * both segments, after settling: a write settles the whole prefix
 * (llmt_grads_settle), a read only the host copy's room (kept on demand,
 * what lies past it reads as zero without room made for it). */
int llmt_grads_io(llmt_model *m, int64_t off, int64_t n, float *buf, int to_grads);

#endif
