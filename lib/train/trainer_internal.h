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
    int32_t *tokens, *targets; /* the current batch (host) */
    llmt_loader_state eval_start;

    llmt_controller ctl;
    int64_t since_change; /* steps since the controller last moved */

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
 * the threshold, relax after the window when the planner predicts headroom. */
int llmt_trainer_adapt(llmt_trainer *tr, uint64_t peak, uint64_t capacity);

/* After LLMT_ENOMEM (arena released): moves to the lightest notch whose
 * arena fits what the budget leaves; LLMT_ENOMEM with the planner's figure
 * when none does. `why` is the allocation's message. */
int llmt_trainer_escalate_to_fit(llmt_trainer *tr, const char *why);

/* The checkpoint state of the trainer's parts, with its own state as the
 * user blob written into blob (cap bytes). */
void llmt_trainer_fill_state(llmt_trainer *tr, llmt_train_state *st, char *blob, size_t cap);

/* Frees the parts a configured trainer owns. */
void llmt_trainer_free_owned(llmt_trainer *tr);

/* The metrics file: opened for appending (path NULL: none), one JSON object
 * per line for each step and each event. */
int llmt_metrics_open(llmt_trainer *tr, const char *path);
void llmt_metrics_close(llmt_trainer *tr);
void llmt_metrics_step(llmt_trainer *tr, const llmt_step_report *r);
void llmt_metrics_event(llmt_trainer *tr, const char *event, const char *text);

#endif
