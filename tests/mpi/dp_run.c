/* The data-parallel tests' shared run (dp_run.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "dist/comm_internal.h"
#include "dp_run.h"
#include "model/model_internal.h"
#include "train/trainer_internal.h"

int32_t layers = 2, micro = MICRO, tied;
const char *fast_dir;
int64_t fast_every;
int32_t backend = LLMT_BACKEND_CPU, heads = 4, kv_heads = 2;
int32_t offload_parts = LLMT_OFFLOAD_NONE, offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
llmt_comm *device_comm;
int adaptive;
double adaptive_threshold = 1.0;
int32_t adaptive_relax_window = 1, adaptive_recompute = LLMT_RECOMPUTE_NONE;

/* One shard of a learnable token stream (the same on every rank). */
void write_shard(const char *dir)
{
    enum { N = 1601 };
    static int32_t tokens[N];
    uint32_t x = 4242u;
    int32_t tok = 1;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        tok = (x >> 28) == 0 ? (int32_t)((x >> 8) % VOCAB) : (tok * 5 + 3) % VOCAB;
        tokens[i] = tok;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    must(llmt_shard_write(path, tokens, N, LLMT_SHARD_VERSION_U16), "shard write");
}

void dp_model_config(llmt_model_config *mc, int precision)
{
    llmt_model_config_init(mc);
    mc->vocab_size = VOCAB;
    mc->hidden_size = 32;
    mc->num_layers = layers;
    mc->tie_embeddings = tied;
    mc->num_heads = heads;
    mc->num_kv_heads = kv_heads;
    mc->ffn_size = 64;
    mc->max_seq_len = T;
    mc->precision = precision;
}

/* A run over dir's shard: sharded over comm (NULL: one process with an
 * ordered slicer); with ckpt_dir, rank 0 holds a store there (and the fast
 * tier fast_dir) and the run checkpoints every `every` steps (0: never). */
void run_open(run *r, const char *dir, int precision, llmt_comm *comm, int reduce,
                     const char *ckpt_dir, int64_t every, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cc.seed = seed;
    cc.backend = backend;
    must(llmt_context_create(&r->ctx, &cc), "context");
    llmt_model_config mc;
    dp_model_config(&mc, precision);
    must(llmt_model_create(&r->model, r->ctx, &mc), "model");
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.schedule = LLMT_SCHEDULE_COSINE;
    oc.warmup_steps = 3;
    oc.total_steps = 40;
    oc.grad_clip = 0.5; /* clipping acts: the norm must agree too */
    oc.offload_parts = offload_parts;
    oc.offload_layers = offload_layers;
    if (comm && comm == device_comm)
        comm->device = r->ctx->backend;
    if (comm)
        must(llmt_optimizer_create_sharded(&r->opt, r->model, &oc, comm, reduce),
             "sharded optimizer");
    else
        must(llmt_optimizer_create(&r->opt, r->model, &oc), "optimizer");
    if (precision == LLMT_PRECISION_FP16_MIXED) { /* the first steps overflow and are skipped */
        llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
        lc.init_scale = 16777216.0;
        lc.growth_interval = 4;
        must(llmt_loss_scaler_create(&r->scaler, &lc), "scaler");
    }
    must(llmt_slicer_create(&r->slicer, r->model, micro), "slicer");
    if (!comm)
        must(llmt_slicer_set_accumulation(r->slicer, LLMT_ACCUMULATE_ORDERED), "accumulation");
    if (adaptive) {
        must(llmt_recompute_create(&r->recompute, r->model), "recompute");
        must(llmt_recompute_set_layers(r->recompute, 0, -1, adaptive_recompute),
             "recompute policy");
    }
    char pattern[600];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir);
    llmt_loader_config dc = LLMT_LOADER_CONFIG_INIT;
    dc.batch_size = B;
    dc.seq_len = T;
    dc.vocab_size = VOCAB;
    must(llmt_loader_open_glob(&r->loader, r->ctx, pattern, &dc), "loader");
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.fast_dir = fast_dir;
    if (ckpt_dir && (!comm || llmt_comm_rank(comm) == 0))
        must(llmt_ckpt_store_open(&r->store, r->ctx, ckpt_dir, &sc), "store");
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    p.model = r->model;
    p.optimizer = r->opt;
    p.slicer = r->slicer;
    p.recompute = r->recompute;
    p.scaler = r->scaler;
    p.loader = r->loader;
    p.store = r->store;
    llmt_trainer_config tc = LLMT_TRAINER_CONFIG_INIT;
    tc.batch_size = B;
    tc.seq_len = T;
    tc.total_steps = STEPS;
    tc.adaptive = adaptive;
    if (adaptive) {
        tc.memory_threshold = adaptive_threshold;
        tc.relax_window = adaptive_relax_window;
    }
    tc.checkpoint_every = every;
    tc.fast_checkpoint_every = ckpt_dir && fast_dir ? fast_every : 0;
    must(llmt_trainer_create(&r->tr, &p, &tc), "trainer");
}

void run_close(run *r)
{
    llmt_trainer_free(r->tr);
    llmt_ckpt_store_free(r->store);
    llmt_loader_free(r->loader);
    llmt_slicer_free(r->slicer);
    llmt_recompute_free(r->recompute);
    llmt_loss_scaler_free(r->scaler);
    llmt_optimizer_free(r->opt);
    llmt_model_free(r->model);
    llmt_context_free(r->ctx);
}

void train(run *r, int n, double *losses)
{
    for (int i = 0; i < n; i++) {
        llmt_step_report rep;
        memset(&rep, 0, sizeof rep);
        rep.version = LLMT_STEP_REPORT_VERSION;
        must(llmt_trainer_step(r->tr, &rep), "step");
        if (losses)
            losses[i] = rep.loss;
    }
}

int64_t offload_prefix_of(const llmt_model *m, int32_t off)
{
    if (off == 0)
        return 0;
    if (off == LLMT_OFFLOAD_ALL_LAYERS)
        return m->num_params;
    int64_t p = 0;
    for (int32_t i = 0; i < m->n_params; i++) {
        int layer = -1;
        const char *name = m->params[i].name;
        if (!strcmp(name, "model.embed_tokens.weight") ||
            (sscanf(name, "model.layers.%d.", &layer) == 1 && layer < off))
            p += m->params[i].numel;
    }
    return p;
}

void append_log(void *user, const char *line)
{
    char *log = user;
    size_t used = strlen(log);
    snprintf(log + used, 8192 - used, "%s\n", line);
}

void adaptive_step_agreed(run *r, int i, uint64_t budget, double *loss)
{
    llmt_step_report rep;
    memset(&rep, 0, sizeof rep);
    rep.version = LLMT_STEP_REPORT_VERSION;
    must(llmt_trainer_step(r->tr, &rep), "adaptive step");
    loss[i] = rep.loss;
    int32_t parts = 0, off = 0;
    must(llmt_optimizer_get_offload(r->opt, &parts, &off), "get_offload");
    const int same = same_on_all(r->tr->ctl.notch) && same_on_all(off) && same_on_all(parts);
    EXPECT(same, "step %d: notch %lld, offload (%d, %d) differ between the ranks", i + 1,
           (long long)r->tr->ctl.notch, parts, off);
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    EXPECT(rep.micro_batch == MICRO && (!budget || ms.total_peak <= budget),
           "step %d: micro-batch %d, this rank's peak %llu of its budget %llu", i + 1,
           rep.micro_batch, (unsigned long long)ms.total_peak, (unsigned long long)budget);
}
