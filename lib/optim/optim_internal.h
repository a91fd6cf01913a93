/* Internals of the optimizer shared with the checkpoint store. */
#ifndef LLMT_OPTIM_INTERNAL_H
#define LLMT_OPTIM_INTERNAL_H

#include "llmt/optimizer.h"
#include "core/buffer.h"

struct llmt_optimizer {
    llmt_model *model;
    llmt_optimizer_config cfg;
    int64_t steps;  /* updates applied */
    int state_dt;   /* dtype of the moments */
    llmt_buf m, v;  /* moments, in the flat parameter order */
    llmt_buf master; /* fp32 master weights (mixed modes), else empty */
    llmt_buf scratch; /* ops->optim_scratch_bytes */
    uint64_t weights_epoch; /* the model's weights_epoch the master copies */
};

/* Bytes of each moment buffer and of the master weights (0 when the mode has
 * none) for num_params parameters under a precision mode. */
void llmt_optimizer_sizes(int precision, int64_t num_params, size_t *moment_bytes,
                          size_t *master_bytes);

/* The learning rate of optimizer step `step` (0-based) under config c. */
double llmt_schedule_lr(const llmt_optimizer_config *c, int64_t step);

/* Validates a configuration, naming the field at fault. */
int llmt_optimizer_config_check(const llmt_optimizer_config *c, const char *fn);

/* Validates a loss scaler configuration, naming the field at fault. */
int llmt_loss_scaler_config_check(const llmt_loss_scaler_config *c, const char *fn);

#endif
