/* Internals of the training configuration. */
#ifndef LLMT_TRAIN_CONFIG_INTERNAL_H
#define LLMT_TRAIN_CONFIG_INTERNAL_H

#include "llmt/config.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"

/* The largest configuration file read. */
#define LLMT_CONFIG_MAX_BYTES (1 << 20)

#endif
