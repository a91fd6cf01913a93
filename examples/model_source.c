/* Loading the model a tool was pointed at (model_source.h). */
#include <stdio.h>
#include <stdlib.h>

#include "model_source.h"

int model_source_check(const char *prog, const model_source *src)
{
    int given = !!src->checkpoint + !!src->hf + !!src->model;
    if (given != 1) {
        fprintf(stderr, "%s: give exactly one of --checkpoint DIR, --hf DIR, --model FILE "
                "(%d given)\nTry '%s --help'.\n", prog, given, prog);
        return -1;
    }
    if (src->step >= 0 && !src->checkpoint) {
        fprintf(stderr, "%s: --step needs --checkpoint\nTry '%s --help'.\n", prog, prog);
        return -1;
    }
    return 0;
}

/* Whether the store holds checkpoint step (durable tier); -1 with a message
 * listing the steps it holds when it does not, or on a failure. */
static int find_step(const char *prog, const char *dir, llmt_ckpt_store *store, int64_t step)
{
    size_t count = 0;
    int64_t *steps = NULL;
    int rc = llmt_ckpt_list(store, LLMT_CKPT_DURABLE, NULL, 0, &count);
    if (!rc && count && !(steps = malloc(count * sizeof *steps)))
        rc = LLMT_ENOMEM;
    if (!rc && count)
        rc = llmt_ckpt_list(store, LLMT_CKPT_DURABLE, steps, count, &count);
    if (rc) {
        fprintf(stderr, "%s: checkpoint directory %s: %s\n", prog, dir,
                rc == LLMT_ENOMEM ? "out of memory" : llmt_error_last());
        free(steps);
        return -1;
    }
    int found = 0;
    for (size_t i = 0; i < count; i++)
        found |= steps[i] == step;
    if (!found) {
        fprintf(stderr, "%s: checkpoint directory %s: no step %lld (steps there:", prog, dir,
                (long long)step);
        for (size_t i = 0; i < count; i++)
            fprintf(stderr, " %lld", (long long)steps[i]);
        fprintf(stderr, "%s)\n", count ? "" : " none");
    }
    free(steps);
    return found ? 0 : -1;
}

/* The directory of the checkpoint to read in *path: step, or the newest
 * that verifies when step < 0. */
static int checkpoint_path(const char *prog, const char *dir, int64_t *step, llmt_context *ctx,
                           char *path, size_t cap)
{
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.read_only = 1;
    llmt_ckpt_store *store = NULL;
    int32_t tier = LLMT_CKPT_DURABLE;
    int rc = llmt_ckpt_store_open(&store, ctx, dir, &sc);
    if (!rc && *step >= 0 && find_step(prog, dir, store, *step)) {
        llmt_ckpt_store_free(store);
        return -1;
    }
    if (!rc && *step < 0)
        rc = llmt_ckpt_latest(store, step, &tier, NULL, 0);
    else if (!rc)
        rc = llmt_ckpt_verify(store, *step, tier);
    if (!rc)
        rc = llmt_ckpt_path(store, *step, tier, path, cap, NULL);
    if (rc)
        fprintf(stderr, "%s: checkpoint directory %s: %s\n", prog, dir, llmt_error_last());
    llmt_ckpt_store_free(store);
    return rc ? -1 : 0;
}

int model_source_load(const char *prog, const model_source *src, llmt_context *ctx,
                      llmt_model **out, char *what, size_t what_cap)
{
    char path[4096];
    int rc;
    if (src->checkpoint) {
        int64_t step = src->step;
        if (checkpoint_path(prog, src->checkpoint, &step, ctx, path, sizeof path))
            return -1;
        rc = llmt_model_create_from_file(out, ctx, path, LLMT_PRECISION_AS_SAVED);
        snprintf(what, what_cap, "checkpoint %s step %lld", src->checkpoint, (long long)step);
    } else if (src->hf) {
        rc = llmt_model_create_from_hf(out, ctx, src->hf, LLMT_PRECISION_AS_SAVED, NULL, 0);
        snprintf(what, what_cap, "Hugging Face directory %s", src->hf);
    } else {
        rc = llmt_model_create_from_file(out, ctx, src->model, LLMT_PRECISION_AS_SAVED);
        snprintf(what, what_cap, "model %s", src->model);
    }
    if (rc)
        fprintf(stderr, "%s: %s\n", prog, llmt_error_last());
    return rc ? -1 : 0;
}
