/* NULL configurations where the API accepts them (context, store, trainer:
 * the documented defaults) and where it refuses them (loader: vocab_size has
 * no default); the trainer's batch and seq_len checked against its loaders
 * at create; the LLMT_EBUSY status string. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "train_fixture.h"
#include "util/fsutil.h"

static char root[64];

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/llmt-defaults-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    fixture_write_shards(root);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return llmt_remove_tree(root);
}

/* llmt_comm_ops_init gives the _INIT values, which llmt_comm_create
 * refuses by name until the callbacks are set. */
static void test_comm_ops_init(void **state)
{
    (void)state;
    llmt_comm_ops ops;
    memset(&ops, 0xab, sizeof ops);
    llmt_comm_ops_init(&ops);
    const llmt_comm_ops defaults = LLMT_COMM_OPS_INIT;
    assert_int_equal(ops.version, LLMT_COMM_OPS_VERSION);
    assert_int_equal(ops.rank, 0);
    assert_int_equal(ops.size, 1);
    assert_null(ops.user);
    assert_null(ops.alltoallv);
    assert_null(ops.barrier);
    assert_int_equal(ops.size, defaults.size);
    llmt_comm *comm = NULL;
    assert_int_equal(llmt_comm_create(&comm, &ops), LLMT_EINVAL);
    assert_non_null(strstr(llmt_error_last(), "ops->alltoallv is NULL"));
    assert_null(comm);
    llmt_comm_ops_init(NULL); /* accepted */
}

static void test_context_null_config(void **state)
{
    (void)state;
    llmt_context *ctx = NULL;
    assert_int_equal(llmt_context_create(&ctx, NULL), LLMT_OK);
    assert_int_equal(llmt_context_backend(ctx), LLMT_BACKEND_CPU);
    assert_true(llmt_context_num_threads(ctx) >= 1);
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &ms), LLMT_OK);
    assert_int_equal(ms.budget, 0);
    llmt_rng_state rng = {1, 1, 1};
    assert_int_equal(llmt_context_rng_get(ctx, &rng), LLMT_OK);
    assert_int_equal(rng.seed, 0);
    llmt_context_free(ctx);
}

static void test_store_null_config(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, root, LLMT_PRECISION_FP32, 16);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    llmt_ckpt_store *s = NULL;
    assert_int_equal(llmt_ckpt_store_open(&s, f.ctx, dir, NULL), LLMT_OK);
    llmt_train_state st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_FAST), LLMT_EINVAL); /* no fast tier */
    llmt_ckpt_store_free(s);
    fixture_close(&f);
}

static void test_loader_null_config_refused(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, root, LLMT_PRECISION_FP32, 16);
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", root);
    llmt_loader *l = (llmt_loader *)&f;
    assert_int_equal(llmt_loader_open_glob(&l, f.ctx, pattern, NULL), LLMT_EINVAL);
    assert_null(l);
    assert_contains(llmt_error_last(), "cfg (required: vocab_size has no default)");
    fixture_close(&f);
}

static void test_trainer_config(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, root, LLMT_PRECISION_FP32, 16);
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    p.model = f.model;
    p.optimizer = f.opt;
    p.loader = f.loader;
    /* NULL: the defaults, with the loader's batch and seq_len (a step runs). */
    llmt_trainer *tr = NULL;
    assert_int_equal(llmt_trainer_create(&tr, &p, NULL), LLMT_OK);
    llmt_step_report r = {.version = LLMT_STEP_REPORT_VERSION};
    assert_int_equal(llmt_trainer_step(tr, &r), LLMT_OK);
    assert_int_equal(r.micro_batch, FIX_B);
    assert_int_equal(r.tokens_seen, FIX_B * FIX_T);
    llmt_trainer_free(tr);

    /* A mismatch is refused at create, naming both values. */
    llmt_trainer_config c = LLMT_TRAINER_CONFIG_INIT;
    c.adaptive = 0;
    c.batch_size = FIX_B + 1;
    c.seq_len = FIX_T;
    tr = (llmt_trainer *)&f;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_EINVAL);
    assert_null(tr);
    char want[128];
    snprintf(want, sizeof want, "cfg->batch_size = %d, cfg->seq_len = %d, but parts->loader "
             "serves batch_size %d, seq_len %d", FIX_B + 1, FIX_T, FIX_B, FIX_T);
    assert_contains(llmt_error_last(), want);
    c.batch_size = FIX_B;
    c.seq_len = FIX_T - 1;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "seq_len 8");
    /* The eval loader too. */
    llmt_loader_config lc = LLMT_LOADER_CONFIG_INIT;
    lc.batch_size = 1;
    lc.seq_len = FIX_T;
    lc.vocab_size = FIX_VOCAB;
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", root);
    llmt_loader *eval = NULL;
    assert_int_equal(llmt_loader_open_glob(&eval, f.ctx, pattern, &lc), LLMT_OK);
    p.eval_loader = eval;
    c.seq_len = FIX_T;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "parts->eval_loader serves batch_size 1");
    llmt_loader_free(eval);
    fixture_close(&f);
}

static void test_busy_status_string(void **state)
{
    (void)state;
    assert_int_equal(LLMT_EBUSY, -10);
    assert_string_equal(llmt_status_string(LLMT_EBUSY), "in use by another process");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comm_ops_init),
        cmocka_unit_test(test_context_null_config),
        cmocka_unit_test(test_store_null_config),
        cmocka_unit_test(test_loader_null_config_refused),
        cmocka_unit_test(test_trainer_config),
        cmocka_unit_test(test_busy_status_string),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
