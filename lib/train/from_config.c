/* A trainer and all its parts from a training configuration. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "core/error.h"
#include "train/trainer_internal.h"

void llmt_trainer_free_owned(llmt_trainer *tr)
{
    llmt_trainer_parts *p = &tr->parts;
    llmt_ckpt_store_free(p->store);
    llmt_loader_free(p->eval_loader);
    llmt_loader_free(p->loader);
    llmt_slicer_free(p->slicer);
    llmt_recompute_free(p->recompute);
    llmt_loss_scaler_free(p->scaler);
    llmt_optimizer_free(p->optimizer);
    llmt_model_free(p->model);
    memset(p, 0, sizeof *p);
}

/* Prefixes a part's error with the configuration key it came from. */
static int keyed(int rc, const char *key)
{
    return rc ? llmt_fail_prefix(rc, "%s", key) : LLMT_OK;
}

/* Creates the parts into p; on failure the caller frees what was made. */
static int make_parts(llmt_context *ctx, const llmt_train_config *c, llmt_comm *comm,
                      llmt_trainer_parts *p)
{
    int rc = keyed(llmt_model_create(&p->model, ctx, &c->model), "model");
    if (comm) /* before the sharded optimizer's collectives */
        rc = llmt_comm_agree(comm, rc);
    LLMT_TRY(rc);
    if (comm)
        LLMT_TRY(keyed(llmt_optimizer_create_sharded(&p->optimizer, p->model, &c->optimizer, comm,
                                                     c->dist_reduce), "optimizer"));
    else
        LLMT_TRY(keyed(llmt_optimizer_create(&p->optimizer, p->model, &c->optimizer), "optimizer"));
    /* Loss scaling is for fp16; the other modes have fp32's range. */
    llmt_loss_scaler_config lc = c->loss_scale;
    if (c->model.precision != LLMT_PRECISION_FP16_MIXED) {
        lc.dynamic = 0;
        lc.init_scale = 1.0;
        lc.min_scale = lc.min_scale < 1.0 ? lc.min_scale : 1.0;
        lc.max_scale = lc.max_scale > 1.0 ? lc.max_scale : 1.0;
    }
    LLMT_TRY(keyed(llmt_loss_scaler_create(&p->scaler, &lc), "loss_scale"));
    LLMT_TRY(llmt_recompute_create(&p->recompute, p->model));
    LLMT_TRY(keyed(llmt_recompute_set_layers(p->recompute, 0, -1, c->recompute), "recompute"));
    LLMT_TRY(keyed(llmt_slicer_create(&p->slicer, p->model, c->micro_batch), "batch.micro_batch"));
    LLMT_TRY(keyed(llmt_slicer_set_accumulation(p->slicer, c->accumulation), "batch.accumulation"));
    llmt_loader_config dc = LLMT_LOADER_CONFIG_INIT;
    dc.batch_size = c->batch_size;
    dc.seq_len = c->seq_len;
    dc.vocab_size = c->model.vocab_size;
    dc.shuffle = c->shuffle;
    if (!c->train_data[0])
        return llmt_fail(LLMT_EINVAL, "data.train: no training data given");
    LLMT_TRY(keyed(llmt_loader_open_glob(&p->loader, ctx, c->train_data, &dc), "data.train"));
    if (c->val_data[0]) {
        dc.shuffle = 0;
        LLMT_TRY(keyed(llmt_loader_open_glob(&p->eval_loader, ctx, c->val_data, &dc), "data.val"));
    }
    if (c->checkpoint_dir[0] && llmt_comm_rank(comm) <= 0) { /* rank 0 only */
        llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
        sc.keep = c->checkpoint_keep;
        sc.fast_dir = c->fast_checkpoint_dir[0] ? c->fast_checkpoint_dir : NULL;
        sc.fast_keep = c->fast_checkpoint_keep;
        LLMT_TRY(keyed(llmt_ckpt_store_open(&p->store, ctx, c->checkpoint_dir, &sc), "checkpoint.dir"));
    }
    return LLMT_OK;
}

/* The trainer over parts made from c; comm NULL for a single process. */
static int create(llmt_trainer **out, llmt_context *ctx, const llmt_train_config *c,
                  llmt_comm *comm, const char *fn)
{
    if (!out || !ctx || !c)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, !out ? "out" : !ctx ? "ctx" : "cfg");
    *out = NULL;
    /* With comm, every rank takes the same path through the collectives:
     * local failures are agreed before each one. */
    int rc = llmt_train_config_check(c);
    if (!rc && c->memory_budget)
        rc = keyed(llmt_context_set_budget(ctx, c->memory_budget), "memory.budget");
    if (!rc && c->memory_host_budget)
        rc = keyed(llmt_context_set_host_budget(ctx, c->memory_host_budget),
                   "memory.host_budget");
    size_t yaml_len = 0;
    if (!rc)
        rc = llmt_train_config_to_yaml(c, NULL, 0, &yaml_len);
    char *yaml = rc ? NULL : malloc(yaml_len);
    if (!rc && !yaml)
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    if (!rc)
        rc = llmt_train_config_to_yaml(c, yaml, yaml_len, NULL);
    if (comm) {
        rc = llmt_comm_agree(comm, rc);
        if (!rc) /* every rank must run the same configuration */
            rc = llmt_comm_check_same(comm, "the training configuration",
                                      XXH3_64bits(yaml, strlen(yaml)));
    }
    if (rc) {
        free(yaml);
        return rc;
    }
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    rc = make_parts(ctx, c, comm, &p);
    if (comm) /* before the trainer's own collectives */
        rc = llmt_comm_agree(comm, rc);
    llmt_trainer_config tc = LLMT_TRAINER_CONFIG_INIT;
    tc.batch_size = c->batch_size;
    tc.seq_len = c->seq_len;
    tc.total_steps = c->steps;
    tc.eval_every = p.eval_loader ? c->eval_every : 0;
    tc.eval_batches = c->eval_batches;
    tc.checkpoint_every = c->checkpoint_dir[0] ? c->checkpoint_every : 0;
    tc.fast_checkpoint_every = c->checkpoint_dir[0] && c->fast_checkpoint_dir[0]
                                   ? c->fast_checkpoint_every : 0;
    tc.checkpoint_async = c->checkpoint_async;
    tc.metrics_path = c->metrics[0] && llmt_comm_rank(comm) <= 0 ? c->metrics : NULL;
    tc.config_yaml = yaml;
    tc.adaptive = c->adaptive;
    tc.memory_threshold = c->memory_threshold;
    if (!rc) /* collective with a sharded optimizer: its failures are agreed */
        rc = llmt_trainer_create(out, &p, &tc);
    free(yaml);
    if (rc) {
        llmt_trainer_free(*out);
        *out = NULL;
        llmt_trainer tmp = {.parts = p};
        llmt_trainer_free_owned(&tmp);
        return rc;
    }
    (*out)->owned = 1;
    return LLMT_OK;
}

int llmt_trainer_create_from_config(llmt_trainer **out, llmt_context *ctx,
                                    const llmt_train_config *c)
{
    return create(out, ctx, c, NULL, "llmt_trainer_create_from_config");
}

int llmt_trainer_create_from_config_dist(llmt_trainer **out, llmt_context *ctx,
                                         const llmt_train_config *c, llmt_comm *comm)
{
    return create(out, ctx, c, comm, "llmt_trainer_create_from_config_dist");
}
