/* llmt_optimizer: AdamW with decoupled weight decay and bias correction,
 * gradient clipping by global norm, a learning-rate schedule, and the fp32
 * master weights and moments of the model's precision mode
 * (docs/precision.md):
 *
 *   mode         weights  grads  master  moments   bytes/param
 *   FP32         f32      f32    -       f32 x2    16
 *   BF16_MIXED   bf16     bf16   f32     f32 x2    16
 *   FP16_MIXED   f16      f16    f32     f32 x2    16
 *   BF16_PURE    bf16     bf16   -       bf16 x2    8
 *
 * One optimizer step consumes the gradients accumulated by
 * llmt_model_forward_backward: it unscales them by the loss scaler's scale
 * and checks for inf/NaN in one pass (an overflow skips the step and leaves
 * weights, moments and the step count untouched), clips by global norm,
 * updates, casts the master weights back to the model's dtype, and updates
 * the scaler. */
#ifndef LLMT_OPTIMIZER_H
#define LLMT_OPTIMIZER_H

#include "llmt/comm.h"
#include "llmt/common.h"
#include "llmt/loss_scaler.h"
#include "llmt/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_optimizer llmt_optimizer;

/* Learning-rate schedules; each starts with warmup_steps of linear warmup. */
typedef enum llmt_schedule {
    LLMT_SCHEDULE_CONSTANT = 0, /* lr after warmup */
    LLMT_SCHEDULE_COSINE = 1,   /* cosine from lr to min_lr at total_steps */
    LLMT_SCHEDULE_LINEAR = 2    /* linear from lr to min_lr at total_steps */
} llmt_schedule;

/* Parts of the training state that may live in host memory (bits). */
typedef enum llmt_offload_part {
    LLMT_OFFLOAD_NONE = 0,     /* everything on the device */
    LLMT_OFFLOAD_OPTIMIZER = 1, /* moments and master weights; AdamW runs on the host */
    LLMT_OFFLOAD_GRADS = 2      /* gradients, bucket by bucket in backward; needs OPTIMIZER */
} llmt_offload_part;

/* offload_layers: the whole flat parameter buffer. */
#define LLMT_OFFLOAD_ALL_LAYERS (-1)

#define LLMT_OPTIMIZER_CONFIG_VERSION 2

typedef struct llmt_optimizer_config {
    uint32_t version;     /* LLMT_OPTIMIZER_CONFIG_VERSION (1 is still accepted) */
    double lr;            /* peak learning rate: 3e-4 */
    double beta1;         /* 0.9 */
    double beta2;         /* 0.95 */
    double eps;           /* 1e-8 */
    double weight_decay;  /* decoupled: 0.1 */
    int32_t decay_norms;  /* 1: decay RMSNorm weights too (default 0) */
    double grad_clip;     /* largest global gradient norm; 0 disables: 1.0 */
    int32_t schedule;     /* llmt_schedule: LLMT_SCHEDULE_CONSTANT */
    int64_t warmup_steps; /* 0 */
    int64_t total_steps;  /* where cosine/linear reach min_lr: 0 */
    double min_lr;        /* floor of the decay: 0 */
    /* Version 2: where the state is allocated at creation (see
     * llmt_optimizer_set_offload); not saved in checkpoints. */
    int32_t offload_parts;  /* llmt_offload_part bits: LLMT_OFFLOAD_NONE */
    int32_t offload_layers; /* LLMT_OFFLOAD_ALL_LAYERS or 0..num_layers: ALL */
} llmt_optimizer_config;

#define LLMT_OPTIMIZER_CONFIG_INIT                                                              \
    {LLMT_OPTIMIZER_CONFIG_VERSION, 3e-4, 0.9, 0.95, 1e-8, 0.1, 0, 1.0, LLMT_SCHEDULE_CONSTANT, 0, \
     0, 0.0, LLMT_OFFLOAD_NONE, LLMT_OFFLOAD_ALL_LAYERS}

/* Fills cfg with the defaults of LLMT_OPTIMIZER_CONFIG_INIT. */
LLMT_API void llmt_optimizer_config_init(llmt_optimizer_config *cfg);

/* Creates an AdamW optimizer for model, allocating its moments (and master
 * weights, copied from the model, in the mixed modes) in the OPTIMIZER
 * category, or where cfg->offload_parts/offload_layers place them in
 * HOST_STATE (nothing is allocated on the device first). The model must
 * outlive the optimizer. Errors: LLMT_EINVAL naming the field, LLMT_EVERSION,
 * LLMT_ENOMEM. */
LLMT_API int llmt_optimizer_create(llmt_optimizer **out, llmt_model *model,
                                   const llmt_optimizer_config *cfg);

/* How a sharded optimizer sums the ranks' gradients. */
typedef enum llmt_reduce_mode {
    /* Each micro-batch's gradient travels to its owner, which adds the
     * contributions in global micro-batch order: any world size gives
     * bitwise the result of one process with the same global batch and
     * micro-batch (and a slicer in LLMT_ACCUMULATE_ORDERED). Sends one
     * gradient per micro-batch round. */
    LLMT_REDUCE_DETERMINISTIC = 0,
    /* Each rank sums its own micro-batches in place, then one exchange:
     * the fewest bytes; equal across world sizes within rounding only. */
    LLMT_REDUCE_FAST = 1
} llmt_reduce_mode;

/* Creates a ZeRO-1 AdamW for data-parallel training over comm: this rank
 * owns the range llmt_optimizer_shard reports (ranges of 4096-element
 * granules, as even as they go) and allocates moments and master weights
 * for it only, plus the owner's gradient sum (GRADIENTS) and an exchange
 * buffer (WORKSPACE). A trainer with this optimizer runs each step's
 * micro-batches across the ranks, reduces the gradients to their owners
 * with reduce_mode (llmt_reduce_mode), updates the owned range and
 * all-gathers the weights. Collective: every rank calls it; the ranks'
 * model configurations, precision and weights must agree (LLMT_ECOMM naming
 * what differs). comm must outlive the optimizer. Errors as
 * llmt_optimizer_create, and LLMT_EUNSUPPORTED when comm does not move
 * the memory the model is in (a CUDA model needs an NCCL communicator,
 * llmt_comm_create_nccl; a CPU model a host one) or cfg asks for gradient
 * offload (LLMT_OFFLOAD_GRADS). cfg's LLMT_OFFLOAD_OPTIMIZER offloads the
 * part of this rank's range inside the prefix (llmt_optimizer_set_offload). */
LLMT_API int llmt_optimizer_create_sharded(llmt_optimizer **out, llmt_model *model,
                                           const llmt_optimizer_config *cfg, llmt_comm *comm,
                                           int32_t reduce_mode);

/* The range [*first, *end) of the flat parameter buffer whose optimizer
 * state this rank holds: all of it when the optimizer is not sharded. */
LLMT_API int llmt_optimizer_shard(const llmt_optimizer *opt, int64_t *first, int64_t *end);

/* Releases an optimizer; NULL is accepted. */
LLMT_API void llmt_optimizer_free(llmt_optimizer *opt);

/* Moves the state (moments, master weights) of the flat prefix chosen by
 * layers to host memory (LLMT_MEM_HOST_STATE) and the rest to the device
 * (LLMT_MEM_OPTIMIZER); the host part is updated by the CPU backend's AdamW
 * with the same arithmetic, so results are bitwise those without offload.
 * parts: LLMT_OFFLOAD_NONE, LLMT_OFFLOAD_OPTIMIZER, or that with
 * LLMT_OFFLOAD_GRADS: the same prefix's gradients then live in host memory
 * too (HOST_STATE), backward moving them there one bucket (a layer, the
 * embedding, the final norm and LM head) at a time through one device
 * bucket (GRADS); the gradients are the model's and stay so placed after
 * the optimizer is freed, until another optimizer of the model places them
 * (each step puts them where its optimizer's placement says). The model
 * allocates its gradients at their first use, so an optimizer created with
 * gradient offload before the first step never holds them all on the
 * device. layers: LLMT_OFFLOAD_ALL_LAYERS for the whole buffer, or k in
 * 0..num_layers for every parameter stored before layer k's first one (the
 * embedding and layers 0..k-1; 0: nothing); ignored with NONE. Callable
 * between steps; the new buffers are allocated and filled before the old
 * ones are freed, so on any failure (LLMT_ENOMEM naming the budget or host
 * budget) the placement, state and gradients are as they were. Errors:
 * LLMT_EINVAL naming the argument, LLMT_ENOMEM, LLMT_EUNSUPPORTED for
 * gradients on a backend without per-granule gradient statistics. A
 * sharded optimizer offloads the state of the part of its range inside the
 * prefix (none when its range lies past it), and with LLMT_OFFLOAD_GRADS
 * the gradients of the whole prefix (every rank holds the whole model's),
 * which are sent to their owners from host memory after backward. Each
 * rank places its own state (not collective), and the results are bitwise
 * the same whatever each chose; the gradients' placement must be the same
 * on every rank at each step (a step with placements that differ fails on
 * every rank with LLMT_ECOMM naming it). */
LLMT_API int llmt_optimizer_set_offload(llmt_optimizer *opt, int32_t parts, int32_t layers);

/* The placement set by the config or llmt_optimizer_set_offload: *layers is
 * 0 when *parts is LLMT_OFFLOAD_NONE. */
LLMT_API int llmt_optimizer_get_offload(const llmt_optimizer *opt, int32_t *parts,
                                        int32_t *layers);

/* Run-time settings, each validated and bounded. */
typedef enum llmt_opt_param {
    LLMT_OPT_LR = 0,           /* (0, 10] */
    LLMT_OPT_BETA1 = 1,        /* [0, 1) */
    LLMT_OPT_BETA2 = 2,        /* [0, 1) */
    LLMT_OPT_EPS = 3,          /* (0, 1] */
    LLMT_OPT_WEIGHT_DECAY = 4, /* [0, 1] */
    LLMT_OPT_DECAY_NORMS = 5,  /* 0 or 1 */
    LLMT_OPT_GRAD_CLIP = 6,    /* >= 0, 0 disables */
    LLMT_OPT_SCHEDULE = 7,     /* an llmt_schedule */
    LLMT_OPT_WARMUP_STEPS = 8, /* >= 0, a whole number */
    LLMT_OPT_TOTAL_STEPS = 9,  /* >= 0, a whole number */
    LLMT_OPT_MIN_LR = 10       /* [0, lr] */
} llmt_opt_param;

/* Sets a setting; out-of-range values are refused with LLMT_EINVAL. */
LLMT_API int llmt_optimizer_set(llmt_optimizer *opt, int param, double value);

/* Sets every setting llmt_optimizer_set takes (each llmt_opt_param) to
 * cfg's at once, all or none: each is checked as llmt_optimizer_set checks
 * it and min_lr against the new lr, so settings that are only valid
 * together (a lower lr with a lower min_lr) can be set. cfg's offload
 * placement is not read; the state, the step count and the placement stay.
 * E.g. after a resume made the settings the checkpoint's, to take the
 * configured ones; in a data-parallel run call it on every rank with the
 * same cfg. cfg->version: LLMT_OPTIMIZER_CONFIG_VERSION or 1. Errors:
 * LLMT_EINVAL naming the setting, LLMT_EVERSION. */
LLMT_API int llmt_optimizer_set_settings(llmt_optimizer *opt, const llmt_optimizer_config *cfg);

/* Reads a setting. */
LLMT_API int llmt_optimizer_get(const llmt_optimizer *opt, int param, double *value);

/* Copies the current configuration (with every change made by _set, and
 * the current offload placement) into *out, whose version the caller sets:
 * LLMT_OPTIMIZER_CONFIG_VERSION, or 1 for a version 1 struct (only its
 * fields are written). Errors: LLMT_EINVAL, LLMT_EVERSION for another
 * version. */
LLMT_API int llmt_optimizer_get_config(const llmt_optimizer *opt, llmt_optimizer_config *out);

/* The learning rate the next step will use. */
LLMT_API double llmt_optimizer_lr(const llmt_optimizer *opt);

#define LLMT_UPDATE_REPORT_VERSION 1

typedef struct llmt_update_report {
    uint32_t version;  /* set by the caller: LLMT_UPDATE_REPORT_VERSION */
    int64_t step;      /* optimizer steps taken, after this one */
    int32_t skipped;   /* 1 when an overflow skipped the update */
    double grad_norm;  /* global norm of the unscaled gradients, before clipping */
    double lr;         /* learning rate used (or that would have been) */
    double loss_scale; /* the scale the gradients carried */
} llmt_update_report;

#define LLMT_UPDATE_REPORT_INIT {LLMT_UPDATE_REPORT_VERSION, 0, 0, 0.0, 0.0, 0.0}

/* One update from the accumulated gradients. scaler may be NULL (gradients
 * unscaled; an overflow still skips the step). The gradients are left as
 * they are: zero them before the next accumulation. report may be NULL. */
LLMT_API int llmt_optimizer_step(llmt_optimizer *opt, llmt_loss_scaler *scaler,
                                 llmt_update_report *report);

/* Optimizer steps taken (skipped steps not counted); -1 for NULL. */
LLMT_API int64_t llmt_optimizer_step_count(const llmt_optimizer *opt);

/* Restores the step count (bias correction and schedule position). */
LLMT_API int llmt_optimizer_set_step_count(llmt_optimizer *opt, int64_t steps);

/* Per-parameter state tensors. */
typedef enum llmt_opt_state {
    LLMT_OPT_STATE_EXP_AVG = 0,    /* first moment */
    LLMT_OPT_STATE_EXP_AVG_SQ = 1, /* second moment */
    LLMT_OPT_STATE_MASTER = 2      /* fp32 master weights (mixed modes only) */
} llmt_opt_state;

/* Storage dtype of a state tensor kind, or -1 when this mode has none. */
LLMT_API int32_t llmt_optimizer_state_dtype(const llmt_optimizer *opt, int kind);

/* Copies the state of kind for the parameter named name out as fp32, into a
 * buffer of exactly its numel. Exact: every stored dtype widens to fp32.
 * Collective for a sharded optimizer (every rank calls it with the same
 * kind and name and receives the whole tensor). */
LLMT_API int llmt_optimizer_get_state(const llmt_optimizer *opt, int kind, const char *name,
                                      float *out, size_t count);

/* Copies state in from fp32 (rounded to nearest even for bf16 moments, so a
 * value read by _get_state is restored exactly). A sharded optimizer takes
 * the part of the whole tensor that it owns (not collective). */
LLMT_API int llmt_optimizer_set_state(llmt_optimizer *opt, int kind, const char *name,
                                      const float *in, size_t count);

#ifdef __cplusplus
}
#endif

#endif
