/* The training fixture of the checkpoint and trainer tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train_fixture.h"

static void check(int rc, const char *what)
{
    if (rc != LLMT_OK) {
        fprintf(stderr, "fixture: %s: %s\n", what, llmt_error_last());
        abort();
    }
}

void fixture_write_shards(const char *dir)
{
    /* Shard sizes give 6 and 4 windows of T + 1 tokens at stride T. */
    const size_t sizes[2] = {6 * FIX_T + 1, 4 * FIX_T + 1};
    for (int s = 0; s < 2; s++) {
        int32_t tokens[6 * FIX_T + 1];
        uint32_t x = 12345u + (uint32_t)s;
        int32_t tok = 1;
        for (size_t i = 0; i < sizes[s]; i++) {
            x = x * 1664525u + 1013904223u;
            tok = (x >> 28) == 0 ? (int32_t)((x >> 8) % FIX_VOCAB) : (tok * 3 + 1) % FIX_VOCAB;
            tokens[i] = tok;
        }
        char path[512];
        snprintf(path, sizeof path, "%s/train_%06d.bin", dir, s);
        check(llmt_shard_write(path, tokens, sizes[s], LLMT_SHARD_VERSION_U16), "shard write");
    }
}

void fixture_open(fixture *f, const char *dir, int precision, int hidden)
{
    memset(f, 0, sizeof *f);
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cc.seed = 77;
    check(llmt_context_create(&f->ctx, &cc), "context");
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = FIX_VOCAB;
    mc.hidden_size = hidden;
    mc.num_layers = 2;
    mc.num_heads = 4;
    mc.num_kv_heads = 2;
    mc.ffn_size = 2 * hidden;
    mc.max_seq_len = FIX_T;
    mc.precision = precision;
    check(llmt_model_create(&f->model, f->ctx, &mc), "model");
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.schedule = LLMT_SCHEDULE_COSINE;
    oc.warmup_steps = 3;
    oc.total_steps = 60;
    check(llmt_optimizer_create(&f->opt, f->model, &oc), "optimizer");
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    lc.init_scale = precision == LLMT_PRECISION_FP16_MIXED ? 16777216.0 : 1.0;
    lc.dynamic = precision == LLMT_PRECISION_FP16_MIXED;
    lc.growth_interval = 5;
    check(llmt_loss_scaler_create(&f->scaler, &lc), "scaler");
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir);
    llmt_loader_config dc = LLMT_LOADER_CONFIG_INIT;
    dc.batch_size = FIX_B;
    dc.seq_len = FIX_T;
    dc.vocab_size = FIX_VOCAB;
    check(llmt_loader_open_glob(&f->loader, f->ctx, pattern, &dc), "loader");
}

void fixture_close(fixture *f)
{
    llmt_loader_free(f->loader);
    llmt_loss_scaler_free(f->scaler);
    llmt_optimizer_free(f->opt);
    llmt_model_free(f->model);
    llmt_context_free(f->ctx);
    memset(f, 0, sizeof *f);
}

void fixture_train(fixture *f, int n, double *losses)
{
    int32_t tokens[FIX_B * FIX_T], targets[FIX_B * FIX_T];
    for (int i = 0; i < n; i++) {
        check(llmt_loader_next(f->loader, tokens, targets, FIX_B * FIX_T), "next");
        check(llmt_model_zero_grads(f->model), "zero");
        double loss = 0;
        check(llmt_model_forward_backward(f->model, tokens, targets, FIX_B, FIX_T,
                                          llmt_loss_scaler_scale(f->scaler), 0, &loss),
              "forward_backward");
        check(llmt_optimizer_step(f->opt, f->scaler, NULL), "optimizer step");
        if (losses)
            losses[i] = loss;
        f->step++;
        f->tokens_seen += FIX_B * FIX_T;
    }
}

static void append(unsigned char **buf, size_t *len, const void *p, size_t n)
{
    *buf = realloc(*buf, *len + n);
    memcpy(*buf + *len, p, n);
    *len += n;
}

unsigned char *fixture_state_bytes(const fixture *f, size_t *len)
{
    unsigned char *buf = NULL;
    *len = 0;
    append(&buf, len, f->model->weights.ptr, f->model->weights.bytes);
    append(&buf, len, f->opt->m.ptr, f->opt->m.bytes);
    append(&buf, len, f->opt->v.ptr, f->opt->v.bytes);
    if (f->opt->master.bytes)
        append(&buf, len, f->opt->master.ptr, f->opt->master.bytes);
    append(&buf, len, &f->opt->steps, sizeof f->opt->steps);
    /* Field by field: the structs have padding. */
    llmt_loss_scaler_state ss = LLMT_LOSS_SCALER_STATE_INIT;
    check(llmt_loss_scaler_get_state(f->scaler, &ss), "scaler state");
    append(&buf, len, &ss.scale, sizeof ss.scale);
    append(&buf, len, &ss.clean_steps, sizeof ss.clean_steps);
    append(&buf, len, &ss.skipped_steps, sizeof ss.skipped_steps);
    llmt_rng_state rng;
    check(llmt_context_rng_get(f->ctx, &rng), "rng");
    append(&buf, len, &rng, sizeof rng);
    llmt_loader_state ls = LLMT_LOADER_STATE_INIT;
    check(llmt_loader_get_state(f->loader, &ls), "loader state");
    const uint64_t pos[6] = {ls.epoch, ls.shard_cursor, ls.window_cursor, ls.windows_consumed,
                             ls.seed, ls.fingerprint};
    append(&buf, len, pos, sizeof pos);
    append(&buf, len, &f->step, sizeof f->step);
    append(&buf, len, &f->tokens_seen, sizeof f->tokens_seen);
    return buf;
}

llmt_train_state fixture_state(fixture *f)
{
    llmt_train_state s = LLMT_TRAIN_STATE_INIT;
    s.model = f->model;
    s.optimizer = f->opt;
    s.scaler = f->scaler;
    s.loader = f->loader;
    s.step = f->step;
    s.tokens_seen = f->tokens_seen;
    return s;
}
