/* llmt_trainer: one training step and the loop around it. A step takes one
 * global batch from the loader, runs it in micro-batches (slicer) with the
 * loss scale, updates with the optimizer, evaluates and checkpoints when due,
 * records metrics, and lets the adaptive memory controller act:
 *
 * - Monitor: after every step, the peak bytes of the step against the
 *   capacity (the configured one, else the context's budget, else the
 *   device's memory).
 * - Controller: above the threshold it escalates (recompute FFN activation,
 *   then attention core, then FFN, then full, layer by layer; then halves the
 *   micro-batch), choosing with the planner the smallest escalation predicted
 *   to come back under the threshold; after a window of steps with headroom
 *   it relaxes one notch when the planner predicts the result stays under
 *   the threshold minus the hysteresis. On LLMT_ENOMEM inside a step it
 *   discards the step's partial gradients, frees the activation arena,
 *   escalates to a configuration that fits and retries the same batch: no
 *   step is lost or repeated and the data position is unaffected. When even
 *   micro-batch 1 with full recompute cannot fit, the step fails with the
 *   planner's figure. Every decision is logged with its reason and numbers.
 *
 * Data-parallel (the optimizer sharded over an llmt_comm): step, run, save
 * and resume_latest are collective (every rank makes the same calls in the
 * same order; evaluate runs on each rank alone, over the whole held-out
 * set), and the step callback runs on every rank after every step. The
 * collectives run on the calling thread only.
 * See docs/distributed.md.
 *
 * See docs/trainer.md. */
#ifndef LLMT_TRAINER_H
#define LLMT_TRAINER_H

#include "llmt/checkpoint.h"
#include "llmt/common.h"
#include "llmt/config.h"
#include "llmt/data.h"
#include "llmt/loss_scaler.h"
#include "llmt/model.h"
#include "llmt/optimizer.h"
#include "llmt/recompute.h"
#include "llmt/slicer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_trainer llmt_trainer;

#define LLMT_TRAINER_PARTS_VERSION 1

/* The objects a trainer drives. The trainer borrows them: they must outlive
 * it, and not be used elsewhere while it runs. */
typedef struct llmt_trainer_parts {
    uint32_t version;          /* LLMT_TRAINER_PARTS_VERSION */
    llmt_model *model;         /* required */
    llmt_optimizer *optimizer; /* required */
    llmt_loss_scaler *scaler;  /* NULL: no loss scaling (overflows still skip) */
    llmt_recompute *recompute; /* required when adaptive */
    llmt_slicer *slicer;       /* NULL: whole batches (no slicing, not adaptive) */
    llmt_loader *loader;       /* training data, required */
    llmt_loader *eval_loader;  /* held-out data, or NULL */
    llmt_ckpt_store *store;    /* checkpoints, or NULL */
} llmt_trainer_parts;

#define LLMT_TRAINER_PARTS_INIT {LLMT_TRAINER_PARTS_VERSION, 0, 0, 0, 0, 0, 0, 0, 0}

#define LLMT_TRAINER_CONFIG_VERSION 1

typedef struct llmt_trainer_config {
    uint32_t version;          /* LLMT_TRAINER_CONFIG_VERSION */
    int32_t batch_size;        /* sequences per step: the loader's batch */
    int32_t seq_len;           /* the loader's seq_len */
    int64_t total_steps;       /* the run's length (for the ETA; run() stops there) */
    int64_t eval_every;        /* steps between evaluations, 0 never */
    int32_t eval_batches;      /* held-out batches per evaluation */
    int64_t checkpoint_every;  /* steps between durable checkpoints, 0 never */
    int64_t fast_checkpoint_every; /* steps between fast-tier checkpoints, 0 never */
    int32_t checkpoint_async;  /* 1: save_async (falls back to sync when staging does not fit) */
    const char *metrics_path;  /* JSONL file appended to, or NULL */
    const char *config_yaml;   /* the effective configuration, stored in checkpoints; or NULL */
    int32_t adaptive;          /* 1: the memory controller acts */
    double memory_threshold;   /* fraction of capacity: 0.85 */
    double hysteresis;         /* relax only below threshold - hysteresis: 0.10 */
    int32_t relax_window;      /* steps with headroom before relaxing: 20 */
    uint64_t capacity;         /* bytes; 0: the context's budget, else device memory */
} llmt_trainer_config;

#define LLMT_TRAINER_CONFIG_INIT \
    {LLMT_TRAINER_CONFIG_VERSION, 8, 256, 1000, 0, 4, 0, 0, 1, 0, 0, 1, 0.85, 0.10, 20, 0}

/* Fills cfg with the defaults of LLMT_TRAINER_CONFIG_INIT. */
LLMT_API void llmt_trainer_config_init(llmt_trainer_config *cfg);

/* Creates a trainer over borrowed parts. cfg NULL means
 * LLMT_TRAINER_CONFIG_INIT with batch_size and seq_len those of parts->loader,
 * and adaptive only when parts has both recompute and slicer. cfg's
 * batch_size and seq_len must be those the loader (and eval loader) serve.
 * Errors: LLMT_EINVAL naming the part or field (a batch_size or seq_len
 * mismatch names both values), LLMT_EVERSION. */
LLMT_API int llmt_trainer_create(llmt_trainer **out, const llmt_trainer_parts *parts,
                                 const llmt_trainer_config *cfg);

/* Creates every part from a training configuration (model, optimizer,
 * scaler, recompute, slicer, loaders over cfg's data globs, checkpoint store
 * in cfg's directories) on ctx and a trainer that owns them. The context is
 * the caller's: train.seed, train.threads, train.backend and train.device
 * are not applied here (make ctx with them, as llmt-train does); its budget
 * and host budget are set to memory.budget and memory.host_budget where
 * they are not 0. Errors as
 * the parts' constructors, naming the configuration key. */
LLMT_API int llmt_trainer_create_from_config(llmt_trainer **out, llmt_context *ctx,
                                             const llmt_train_config *cfg);

/* llmt_trainer_create_from_config for one rank of a data-parallel run over
 * comm (NULL: a single process, as llmt_trainer_create_from_config). The
 * optimizer is sharded (llmt_optimizer_create_sharded with cfg's
 * dist.reduce), every rank reads the whole global batch from the same data
 * and runs its share of the micro-batches, and only rank 0 opens the
 * checkpoint directories and writes metrics. Checkpoints are sharded: each
 * rank writes its optimizer range, rank 0 the rest and the commit, and they
 * resume at any world size (docs/distributed.md). Collective. Errors as
 * llmt_trainer_create_from_config, and LLMT_ECOMM when the ranks'
 * configurations differ or a rank fails (naming it). */
LLMT_API int llmt_trainer_create_from_config_dist(llmt_trainer **out, llmt_context *ctx,
                                                  const llmt_train_config *cfg, llmt_comm *comm);

/* Waits for an async save in flight, releases the trainer and what it owns;
 * NULL accepted. Runs no collective: in a data-parallel run it waits for
 * this rank's writer and abandons a save still in flight (nothing
 * committed, rank 0 removes its temporary directory, logged "async save of
 * step N abandoned: call llmt_trainer_save (collective) before free"); the
 * step reaching total_steps and the end of llmt_trainer_run commit it. */
LLMT_API void llmt_trainer_free(llmt_trainer *tr);

#define LLMT_STEP_REPORT_VERSION 1

typedef struct llmt_step_report {
    uint32_t version;         /* set by the caller: LLMT_STEP_REPORT_VERSION */
    int64_t step;             /* steps done, this one included */
    double loss;              /* mean training loss of the batch */
    double grad_norm;         /* before clipping (inf when skipped) */
    double lr;
    double loss_scale;
    int32_t skipped;          /* 1: overflow skipped the update */
    double seconds;           /* wall time of the step, evaluation and saves included */
    double tokens_per_second; /* batch tokens / time of forward, backward and update */
    int32_t micro_batch;      /* in use during the step */
    int32_t recompute;        /* policy flags of layer 0 during the step */
    int32_t recompute_layers; /* layers with any recompute during the step */
    int32_t retries;          /* attempts repeated after LLMT_ENOMEM */
    uint64_t mem_current[LLMT_MEM_CATEGORY_SLOTS]; /* after the step */
    uint64_t mem_peak;        /* most bytes at once during the step */
    double mem_ratio;         /* mem_peak / capacity */
    uint64_t capacity;
    double eval_loss;         /* held-out loss when evaluated this step, else NaN */
    int32_t checkpointed;     /* bit LLMT_CKPT_DURABLE / bit LLMT_CKPT_FAST saved */
    int64_t tokens_seen;
} llmt_step_report;

/* One step; report (may be NULL, else its version set) is filled. Errors
 * from the parts; LLMT_ENOMEM with the planner's figure when nothing fits;
 * in a data-parallel run, an async save that failed on any rank (its file
 * named) from the step that joins it. The step that reaches total_steps
 * commits a data-parallel async save still in flight. A step that fails
 * before it is counted (its forward, backward or update) leaves the
 * loader where it was, so calling again retries the same batch. A failure
 * after it is counted (an evaluation; a save; the adaptive controller's
 * move for the next step failing other than by a budget's refusal that
 * every rank undid, in a data-parallel run on any rank) leaves the step
 * applied and counted (llmt_trainer_step_index), so calling again trains
 * the next batch. A move between steps that a budget refuses is not a
 * failure: it is logged and the configuration stays as it is (a refused
 * escalation is tried again after relax_window steps). */
LLMT_API int llmt_trainer_step(llmt_trainer *tr, llmt_step_report *report);

/* Called after every step of llmt_trainer_run; a nonzero return stops the run
 * (llmt_trainer_run then returns LLMT_OK). */
typedef int (*llmt_step_callback)(void *user, const llmt_step_report *report);

/* Called with each line the trainer logs (controller decisions, checkpoint
 * fallbacks); NUL-terminated, no newline. */
typedef void (*llmt_log_callback)(void *user, const char *line);

/* Sets the step callback (NULL for none). */
LLMT_API int llmt_trainer_set_callback(llmt_trainer *tr, llmt_step_callback cb, void *user);

/* Sets the log callback (NULL for none). Log lines also go to the metrics
 * file as {"event": ...} records. */
LLMT_API int llmt_trainer_set_log(llmt_trainer *tr, llmt_log_callback cb, void *user);

/* Runs steps until `steps` more are done or total_steps is reached or the
 * callback asks to stop. In a data-parallel run it returns with the async
 * save in flight committed. */
LLMT_API int llmt_trainer_run(llmt_trainer *tr, int64_t steps);

/* Loads the newest valid checkpoint of the store into the parts and the
 * trainer's own state (step, tokens, controller). The optimizer's settings
 * become the checkpoint's, as llmt_ckpt_load makes them; each one that
 * differs from the configured value is logged (llmt_optimizer_set_settings
 * after the resume changes them). *step receives the step
 * resumed from, or -1 when the store holds no checkpoint (a fresh start,
 * LLMT_OK). When it holds checkpoints none of which verifies: LLMT_ECORRUPT,
 * the message naming each one and why it was refused, and nothing is
 * loaded (to start over anyway, llmt_ckpt_set_aside_invalid moves them
 * aside first). A checkpoint that could not be checked (LLMT_EIO,
 * LLMT_ENOMEM) stops the search with that status: it may be good. */
LLMT_API int llmt_trainer_resume_latest(llmt_trainer *tr, int64_t *step);

/* Saves a checkpoint of the current state now, synchronously, in tier.
 * First waits for an async save in flight and returns its error, if it
 * failed and no earlier call reported it. When the store committed the
 * current step in that tier (a save that finished, or the checkpoint
 * resumed from), nothing is written and LLMT_OK returned; a save that was
 * started but failed does not count. */
LLMT_API int llmt_trainer_save(llmt_trainer *tr, int32_t tier);

/* The held-out loss over eval_batches batches of the eval loader (from its
 * start each time). LLMT_ESTATE without an eval loader. */
LLMT_API int llmt_trainer_evaluate(llmt_trainer *tr, double *loss);

/* Steps done. -1 for NULL. */
LLMT_API int64_t llmt_trainer_step_index(const llmt_trainer *tr);

/* The trainer's model (borrowed), e.g. to sample text. */
LLMT_API llmt_model *llmt_trainer_model(const llmt_trainer *tr);

/* The trainer's context (that of its model; borrowed). */
LLMT_API llmt_context *llmt_trainer_context(const llmt_trainer *tr);

/* The trainer's optimizer (borrowed), e.g. to set the configured settings
 * with llmt_optimizer_set_settings after a resume made them the
 * checkpoint's. NULL for NULL. */
LLMT_API llmt_optimizer *llmt_trainer_optimizer(const llmt_trainer *tr);

#ifdef __cplusplus
}
#endif

#endif
