/* Planning without a context (llmt_plan_compute_backend, llmt_plan_fit_backend):
 * on the CPU it equals the plan of a context with the same thread count, byte
 * for byte; for CUDA it needs the plugin but no device, and where a CUDA
 * context opens it equals that context's plan; bad arguments are named. */
#include <stdio.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"

static llmt_plan_config plan_config(int precision, int32_t recompute)
{
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model.vocab_size = 41;
    pc.model.hidden_size = 32;
    pc.model.num_layers = 3;
    pc.model.num_heads = 4;
    pc.model.num_kv_heads = 2;
    pc.model.ffn_size = 48;
    pc.model.max_seq_len = 16;
    pc.model.precision = precision;
    pc.recompute = recompute;
    pc.micro_batch = 3;
    pc.seq_len = 16;
    return pc;
}

static void assert_plans_equal(const llmt_plan *a, const llmt_plan *b)
{
    for (int i = 0; i < LLMT_MEM_CATEGORY_SLOTS; i++)
        assert_int_equal(a->bytes[i], b->bytes[i]);
    assert_int_equal(a->peak, b->peak);
    assert_int_equal(a->num_params, b->num_params);
}

/* Every precision and two policies, with 1 and 3 threads (the CPU's
 * scratch grows with the thread count). */
static void test_cpu_equals_context(void **state)
{
    (void)state;
    const int threads[2] = {1, 3};
    const int32_t policies[2] = {LLMT_RECOMPUTE_NONE, LLMT_RECOMPUTE_FULL};
    for (int t = 0; t < 2; t++) {
        llmt_context *ctx = test_context(threads[t], 1);
        for (int prec = 0; prec < 4; prec++)
            for (int k = 0; k < 2; k++) {
                llmt_plan_config pc = plan_config(prec, policies[k]);
                llmt_plan want = LLMT_PLAN_INIT, got = LLMT_PLAN_INIT;
                assert_int_equal(llmt_plan_compute(ctx, &pc, &want), LLMT_OK);
                assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, threads[t], &pc, &got),
                                 LLMT_OK);
                assert_plans_equal(&want, &got);
                /* A budget between the two policies' peaks: both fits agree. */
                int32_t b1 = 0, r1 = -1, b2 = 0, r2 = -1;
                uint64_t budget = want.peak - 1;
                int rc1 = llmt_plan_fit(ctx, &pc, budget, &b1, &r1);
                int rc2 = llmt_plan_fit_backend(LLMT_BACKEND_CPU, threads[t], &pc, budget, &b2, &r2);
                assert_int_equal(rc1, rc2);
                assert_int_equal(b1, b2);
                assert_int_equal(r1, r2);
            }
        llmt_context_free(ctx);
    }
}

static void test_cuda_without_device(void **state)
{
    (void)state;
    llmt_plan_config pc = plan_config(LLMT_PRECISION_BF16_MIXED, LLMT_RECOMPUTE_NONE);
    llmt_plan p = LLMT_PLAN_INIT;
    int rc = llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &p);
#ifdef LLMT_TEST_HAVE_CUDA_PLUGIN
    /* The plugin is loaded for its sizes; no device is opened, so this holds
     * on a machine without a GPU or a driver. */
    assert_int_equal(rc, LLMT_OK);
    llmt_plan cpu = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &cpu), LLMT_OK);
    assert_int_equal(p.bytes[LLMT_MEM_PARAMS], cpu.bytes[LLMT_MEM_PARAMS]);
    assert_int_equal(p.num_params, cpu.num_params);
    int32_t b = 0, r = -1;
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CUDA, 1, &pc, p.peak, &b, &r), LLMT_OK);
    assert_int_equal(b, pc.micro_batch);
    assert_int_equal(r, LLMT_RECOMPUTE_NONE);
    /* Where a CUDA context opens, its plan is the same. */
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.backend = LLMT_BACKEND_CUDA;
    cc.num_threads = 1;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cc) == LLMT_OK) {
        llmt_plan want = LLMT_PLAN_INIT;
        assert_int_equal(llmt_plan_compute(ctx, &pc, &want), LLMT_OK);
        assert_plans_equal(&want, &p);
        llmt_context_free(ctx);
    } else {
        print_message("no CUDA device (%s): the plan was made without one\n", llmt_error_last());
    }
#else
    assert_int_equal(rc, LLMT_EUNSUPPORTED);
    assert_contains(llmt_error_last(), "-DLLMT_CUDA=ON");
#endif
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    llmt_plan_config pc = plan_config(LLMT_PRECISION_FP32, LLMT_RECOMPUTE_NONE);
    llmt_plan p = LLMT_PLAN_INIT;
    int32_t b = 0, r = 0;
    assert_int_equal(llmt_plan_compute_backend(7, 1, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "llmt_plan_compute_backend: backend = 7");
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 0, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "num_threads = 0");
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1025, &pc, &p), LLMT_EINVAL);
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, NULL, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg is NULL");
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "out is NULL");
    pc.seq_len = 17;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->seq_len = 17");
    pc.seq_len = 16;
    p.version = 0;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &p), LLMT_EVERSION);
    assert_contains(llmt_error_last(), "out->version = 0");
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, &pc, 1 << 30, NULL, &r),
                     LLMT_EINVAL);
    assert_contains(llmt_error_last(), "llmt_plan_fit_backend: micro_batch is NULL");
    assert_int_equal(llmt_plan_fit_backend(-1, 1, &pc, 1 << 30, &b, &r), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "backend = -1");
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, &pc, 1000, &b, &r), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "llmt_plan_fit_backend: nothing fits 1000 bytes");
    assert_int_equal(llmt_plan_fit(NULL, &pc, 1000, &b, &r), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "llmt_plan_fit: ctx is NULL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_equals_context),
        cmocka_unit_test(test_cuda_without_device),
        cmocka_unit_test(test_invalid_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
