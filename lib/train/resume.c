/* The trainer's own state in checkpoints (the user blob: a small JSON object
 * with the controller's notch), and resuming from the newest checkpoint. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"
#include "util/json.h"

#define BLOB_FORMAT 1

void llmt_trainer_fill_state(llmt_trainer *tr, llmt_train_state *st, char *blob, size_t cap)
{
    const llmt_trainer_parts *p = &tr->parts;
    st->model = p->model;
    st->optimizer = p->optimizer;
    st->scaler = p->scaler;
    st->loader = p->loader;
    st->step = tr->step;
    st->tokens_seen = tr->tokens_seen;
    st->config_yaml = tr->config_yaml;
    int n = snprintf(blob, cap, "{\"trainer\":%d,\"notch\":%lld,\"since_change\":%lld,"
                     "\"escalation_refused\":%d}", BLOB_FORMAT, (long long)tr->ctl.notch,
                     (long long)tr->since_change, tr->escalation_refused);
    st->user_blob = blob;
    st->user_blob_size = n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* Restores the controller from a blob written by llmt_trainer_fill_state. */
int llmt_trainer_restore_blob(llmt_trainer *tr, const char *blob, size_t len)
{
    const llmt_json_limits lim = {2, len, 64, 16};
    llmt_json *root = NULL;
    int64_t format = 0, notch = 0, since = 0, refused = 0;
    int rc = llmt_json_parse(blob, len, &lim, &root);
    /* escalation_refused is optional: blobs written before it lack it. */
    const llmt_json *refused_key = rc ? NULL : llmt_json_get(root, "escalation_refused");
    if (!rc && (llmt_json_int64(llmt_json_get(root, "trainer"), &format) || format != BLOB_FORMAT ||
                llmt_json_int64(llmt_json_get(root, "notch"), &notch) ||
                llmt_json_int64(llmt_json_get(root, "since_change"), &since) ||
                (refused_key && (llmt_json_int64(refused_key, &refused) || refused < 0 ||
                                 refused > 1))))
        rc = llmt_fail(LLMT_ECORRUPT, "the trainer's state in the checkpoint is not one this "
                       "library wrote");
    llmt_json_free(root);
    if (rc)
        return rc;
    if (!tr->cfg.adaptive)
        return LLMT_OK;
    if (notch < tr->ctl.base || notch > tr->ctl.max)
        return llmt_fail(LLMT_EINVAL, "the checkpoint's controller notch %lld is outside this "
                         "configuration's %lld..%lld", (long long)notch,
                         (long long)tr->ctl.base, (long long)tr->ctl.max);
    LLMT_TRY(llmt_controller_apply(&tr->ctl, notch, tr->parts.recompute, tr->parts.slicer));
    tr->since_change = since;
    tr->escalation_refused = (int32_t)refused;
    return LLMT_OK;
}

int llmt_trainer_resume_into(llmt_trainer *tr, llmt_optimizer *opt, int64_t *step,
                             int32_t *tier_out, char *blob, size_t cap, size_t *blob_len)
{
    *step = -1;
    *blob_len = 0;
    if (!tr->parts.store)
        return llmt_fail(LLMT_ESTATE, "llmt_trainer_resume_latest: the trainer has no store");
    int64_t found = -1;
    int32_t tier = 0;
    char notes[4096];
    int rc = llmt_ckpt_latest(tr->parts.store, &found, &tier, notes, sizeof notes);
    if (notes[0])
        llmt_trainer_log(tr, "resume", "checkpoints passed over:\n%s", notes);
    if (rc == LLMT_ENOTFOUND)
        return LLMT_OK; /* an empty store: a fresh start */
    if (rc) /* LLMT_ECORRUPT: checkpoints, none usable; the message names each and why */
        return llmt_fail_prefix(rc, "llmt_trainer_resume_latest");
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    char own_blob[256];
    llmt_trainer_fill_state(tr, &st, own_blob, sizeof own_blob);
    st.optimizer = opt;
    LLMT_TRY(llmt_ckpt_load(tr->parts.store, found, tier, &st, blob, cap - 1, blob_len));
    blob[*blob_len] = '\0';
    LLMT_TRY(llmt_trainer_restore_blob(tr, blob, *blob_len));
    tr->step = st.step;
    tr->tokens_seen = st.tokens_seen;
    tr->saved[tier] = found; /* its state is this checkpoint: no need to save it again */
    llmt_trainer_log(tr, "resume", "resumed from step %lld (%s tier)", (long long)found,
                     tier ? "fast" : "durable");
    *step = found;
    *tier_out = tier;
    return LLMT_OK;
}

/* Logs each optimizer setting the resumed checkpoint's replaced (they were
 * `configured` before it): none is replaced silently. */
static void log_replaced_settings(llmt_trainer *tr, const llmt_optimizer_config *configured)
{
    const llmt_optimizer_config *now = &tr->parts.optimizer->cfg;
    char list[1024] = "";
    size_t used = 0;
    for (int p = 0; p < LLMT_OPTIMIZER_SETTINGS && used < sizeof list; p++) {
        double was = llmt_optimizer_setting(configured, p), is = llmt_optimizer_setting(now, p);
        if (was != is) {
            int n = snprintf(list + used, sizeof list - used, "%s%s %.9g (configured %.9g)",
                             used ? ", " : "", llmt_optimizer_setting_name(p), is, was);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    if (used)
        llmt_trainer_log(tr, "resume", "the checkpoint's optimizer settings replace the "
                         "configured ones: %s (llmt_optimizer_set_settings after the resume "
                         "changes them)", list);
}

int llmt_trainer_resume_latest(llmt_trainer *tr, int64_t *step)
{
    if (!tr || !step)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_resume_latest: %s is NULL", tr ? "step" : "tr");
    *step = -1;
    const llmt_optimizer_config configured = tr->parts.optimizer->cfg;
    int rc;
    if (tr->parts.optimizer->comm) {
        rc = llmt_trainer_dist_resume(tr, step);
    } else {
        char blob[256];
        size_t blob_len = 0;
        int32_t tier = 0;
        rc = llmt_trainer_resume_into(tr, tr->parts.optimizer, step, &tier, blob, sizeof blob,
                                      &blob_len);
    }
    if (!rc && *step >= 0)
        log_replaced_settings(tr, &configured);
    return rc;
}
