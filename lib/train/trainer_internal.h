/* Internals of the trainer, shared by its files. */
#ifndef LLMT_TRAIN_TRAINER_INTERNAL_H
#define LLMT_TRAIN_TRAINER_INTERNAL_H

#include <stdio.h>

#include "llmt/trainer.h"
#include "train/controller.h"

struct llmt_trainer {
    llmt_trainer_parts parts;
    llmt_trainer_config cfg;
    llmt_context *ctx;
    int owned; /* created from a configuration: the trainer frees the parts */
    char *config_yaml;

    int64_t step, tokens_seen;
    /* Per tier, the step this trainer last saved or resumed from (-1: none;
     * forgotten when that save fails): with the store's own committed step,
     * what need not be saved again (another trainer's save of the same step
     * does not count). saving_tier: the tier of its async save in flight
     * (-1: none). */
    int64_t saved[2];
    int saving_tier;
    /* A data-parallel run's async save (dist_ckpt_async.c; NULL until the
     * first). */
    struct llmt_dist_async *dist_async;
    /* A data-parallel run's fast tier: whether it is local to each node
     * (dist_fast_tier.c; NULL until the first fast save or resume). */
    struct llmt_dist_fast *dist_fast;
    int32_t *tokens, *targets; /* the current batch (host) */
    llmt_loader_state eval_start;

    llmt_controller ctl;
    int64_t since_change; /* steps since the controller last moved */
    /* An escalation a budget refused: the next is tried once the window
     * (since_change, restarted by the refusal) reaches relax_window; the
     * same on every rank; cleared by any move. */
    int32_t escalation_refused;
    /* This rank logged that its peak is over the threshold with no heavier
     * notch predicted lower (said once until the controller moves). */
    int32_t over_without_remedy;

    FILE *metrics;
    llmt_step_callback callback;
    void *callback_user;
    llmt_log_callback log;
    void *log_user;
};

/* Logs a controller or checkpoint event (callback and metrics file). */
void llmt_trainer_log(llmt_trainer *tr, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* After a step that peaked at `peak` of `capacity` bytes: escalate when over
 * the threshold, relax after the window when the planner predicts headroom.
 * Data parallel: peak and capacity are this rank's own, and the decision
 * is agreed by every rank (collective). */
int llmt_trainer_adapt(llmt_trainer *tr, uint64_t peak, uint64_t capacity);

/* After LLMT_ENOMEM: frees the step's layout (the arena and the ordered
 * sum), then moves to the lightest notch whose bytes fit what the budget
 * leaves; LLMT_ENOMEM with the planner's figure
 * when none does. `why` is the allocation's message. Data parallel
 * (collective): the heaviest of the ranks' lightest fitting notches, and
 * LLMT_ENOMEM on every rank when one has none. */
int llmt_trainer_escalate_to_fit(llmt_trainer *tr, const char *why);

/* The checkpoint state of the trainer's parts, with its own state as the
 * user blob written into blob (cap bytes). */
void llmt_trainer_fill_state(llmt_trainer *tr, llmt_train_state *st, char *blob, size_t cap);

/* Restores the controller from a blob written by llmt_trainer_fill_state. */
int llmt_trainer_restore_blob(llmt_trainer *tr, const char *blob, size_t len);

/* Loads the newest valid checkpoint of the trainer's store into its parts,
 * with the optimizer state into opt; the trainer's blob lands in blob (cap
 * bytes, NUL-terminated, *blob_len without the NUL). *step as
 * llmt_trainer_resume_latest; *tier the tier it came from. */
int llmt_trainer_resume_into(llmt_trainer *tr, llmt_optimizer *opt, int64_t *step,
                             int32_t *tier, char *blob, size_t cap, size_t *blob_len);

/* Data-parallel (dist.c, dist_ckpt.c), when the optimizer is sharded.
 * Forward and backward of the loaded batch across the ranks, the gradients
 * reduced to their owners; *failed receives the lowest failed rank's status
 * (so every rank sees an LLMT_ENOMEM there). */
int llmt_trainer_dist_forward_backward(llmt_trainer *tr, double scale, double *loss, int *failed);
/* A hash of what the ranks must agree on to run the same steps: the
 * trainer's configuration, micro-batch, recompute flags, data positions. */
uint64_t llmt_trainer_dist_hash(const llmt_trainer *tr);
/* Replaces *peak by the largest of the ranks' peaks and *capacity by the
 * smallest capacity: the step report's figures, the same on every rank
 * (the controller decides from each rank's own and agrees, adapt.c). */
int llmt_trainer_dist_memory(llmt_trainer *tr, uint64_t *peak, uint64_t *capacity);
/* Sets *flag to 1 on every rank when any rank's is nonzero. */
int llmt_trainer_dist_any(llmt_trainer *tr, int *flag);
/* llmt_trainer_save's work across the ranks (a sharded checkpoint: every
 * rank writes its range, the ranks agree, rank 0 commits). The save in
 * flight is finished first. With async, each rank stages its part and
 * writes it on a thread of its own; the agreement and commit come at the
 * next join (llmt_trainer_dist_poll finding every writer done,
 * llmt_trainer_dist_join): a synchronous save when staging does not fit. */
int llmt_trainer_dist_save(llmt_trainer *tr, int32_t tier, int async);
/* At a step's save point: finishes the save in flight when every rank's
 * writer is done (collective while one is in flight). */
int llmt_trainer_dist_poll(llmt_trainer *tr);
/* Waits for the save in flight and finishes it: agreement, records,
 * commit (collective while one is in flight); its failure on any rank is
 * returned on every rank, and that step is not saved. */
int llmt_trainer_dist_join(llmt_trainer *tr);
/* Local, for llmt_trainer_free: joins this rank's writer, abandons the save
 * in flight (logged; rank 0 removes its temporary directory, nothing is
 * committed) and frees the staging. */
void llmt_trainer_dist_free(llmt_trainer *tr);
/* llmt_trainer_resume_latest across the ranks: rank 0 loads and hands each
 * rank the weights, its optimizer range and the run's position. */
int llmt_trainer_dist_resume(llmt_trainer *tr, int64_t *step);

/* Frees the parts a configured trainer owns. */
void llmt_trainer_free_owned(llmt_trainer *tr);

/* The metrics file: opened for appending (path NULL: none), one JSON object
 * per line for each step and each event. */
int llmt_metrics_open(llmt_trainer *tr, const char *path);
void llmt_metrics_close(llmt_trainer *tr);
void llmt_metrics_step(llmt_trainer *tr, const llmt_step_report *r);
void llmt_metrics_event(llmt_trainer *tr, const char *event, const char *text);

#endif
