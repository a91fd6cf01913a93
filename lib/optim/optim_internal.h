/* Internals of the optimizer shared with the checkpoint store. */
#ifndef LLMT_OPTIM_INTERNAL_H
#define LLMT_OPTIM_INTERNAL_H

#include "llmt/optimizer.h"
#include "core/buffer.h"
#include "dist/comm_internal.h"
#include "ops/ops.h"

struct llmt_optimizer {
    llmt_model *model;
    llmt_optimizer_config cfg;
    int64_t steps;  /* updates applied */
    int state_dt;   /* dtype of the moments */
    /* The range of the flat parameter buffer this optimizer updates (all of
     * it unless sharded), split at `split` (offload.c): the state of
     * [first, split) lives in host memory, hm, hv and hmaster (HOST_STATE)
     * holding element first + i at i; that of [split, end) on the device, m,
     * v and master (OPTIMIZER) holding element split + i at i. split is
     * first without offload. */
    int64_t first, end, split;
    llmt_buf m, v;  /* moments */
    llmt_buf master; /* fp32 master weights (mixed modes), else empty */
    llmt_buf hm, hv, hmaster; /* the same for the host segment */
    /* Backends without host_memory: the host segment's transfer staging
     * (gradients in, weights out; each LLMT_OFFLOAD_HALVES halves of
     * min(split - first, LLMT_OFFLOAD_CHUNK) weight elements, pinned; who
     * may touch a half when: offload.c's update_pipelined) and the CPU
     * backend that updates it. */
    llmt_buf stage_g, stage_w;
    llmt_device *host_dev;
    int32_t offload_parts, offload_layers; /* as llmt_optimizer_get_offload reports */
    /* The mode keeps master weights (even where this rank's range, and so
     * master, is empty: ranks must agree on what state exists). */
    int has_master;
    llmt_buf scratch; /* ops->optim_scratch_bytes */
    uint64_t weights_epoch; /* the model's weights_epoch the master copies */
    /* Per LLMT_SHARD_GRANULE block of the whole buffer, the gradient's sum
     * of squares (host; NULL where the backend has no grad_stats_blocks). */
    double *partials;

    /* Sharded (ZeRO-1) only; comm NULL otherwise. */
    llmt_comm *comm;
    int32_t reduce_mode;   /* llmt_reduce_mode */
    int64_t *bounds;       /* size + 1 element bounds of the ranks' ranges */
    int64_t *block_bounds; /* the same in granules */
    int64_t *tensor_bounds; /* scratch: the ranks' parts of one tensor (get_state) */
    /* The owner's gradient sum over [first, end): end - first fp32 values
     * the contributions are added to. The norm and AdamW read it in the
     * model's dtype: in the 16-bit modes llmt_optimizer_sharded_stats first
     * rounds it in place, so that its first (end - first) x 2 bytes hold
     * the sum as bf16 or fp16. */
    llmt_buf grad_sum;
    llmt_buf recv;         /* exchange receive buffer */
    int grads_reduced;     /* grad_sum holds this step's gradient */
};

/* Bytes of each moment buffer and of the master weights (0 when the mode has
 * none) for num_params parameters under a precision mode. */
void llmt_optimizer_sizes(int precision, int64_t num_params, size_t *moment_bytes,
                          size_t *master_bytes);

/* Sets up o (model, cfg and precision set) to update [first, end):
 * allocates the moments, master weights (copied from the model), scratch
 * and the norm partials, placed as cfg's offload fields say. */
int llmt_optimizer_alloc_state(llmt_optimizer *o, int64_t first, int64_t end);

/* Offload (offload.c). Allocates o's state for split point split (first <=
 * split <= end) with zero moments and master weights from the model,
 * replacing nothing (o's buffers must be empty). */
int llmt_offload_alloc(llmt_optimizer *o, int64_t split);

/* Releases the state buffers of both segments and the host backend. */
void llmt_offload_free(llmt_optimizer *o);

/* Copies the model's weights of [first, end) into the master weights of both
 * segments (mixed modes; nothing otherwise). */
int llmt_offload_master_from_weights(llmt_optimizer *o);

/* AdamW over [off, e) of the host segment (first <= off < e <= split): a
 * holds every field but the pointers, n and rng_offset. The gradients come
 * from where the model keeps them (host_grads below its grad_split), a
 * sharded optimizer's from its reduced sum. Where
 * the host cannot read the backend's memory the copies overlap the host's
 * AdamW; the ops queued after it see the updated weights. */
int llmt_offload_update(llmt_optimizer *o, llmt_adamw_args a, int64_t off, int64_t e);

/* The model's gradient split o's placement asks for
 * (llmt_offload_grad_split_of). */
int64_t llmt_offload_grad_split(const llmt_optimizer *o);

/* LLMT_EUNSUPPORTED (naming fn and parts) where parts asks for gradient
 * offload and o's backend has no grad_stats_blocks. */
int llmt_offload_check_backend(const llmt_optimizer *o, const char *fn, int32_t parts);

/* Places the model's gradients as o's placement asks (llmt_grads_place),
 * where they are not already. */
int llmt_offload_place_grads(llmt_optimizer *o);

/* The split point of o's range [first, end) for an offload of (parts,
 * layers): the offloaded prefix (llmt_offload_prefix) clamped to the range. */
int64_t llmt_offload_split(const llmt_optimizer *o, int32_t parts, int32_t layers);

/* The buffers of state section sec (0 first moment, 1 second, 2 master):
 * the host segment's and the device segment's. */
void llmt_offload_section(const llmt_optimizer *o, int sec, const llmt_buf **host,
                          const llmt_buf **dev);

/* The buffer of state section sec (0 first moment, 1 second, 2 master) that
 * holds element e (first <= e < end), and e's element index in it. */
void *llmt_offload_state_base(const llmt_optimizer *o, int sec, int64_t e, int64_t *index);

/* Copies n fp32 values between host buf and state section sec from element
 * e0 on (within [first, end)), across both segments; to_state writes the
 * state (rounded to nearest even), else reads it. */
int llmt_offload_state_io(const llmt_optimizer *o, int sec, int64_t e0, int64_t n, float *buf,
                          int to_state);

/* Sharded optimizer (sharded.c). Starts a step's reduction: zeroes the
 * owner's gradient sum. */
int llmt_optimizer_reduce_begin(llmt_optimizer *o);

/* One round of the reduction: every rank i with present[i] sends the
 * model's gradients of each owner's range (the offloaded ones from host
 * memory, through the gradient bucket where the engine moves device
 * memory), and each owner adds what it
 * receives to its gradient sum in rank order, in fp32 (collective). */
int llmt_optimizer_reduce_round(llmt_optimizer *o, const uint8_t *present);

/* Whether this step's reduction can overlap backward (*overlaps): the
 * communicator's engine queues exchanges (NCCL), and every gradient is in
 * the model's device buffer or the gradient bucket has two slots (one
 * sent from while backward writes the other); places and allocates the
 * gradients as llmt_optimizer_reduce_round would. The same on every rank
 * when their engines and placements are. With one_micro (this rank adds
 * no two micro-batches before an exchange, llmt_one_micro_per_exchange)
 * and two slots, the offloaded gradients' host copy is kept on demand
 * (llmt_grads_home_on_demand: set before the gradients are allocated, at
 * the first step, and before each step's rounds zero them): every
 * offloaded bucket is sent from its slot. */
int llmt_optimizer_reduce_overlaps(llmt_optimizer *o, int one_micro, int *overlaps);

/* llmt_optimizer_reduce_round's work for the gradients of one bucket
 * (llmt_grad_bucket_range), queued on the engine: the model's bucket_final
 * calls it as backward finishes each bucket, so the exchange of one runs
 * while the next is computed. An offloaded bucket is sent from its slot of
 * the gradient bucket and dropped there (llmt_grads_sent), not stored to
 * host memory. Every rank queues every bucket of a round, in the same
 * order (those with no micro-batch too, as not present). */
int llmt_optimizer_reduce_bucket(llmt_optimizer *o, int32_t bucket, const uint8_t *present);

/* The device's later ops (the next round's zeroing of the gradients, the
 * statistics of the sum, loads into the slots sent from) wait for the
 * queued buckets; the host does not. */
int llmt_optimizer_reduce_join(llmt_optimizer *o);

/* The sharded part of a step: in the 16-bit modes the fp32 grad_sum
 * rounded once to the model's dtype (in place), then the global norm from
 * every rank's partials (*sumsq, *nonfinite agreed by all ranks), computed
 * on grad_sum. Once per reduction: it reads the fp32 sum. */
int llmt_optimizer_sharded_stats(llmt_optimizer *o, float inv_scale, double *sumsq,
                                 int64_t *nonfinite);

/* n fp32 values at buf (device) rounded once (to nearest even) to dtype dt
 * in place: element i's rounding lands on bytes [i e, (i + 1) e) of buf (e
 * = dt's size <= 4). In increasing chunks through bounce (device,
 * bounce_bytes >= e): chunk [a, a + c) is read whole before its rounding
 * lands on bytes [a e, (a + c) e), which hold fp32 elements below a + c,
 * all read by then. LLMT_EINVAL when bounce holds no element. */
int llmt_round_in_place(llmt_device *dev, void *buf, int64_t n, int dt, void *bounce,
                        size_t bounce_bytes);

/* After the owned range was updated: every rank receives the others'. */
int llmt_optimizer_gather_weights(llmt_optimizer *o);

/* Sharded get_state: elements [s, s + n) of state section sec (0 first
 * moment, 1 second, 2 master; this rank's part read from the segment that
 * holds it, host or device) gathered whole into host fp32 out on every
 * rank. */
int llmt_optimizer_gather_tensor(llmt_optimizer *o, int sec, int64_t s, int64_t n, float *out);

/* Releases the sharded part. */
void llmt_optimizer_free_sharded(llmt_optimizer *o);

/* The learning rate of optimizer step `step` (0-based) under config c. */
double llmt_schedule_lr(const llmt_optimizer_config *c, int64_t step);

/* The settings llmt_optimizer_set and _get take (llmt_opt_param 0 to
 * LLMT_OPTIMIZER_SETTINGS - 1): setting param's name and its value in c. */
#define LLMT_OPTIMIZER_SETTINGS (LLMT_OPT_MIN_LR + 1)
const char *llmt_optimizer_setting_name(int param);
double llmt_optimizer_setting(const llmt_optimizer_config *c, int param);

/* Validates a configuration (version 1 or 2), naming the field at fault. */
int llmt_optimizer_config_check(const llmt_optimizer_config *c, const char *fn);

/* Copies a checked configuration of either version into *dst as the current
 * version (a version 1 struct is read only as far as its fields go). */
void llmt_optimizer_config_copy(llmt_optimizer_config *dst, const llmt_optimizer_config *src);

/* Validates a loss scaler configuration, naming the field at fault. */
int llmt_loss_scaler_config_check(const llmt_loss_scaler_config *c, const char *fn);

#endif
