/* llmt_context: lifecycle, argument checks, per-category accounting, peaks,
 * the budget and its message, thread-local errors. */
#include <pthread.h>
#include <stdio.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "core/buffer.h"

static llmt_context *make_ctx(uint64_t budget)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.memory_budget = budget;
    cfg.num_threads = 1;
    llmt_context *ctx = NULL;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_OK);
    assert_non_null(ctx);
    return ctx;
}

static llmt_memory_stats stats_of(llmt_context *ctx)
{
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    return s;
}

static void test_lifecycle(void **state)
{
    (void)state;
    llmt_context_config cfg;
    llmt_context_config_init(&cfg);
    assert_int_equal(cfg.version, LLMT_CONTEXT_CONFIG_VERSION);
    assert_int_equal(cfg.backend, LLMT_BACKEND_CPU);
    llmt_context *ctx = NULL;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_OK);
    assert_int_equal(llmt_context_backend(ctx), LLMT_BACKEND_CPU);
    assert_true(llmt_context_num_threads(ctx) >= 1);
    llmt_memory_stats s = stats_of(ctx);
    assert_int_equal(s.category_count, LLMT_MEM_CATEGORY_COUNT);
    assert_int_equal(s.total_current, 0);
    assert_int_equal(s.budget, 0);
    assert_true(s.device_total > 0); /* the host's RAM on the CPU backend */
    llmt_context_free(ctx);
    llmt_context_free(NULL);
    assert_int_equal(llmt_context_backend(NULL), -1);
    assert_int_equal(llmt_context_num_threads(NULL), -1);

    cfg.num_threads = 3;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_OK);
    assert_int_equal(llmt_context_num_threads(ctx), 3);
    llmt_context_free(ctx);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *ctx = (llmt_context *)&cfg; /* must be reset to NULL on failure */

    assert_int_equal(llmt_context_create(NULL, &cfg), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "out is NULL");
    /* cfg NULL means the defaults: tests/unit/test_api_defaults.c. */

    cfg.version = 99;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_EVERSION);
    assert_contains(llmt_error_last(), "cfg->version = 99");
    cfg.version = LLMT_CONTEXT_CONFIG_VERSION;

    cfg.backend = 7;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->backend = 7");
    cfg.backend = LLMT_BACKEND_CPU;

    cfg.num_threads = -2;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->num_threads = -2");
    cfg.num_threads = 0;

    cfg.device = 1;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->device = 1");
    assert_null(ctx);

    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(NULL, &s), LLMT_EINVAL);
    ctx = make_ctx(0);
    assert_int_equal(llmt_context_memory_stats(ctx, NULL), LLMT_EINVAL);
    s.version = 0;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_EVERSION);
    assert_int_equal(llmt_context_reset_peak(NULL), LLMT_EINVAL);
    assert_int_equal(llmt_context_set_budget(NULL, 5), LLMT_EINVAL);
    assert_int_equal(llmt_context_rng_get(ctx, NULL), LLMT_EINVAL);
    assert_int_equal(llmt_context_rng_set(NULL, NULL), LLMT_EINVAL);
    assert_int_equal(llmt_context_rng_uniform(ctx, NULL, 3), LLMT_EINVAL);
    llmt_context_free(ctx);
}

static void test_cuda_request(void **state)
{
    (void)state;
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    llmt_context *ctx = NULL;
    int rc = llmt_context_create(&ctx, &cfg);
#ifdef LLMT_TEST_HAVE_CUDA_PLUGIN
    /* With the plugin built: a GPU machine opens device 0; one without a GPU
     * or driver gets LLMT_ECUDA with the runtime's reason. */
    if (rc == LLMT_OK) {
        assert_int_equal(llmt_context_backend(ctx), LLMT_BACKEND_CUDA);
        llmt_context_free(ctx);
    } else {
        assert_int_equal(rc, LLMT_ECUDA);
        assert_contains(llmt_error_last(), "CUDA");
        assert_null(ctx);
    }
#else
    assert_int_equal(rc, LLMT_EUNSUPPORTED);
    assert_contains(llmt_error_last(), "no CUDA backend");
    assert_null(ctx);
#endif
}

static void test_accounting_exact(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx(0);
    llmt_buf bufs[LLMT_MEM_CATEGORY_COUNT][3];
    uint64_t expect[LLMT_MEM_CATEGORY_COUNT] = {0};
    uint64_t total = 0;
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++) {
        for (int i = 0; i < 3; i++) {
            size_t bytes = 1000 * (size_t)(c + 1) + 7 * (size_t)i + 1; /* odd sizes */
            assert_int_equal(llmt_buf_alloc(ctx, &bufs[c][i], c, bytes, "test"), LLMT_OK);
            assert_non_null(bufs[c][i].ptr);
            memset(bufs[c][i].ptr, 0xab, bytes); /* the memory is really there */
            expect[c] += bytes;
            if (c != LLMT_MEM_HOST_STATE) /* it has its own budget */
                total += bytes;
        }
    }
    llmt_memory_stats s = stats_of(ctx);
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++) {
        assert_int_equal(s.current[c], expect[c]);
        assert_int_equal(s.peak[c], expect[c]);
    }
    assert_int_equal(s.total_current, total);
    assert_int_equal(s.total_peak, total);

    /* Free the middle buffer of each category: current drops, peak stays. */
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++) {
        size_t bytes = bufs[c][1].bytes;
        llmt_buf_free(ctx, &bufs[c][1]);
        assert_null(bufs[c][1].ptr);
        s = stats_of(ctx);
        assert_int_equal(s.current[c], expect[c] - bytes);
        assert_int_equal(s.peak[c], expect[c]);
        expect[c] -= bytes;
        if (c != LLMT_MEM_HOST_STATE)
            total -= bytes;
    }
    assert_int_equal(stats_of(ctx).total_current, total);

    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++) {
        llmt_buf_free(ctx, &bufs[c][0]);
        llmt_buf_free(ctx, &bufs[c][2]);
    }
    s = stats_of(ctx);
    assert_int_equal(s.total_current, 0);
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++)
        assert_int_equal(s.current[c], 0);

    /* A zero-byte buffer costs nothing; an unknown category is refused. */
    llmt_buf z;
    assert_int_equal(llmt_buf_alloc(ctx, &z, LLMT_MEM_PARAMS, 0, "empty"), LLMT_OK);
    assert_null(z.ptr);
    llmt_buf_free(ctx, &z);
    assert_int_equal(llmt_buf_alloc(ctx, &z, LLMT_MEM_CATEGORY_COUNT, 8, "bad"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "unknown memory category");
    llmt_context_free(ctx);
}

static void test_peak_tracking(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx(0);
    llmt_buf a, b, c;
    assert_int_equal(llmt_buf_alloc(ctx, &a, LLMT_MEM_ACTIVATIONS, 100, "a"), LLMT_OK);
    assert_int_equal(llmt_buf_alloc(ctx, &b, LLMT_MEM_ACTIVATIONS, 50, "b"), LLMT_OK);
    llmt_buf_free(ctx, &a);
    assert_int_equal(llmt_buf_alloc(ctx, &c, LLMT_MEM_WORKSPACE, 30, "c"), LLMT_OK);
    llmt_memory_stats s = stats_of(ctx);
    assert_int_equal(s.peak[LLMT_MEM_ACTIVATIONS], 150);
    assert_int_equal(s.current[LLMT_MEM_ACTIVATIONS], 50);
    assert_int_equal(s.peak[LLMT_MEM_WORKSPACE], 30);
    assert_int_equal(s.total_peak, 150); /* 100 + 50 at once, not 150 + 30 */
    assert_int_equal(s.total_current, 80);

    assert_int_equal(llmt_context_reset_peak(ctx), LLMT_OK);
    s = stats_of(ctx);
    assert_int_equal(s.peak[LLMT_MEM_ACTIVATIONS], 50);
    assert_int_equal(s.total_peak, 80);
    llmt_buf_free(ctx, &b);
    llmt_buf_free(ctx, &c);
    llmt_context_free(ctx);
}

static void test_budget(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx(1000);
    llmt_buf p, a, w, x;
    assert_int_equal(llmt_buf_alloc(ctx, &p, LLMT_MEM_PARAMS, 600, "weights"), LLMT_OK);
    assert_int_equal(llmt_buf_alloc(ctx, &a, LLMT_MEM_ACTIVATIONS, 500, "layers.0.x"),
                     LLMT_ENOMEM);
    const char *msg = llmt_error_last();
    assert_contains(msg, "500 bytes");
    assert_contains(msg, "activations");
    assert_contains(msg, "layers.0.x");
    assert_contains(msg, "budget 1000");
    assert_contains(msg, "600 in use");
    assert_contains(msg, "params 600");
    assert_null(a.ptr);
    llmt_memory_stats s = stats_of(ctx);
    assert_int_equal(s.total_current, 600); /* the refusal charged nothing */
    assert_int_equal(s.current[LLMT_MEM_ACTIVATIONS], 0);
    assert_int_equal(s.budget, 1000);

    /* Exactly reaching the budget is allowed, one byte more is not. */
    assert_int_equal(llmt_buf_alloc(ctx, &w, LLMT_MEM_WORKSPACE, 400, "scratch"), LLMT_OK);
    assert_int_equal(llmt_buf_alloc(ctx, &x, LLMT_MEM_STAGING, 1, "one"), LLMT_ENOMEM);
    /* A request larger than the whole budget does not wrap around. */
    assert_int_equal(llmt_buf_alloc(ctx, &x, LLMT_MEM_STAGING, SIZE_MAX, "huge"), LLMT_ENOMEM);

    /* The budget cannot go below what is in use; it can be lifted. */
    assert_int_equal(llmt_context_set_budget(ctx, 999), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "below the 1000 in use");
    assert_int_equal(llmt_context_set_budget(ctx, 0), LLMT_OK);
    assert_int_equal(llmt_buf_alloc(ctx, &x, LLMT_MEM_STAGING, 1, "one"), LLMT_OK);
    llmt_buf_free(ctx, &x);
    llmt_buf_free(ctx, &p);
    llmt_buf_free(ctx, &w);
    llmt_context_free(ctx);
}

static void *fail_in_thread(void *arg)
{
    (void)arg;
    llmt_context_create(NULL, NULL);
    return strstr(llmt_error_last(), "out is NULL") ? (void *)1 : NULL;
}

static void test_errors_are_thread_local(void **state)
{
    (void)state;
    llmt_error_clear();
    assert_string_equal(llmt_error_last(), "");
    pthread_t t;
    void *seen = NULL;
    assert_int_equal(pthread_create(&t, NULL, fail_in_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &seen), 0);
    assert_non_null(seen);                        /* the thread saw its own message */
    assert_string_equal(llmt_error_last(), "");   /* and this thread's stayed empty */
}

/* llmt_error_set: the message as given (truncated to the capacity), NULL clears. */
static void test_error_set(void **state)
{
    (void)state;
    assert_int_equal(llmt_error_set(LLMT_ECOMM, "adapter: no peer"), LLMT_ECOMM);
    assert_string_equal(llmt_error_last(), "adapter: no peer");
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(llmt_error_set(LLMT_EINVAL, big), LLMT_EINVAL);
    assert_int_equal(strlen(llmt_error_last()), 4095);
    assert_int_equal(llmt_error_set(LLMT_OK, NULL), LLMT_OK);
    assert_string_equal(llmt_error_last(), "");
}

static void test_status_strings(void **state)
{
    (void)state;
    const int codes[] = {LLMT_OK,           LLMT_EINVAL, LLMT_ENOMEM, LLMT_EIO,
                         LLMT_ECORRUPT,     LLMT_EVERSION, LLMT_EUNSUPPORTED, LLMT_ECUDA,
                         LLMT_ESTATE,       LLMT_ENOTFOUND};
    const size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        const char *s = llmt_status_string(codes[i]);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown status");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, llmt_status_string(codes[j]));
    }
    assert_string_equal(llmt_status_string(-1000), "unknown status");
    assert_string_equal(llmt_mem_category_name(LLMT_MEM_OPTIMIZER), "optimizer");
    assert_string_equal(llmt_mem_category_name(42), "?");
    assert_int_equal(llmt_dtype_size(LLMT_DTYPE_BF16), 2);
    assert_int_equal(llmt_dtype_size(99), 0);
    assert_string_equal(llmt_dtype_name(LLMT_DTYPE_F16), "F16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_cuda_request),
        cmocka_unit_test(test_accounting_exact),
        cmocka_unit_test(test_peak_tracking),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_errors_are_thread_local),
        cmocka_unit_test(test_error_set),
        cmocka_unit_test(test_status_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
