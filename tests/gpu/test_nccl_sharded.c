/* The sharded optimizer over NCCL on one GPU (CTest's gpu_nccl_sharded,
 * tests/gpu/run.sh's nccl-sharded stage): on one CUDA context, a model
 * with an unsharded optimizer and its twin (the same seed) with a sharded
 * optimizer over a world-1 NCCL communicator take three bf16_mixed steps on
 * the same batch, clipping active. At world size 1 the exchange moves each
 * gradient to itself, the fp32 sum and its rounding back to bf16 are
 * exact, and the norm is summed per granule as unsharded: after every step
 * the weights are bitwise the same (and moved), and so is the state
 * get_state gathers. A second twin offloads its optimizer state of the
 * embedding and layer 0 (cfg LLMT_OFFLOAD_OPTIMIZER, offload_layers 1): its
 * range straddles the split, and the pipelined host AdamW (pinned staging,
 * copy-stream fences) on the reduced sum it downloads gives the same bits;
 * a third offloads the gradients of that prefix too (LLMT_OFFLOAD_GRADS:
 * stored to pinned host memory on the copy stream as backward runs, then
 * uploaded into the gradient bucket for the exchange): the same bits, also
 * with a vocabulary whose embedding makes the offloaded gradients more than
 * one upload of LLMT_GRAD_STATS_CHUNK elements.
 * Without a CUDA device it exits 77 (skipped), or fails under
 * LLMT_REQUIRE_CUDA=1; a device without a usable NCCL fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "cuda_required.h"
#include "llmt/llmt.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"

enum { VOCAB = 64, BATCH = 4, SEQ = 16, STEPS = 3 };

static llmt_context *g_ctx;
static llmt_comm *g_comm;
static char g_why[512];
static int32_t g_vocab = VOCAB; /* the next models' */

static void check_ok(int rc, const char *what)
{
    if (rc)
        fail_msg("%s: %s", what, llmt_error_last());
}

static llmt_model *make_model(void)
{
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = g_vocab;
    mc.hidden_size = 64;
    mc.num_layers = 2;
    mc.num_heads = 2; /* heads of 32 elements */
    mc.num_kv_heads = 1;
    mc.ffn_size = 128;
    mc.max_seq_len = SEQ;
    mc.precision = LLMT_PRECISION_BF16_MIXED;
    llmt_model *m = NULL;
    check_ok(llmt_model_create(&m, g_ctx, &mc), "model");
    return m;
}

/* The model's weights as bytes on the host (malloc'ed). */
static void *weights_of(const llmt_model *m)
{
    void *h = malloc(m->weights.bytes);
    assert_non_null(h);
    check_ok(m->ops->copy_to_host(m->dev, h, m->weights.ptr, m->weights.bytes), "copy to host");
    return h;
}

/* Every state tensor of a and b (over the same shape, m) the same, bitwise. */
static void expect_same_state(const llmt_optimizer *a, const llmt_optimizer *b, llmt_model *m)
{
    for (int32_t i = 0; i < m->n_params; i++) {
        const llmt_param *p = &m->params[i];
        size_t n = (size_t)p->numel;
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        assert_true(x && y);
        for (int kind = 0; kind < 3; kind++) {
            check_ok(llmt_optimizer_get_state(a, kind, p->name, x, n), "get_state");
            check_ok(llmt_optimizer_get_state(b, kind, p->name, y, n), "get_state sharded");
            if (memcmp(x, y, n * sizeof *x) != 0)
                fail_msg("state %d of %s differs between the sharded optimizer and the "
                         "unsharded one", kind, p->name);
        }
        free(x);
        free(y);
    }
}

/* An unsharded optimizer and a sharded one over g_comm whose state of the
 * first offload_layers layers (and the embedding) is on the host, with
 * their gradients when parts has LLMT_OFFLOAD_GRADS (offload_layers 0:
 * none) take STEPS bf16_mixed steps on twin models: bitwise the same
 * weights after each step, and the same state. */
static void same_steps(int32_t parts, int32_t offload_layers)
{
    if (!g_comm)
        cuda_unavailable(g_why);
    llmt_model *plain = make_model(), *twin = make_model();
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 1e-2;
    oc.grad_clip = 0.5; /* clipping acts: the norm must agree */
    llmt_optimizer *a = NULL, *b = NULL;
    check_ok(llmt_optimizer_create(&a, plain, &oc), "optimizer");
    if (offload_layers) {
        oc.offload_parts = parts;
        oc.offload_layers = offload_layers;
    }
    check_ok(llmt_optimizer_create_sharded(&b, twin, &oc, g_comm, LLMT_REDUCE_DETERMINISTIC),
             "sharded optimizer over NCCL");
    if (offload_layers) { /* world 1: the range is every element; the split inside it */
        assert_int_equal(b->split, twin->layer[offload_layers].ln1);
        assert_true(b->first < b->split && b->split < b->end);
        assert_int_equal(twin->grad_split, parts & LLMT_OFFLOAD_GRADS ? b->split / 4096 * 4096 : 0);
        assert_true(twin->grad_split > 0 || !(parts & LLMT_OFFLOAD_GRADS));
    }
    int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
    void *start = weights_of(twin);
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < BATCH * SEQ; i++) {
            tokens[i] = (i * 7 + step * 3) % VOCAB;
            targets[i] = (i * 7 + step * 3 + 1) % VOCAB;
        }
        double la = 0.0, lb = 0.0;
        check_ok(llmt_model_zero_grads(plain), "zero");
        check_ok(llmt_model_zero_grads(twin), "zero");
        check_ok(llmt_model_forward_backward(plain, tokens, targets, BATCH, SEQ, 1.0, 0.0, &la),
                 "forward_backward");
        check_ok(llmt_model_forward_backward(twin, tokens, targets, BATCH, SEQ, 1.0, 0.0, &lb),
                 "forward_backward");
        assert_memory_equal(&la, &lb, sizeof la);
        check_ok(llmt_optimizer_step(a, NULL, NULL), "step");
        check_ok(llmt_optimizer_step(b, NULL, NULL), "sharded step");
        void *wa = weights_of(plain), *wb = weights_of(twin);
        if (memcmp(wa, wb, plain->weights.bytes) != 0)
            fail_msg("step %d: the weights of the sharded optimizer over NCCL differ from the "
                     "unsharded one's", step + 1);
        free(wa);
        free(wb);
    }
    void *end = weights_of(twin);
    assert_true(memcmp(start, end, twin->weights.bytes) != 0); /* the steps moved them */
    expect_same_state(a, b, twin);
    if (offload_layers)
        printf("sharded over NCCL (world 1, bf16_mixed, state of [0, %lld) of [0, %lld) on the host, "
               "gradients of [0, %lld)): %d steps bitwise the unsharded optimizer's\n",
               (long long)b->split, (long long)b->end, (long long)twin->grad_split, STEPS);
    else
        printf("sharded over NCCL (world 1, bf16_mixed): %d steps bitwise the unsharded "
               "optimizer's\n", STEPS);
    free(start);
    free(end);
    llmt_optimizer_free(b);
    llmt_optimizer_free(a);
    llmt_model_free(twin);
    llmt_model_free(plain);
}

static void test_sharded_same_steps(void **state)
{
    (void)state;
    same_steps(LLMT_OFFLOAD_NONE, 0);
}

/* Offload of a fraction: layer 0 of the model's 2 and the embedding. */
static void test_sharded_offloaded_same_steps(void **state)
{
    (void)state;
    same_steps(LLMT_OFFLOAD_OPTIMIZER, 1);
}

/* The same fraction with its gradients. */
static void test_sharded_grads_offloaded_same_steps(void **state)
{
    (void)state;
    same_steps(LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS, 1);
}

/* Again with an embedding of 20000 x 64 elements: the offloaded gradients
 * (1.3 Mi elements) go up for the exchange in two uploads. */
static void test_sharded_grads_offloaded_in_chunks(void **state)
{
    (void)state;
    g_vocab = 20000;
    assert_true((int64_t)g_vocab * 64 > LLMT_GRAD_STATS_CHUNK);
    same_steps(LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS, 1);
    g_vocab = VOCAB;
}

int main(void)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES];
    if (llmt_context_create(&g_ctx, &cfg)) {
        snprintf(g_why, sizeof g_why, "%s", llmt_error_last());
    } else if (llmt_comm_nccl_unique_id(g_ctx, id) ||
               llmt_comm_create_nccl(&g_comm, g_ctx, id, 0, 1)) {
        /* A CUDA device without a usable NCCL is a failure, not a skip. */
        fprintf(stderr, "NCCL on CUDA: %s\n", llmt_error_last());
        llmt_context_free(g_ctx);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_same_steps),
        cmocka_unit_test(test_sharded_offloaded_same_steps),
        cmocka_unit_test(test_sharded_grads_offloaded_same_steps),
        cmocka_unit_test(test_sharded_grads_offloaded_in_chunks),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int have = g_comm != NULL;
    llmt_comm_free(g_comm);
    llmt_context_free(g_ctx);
    return failed ? failed : have ? 0 : 77;
}
