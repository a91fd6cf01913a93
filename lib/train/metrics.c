/* The trainer's JSONL metrics file: one object per step and per event. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "train/trainer_internal.h"
#include "util/json.h"

int llmt_metrics_open(llmt_trainer *tr, const char *path)
{
    if (!path || !path[0])
        return LLMT_OK;
    tr->metrics = fopen(path, "a");
    if (!tr->metrics)
        return llmt_fail(LLMT_EIO, "%s: cannot open the metrics file: %s", path, strerror(errno));
    return LLMT_OK;
}

void llmt_metrics_close(llmt_trainer *tr)
{
    if (tr->metrics)
        fclose(tr->metrics);
    tr->metrics = NULL;
}

/* Writes the finished object as one line and flushes it. */
static void emit(llmt_trainer *tr, llmt_jw *w)
{
    const char *text = NULL;
    size_t len = 0;
    if (llmt_jw_finish(w, &text, &len) == LLMT_OK) {
        fwrite(text, 1, len, tr->metrics);
        fputc('\n', tr->metrics);
        fflush(tr->metrics);
    }
    llmt_jw_free(w);
}

void llmt_metrics_step(llmt_trainer *tr, const llmt_step_report *r)
{
    if (!tr->metrics)
        return;
    llmt_jw w;
    llmt_jw_init(&w);
    llmt_jw_begin_object(&w);
    llmt_jw_keyz(&w, "step"), llmt_jw_int64(&w, r->step);
    llmt_jw_keyz(&w, "loss"), llmt_jw_double(&w, r->loss);
    llmt_jw_keyz(&w, "grad_norm"),
        isfinite(r->grad_norm) ? llmt_jw_double(&w, r->grad_norm) : llmt_jw_null(&w);
    llmt_jw_keyz(&w, "lr"), llmt_jw_double(&w, r->lr);
    llmt_jw_keyz(&w, "loss_scale"), llmt_jw_double(&w, r->loss_scale);
    llmt_jw_keyz(&w, "skipped"), llmt_jw_bool(&w, r->skipped);
    llmt_jw_keyz(&w, "seconds"), llmt_jw_double(&w, r->seconds);
    llmt_jw_keyz(&w, "tokens_per_s"), llmt_jw_double(&w, r->tokens_per_second);
    llmt_jw_keyz(&w, "tokens_seen"), llmt_jw_int64(&w, r->tokens_seen);
    llmt_jw_keyz(&w, "micro_batch"), llmt_jw_int64(&w, r->micro_batch);
    llmt_jw_keyz(&w, "recompute"), llmt_jw_string(&w, llmt_recompute_policy_name(r->recompute),
                                         strlen(llmt_recompute_policy_name(r->recompute)));
    llmt_jw_keyz(&w, "recompute_layers"), llmt_jw_int64(&w, r->recompute_layers);
    llmt_jw_keyz(&w, "retries"), llmt_jw_int64(&w, r->retries);
    llmt_jw_keyz(&w, "memory");
    llmt_jw_begin_object(&w);
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++)
        llmt_jw_keyz(&w, llmt_mem_category_name(c)), llmt_jw_uint64(&w, r->mem_current[c]);
    llmt_jw_keyz(&w, "peak"), llmt_jw_uint64(&w, r->mem_peak);
    llmt_jw_keyz(&w, "capacity"), llmt_jw_uint64(&w, r->capacity);
    llmt_jw_keyz(&w, "ratio"), llmt_jw_double(&w, r->mem_ratio);
    llmt_jw_end_object(&w);
    llmt_jw_keyz(&w, "eval_loss"),
        isnan(r->eval_loss) ? llmt_jw_null(&w) : llmt_jw_double(&w, r->eval_loss);
    llmt_jw_keyz(&w, "checkpointed"), llmt_jw_int64(&w, r->checkpointed);
    llmt_jw_end_object(&w);
    emit(tr, &w);
}

void llmt_metrics_event(llmt_trainer *tr, const char *event, const char *text)
{
    if (!tr->metrics)
        return;
    llmt_jw w;
    llmt_jw_init(&w);
    llmt_jw_begin_object(&w);
    llmt_jw_keyz(&w, "event"), llmt_jw_string(&w, event, strlen(event));
    llmt_jw_keyz(&w, "step"), llmt_jw_int64(&w, tr->step);
    llmt_jw_keyz(&w, "text"), llmt_jw_string(&w, text, strlen(text));
    llmt_jw_end_object(&w);
    emit(tr, &w);
}
