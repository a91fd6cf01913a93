/* Internals of the optimizer shared with the checkpoint store. */
#ifndef LLMT_OPTIM_INTERNAL_H
#define LLMT_OPTIM_INTERNAL_H

#include "llmt/optimizer.h"
#include "core/buffer.h"
#include "dist/comm_internal.h"

struct llmt_optimizer {
    llmt_model *model;
    llmt_optimizer_config cfg;
    int64_t steps;  /* updates applied */
    int state_dt;   /* dtype of the moments */
    /* The range of the flat parameter buffer this optimizer updates (all of
     * it unless sharded); m, v and master hold element first + i at i. */
    int64_t first, end;
    llmt_buf m, v;  /* moments */
    llmt_buf master; /* fp32 master weights (mixed modes), else empty */
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
    llmt_buf grad_sum;     /* the owner's gradient sum over [first, end) */
    llmt_buf recv;         /* exchange receive buffer */
    int grads_reduced;     /* grad_sum holds this step's gradient */
};

/* Bytes of each moment buffer and of the master weights (0 when the mode has
 * none) for num_params parameters under a precision mode. */
void llmt_optimizer_sizes(int precision, int64_t num_params, size_t *moment_bytes,
                          size_t *master_bytes);

/* Sets up o (model, cfg and precision set) to update [first, end):
 * allocates the moments, master weights (copied from the model), scratch
 * and the norm partials. */
int llmt_optimizer_alloc_state(llmt_optimizer *o, int64_t first, int64_t end);

/* Sharded optimizer (sharded.c). Starts a step's reduction: zeroes the
 * owner's gradient sum. */
int llmt_optimizer_reduce_begin(llmt_optimizer *o);

/* One round of the reduction: every rank i with present[i] sends the
 * model's gradients of each owner's range, and each owner adds what it
 * receives to its gradient sum in rank order (collective). */
int llmt_optimizer_reduce_round(llmt_optimizer *o, const uint8_t *present);

/* The sharded part of a step: the global norm from every rank's partials
 * (*sumsq, *nonfinite agreed by all ranks), computed on grad_sum. */
int llmt_optimizer_sharded_stats(llmt_optimizer *o, float inv_scale, double *sumsq,
                                 int64_t *nonfinite);

/* After the owned range was updated: every rank receives the others'. */
int llmt_optimizer_gather_weights(llmt_optimizer *o);

/* Sharded get_state: the tensor [s, s + n) of a state buffer (dtype dt, base
 * first) gathered whole into host fp32 out on every rank. */
int llmt_optimizer_gather_tensor(llmt_optimizer *o, const void *base, int dt, int64_t s,
                                 int64_t n, float *out);

/* Releases the sharded part. */
void llmt_optimizer_free_sharded(llmt_optimizer *o);

/* The learning rate of optimizer step `step` (0-based) under config c. */
double llmt_schedule_lr(const llmt_optimizer_config *c, int64_t step);

/* Validates a configuration, naming the field at fault. */
int llmt_optimizer_config_check(const llmt_optimizer_config *c, const char *fn);

/* Validates a loss scaler configuration, naming the field at fault. */
int llmt_loss_scaler_config_check(const llmt_loss_scaler_config *c, const char *fn);

#endif
