/* Checkpoints and exact resume: trains N steps saving every 5, "crashes"
 * (drops every object), builds everything anew, resumes from the newest
 * valid checkpoint and trains to 2N; then does 2N straight in a fresh run and
 * shows that both end with the same loss, to the bit.
 *
 *   resume_demo 'data/text_train_*.bin' CHECKPOINT_DIR [N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llmt/llmt.h>

#define CHECK(call)                                                      \
    do {                                                                 \
        if ((call) != LLMT_OK) {                                         \
            fprintf(stderr, "resume_demo: %s\n", llmt_error_last());     \
            exit(1);                                                     \
        }                                                                \
    } while (0)

enum { B = 4, T = 64 };

typedef struct run {
    llmt_context *ctx;
    llmt_model *model;
    llmt_optimizer *opt;
    llmt_loader *data;
    llmt_ckpt_store *store;
    int64_t step;
} run;

static void open_run(run *r, const char *shards, const char *dir)
{
    memset(r, 0, sizeof *r);
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = 320, mc.hidden_size = 64, mc.num_layers = 2, mc.max_seq_len = T;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_loader_config lc = LLMT_LOADER_CONFIG_INIT;
    lc.batch_size = B, lc.seq_len = T, lc.vocab_size = mc.vocab_size;
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    CHECK(llmt_context_create(&r->ctx, &cc));
    CHECK(llmt_model_create(&r->model, r->ctx, &mc));
    CHECK(llmt_optimizer_create(&r->opt, r->model, &oc));
    CHECK(llmt_loader_open_glob(&r->data, r->ctx, shards, &lc));
    if (dir)
        CHECK(llmt_ckpt_store_open(&r->store, r->ctx, dir, &sc));
}

static void close_run(run *r)
{
    llmt_ckpt_store_free(r->store);
    llmt_loader_free(r->data);
    llmt_optimizer_free(r->opt);
    llmt_model_free(r->model);
    llmt_context_free(r->ctx);
}

static llmt_train_state state_of(run *r)
{
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    st.model = r->model, st.optimizer = r->opt, st.loader = r->data, st.step = r->step;
    return st;
}

/* Trains until step `until`, saving every 5 steps when there is a store. */
static double train(run *r, int64_t until)
{
    static int32_t tokens[B * T], targets[B * T];
    double loss = 0;
    while (r->step < until) {
        CHECK(llmt_loader_next(r->data, tokens, targets, B * T));
        CHECK(llmt_model_zero_grads(r->model));
        CHECK(llmt_model_forward_backward(r->model, tokens, targets, B, T, 1.0, 0.0, &loss));
        CHECK(llmt_optimizer_step(r->opt, NULL, NULL));
        r->step++;
        if (r->store && r->step % 5 == 0) {
            llmt_train_state st = state_of(r);
            CHECK(llmt_ckpt_save_async(r->store, &st, LLMT_CKPT_DURABLE));
        }
    }
    return loss;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: resume_demo SHARD_GLOB CHECKPOINT_DIR [N]\n");
        return 2;
    }
    int64_t n = argc > 3 ? atoll(argv[3]) : 12;
    run r;
    open_run(&r, argv[1], argv[2]);
    train(&r, n);
    close_run(&r); /* waits for the save in flight; then everything is gone */

    open_run(&r, argv[1], argv[2]);
    int64_t step;
    int32_t tier;
    CHECK(llmt_ckpt_latest(r.store, &step, &tier, NULL, 0));
    llmt_train_state st = state_of(&r);
    CHECK(llmt_ckpt_load(r.store, step, tier, &st, NULL, 0, NULL));
    r.step = st.step;
    printf("resumed from the checkpoint of step %lld\n", (long long)step);
    double resumed = train(&r, 2 * n);
    close_run(&r);

    open_run(&r, argv[1], NULL);
    double straight = train(&r, 2 * n);
    close_run(&r);
    printf("loss at step %lld: resumed %.17g, straight %.17g: %s\n", (long long)(2 * n), resumed,
           straight, resumed == straight ? "identical" : "DIFFERENT");
    return resumed == straight ? 0 : 1;
}
