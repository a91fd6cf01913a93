/* Philox4x32-10 streams: Random123's known answers, exact save and restore,
 * stream independence, and the distributions' moments. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "core/rng.h"

static void test_known_answers(void **state)
{
    (void)state;
    /* Random123 tests/kat_vectors for philox4x32_10. */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                       {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffff, 0xffffffff}, {0xa4093822, 0x299f31d0}};
    static const uint32_t expect[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                          {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                          {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        llmt_philox4x32_10(ctr[i], key[i], out);
        for (int j = 0; j < 4; j++)
            assert_int_equal(out[j], expect[i][j]);
    }
    /* Value i of stream (seed, stream) is lane i % 4 of block i / 4. */
    uint32_t block[4];
    const uint32_t c[4] = {5, 0, 3, 0}, k[2] = {0x1234, 0};
    llmt_philox4x32_10(c, k, block);
    for (int lane = 0; lane < 4; lane++)
        assert_int_equal(llmt_rng_u32_at(0x1234, 3, 5 * 4 + (uint64_t)lane), block[lane]);
}

static void test_save_restore_context(void **state)
{
    (void)state;
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.seed = 1234;
    llmt_context *ctx = NULL;
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_OK);
    float warm[7], first[100], again[100];
    assert_int_equal(llmt_context_rng_uniform(ctx, warm, 7), LLMT_OK);
    llmt_rng_state saved;
    assert_int_equal(llmt_context_rng_get(ctx, &saved), LLMT_OK);
    assert_int_equal(saved.seed, 1234);
    assert_int_equal(saved.offset, 7);
    assert_int_equal(llmt_context_rng_uniform(ctx, first, 100), LLMT_OK);
    assert_int_equal(llmt_context_rng_uniform(ctx, again, 100), LLMT_OK);
    assert_memory_not_equal(first, again, sizeof first);
    assert_int_equal(llmt_context_rng_set(ctx, &saved), LLMT_OK);
    assert_int_equal(llmt_context_rng_uniform(ctx, again, 100), LLMT_OK);
    assert_memory_equal(first, again, sizeof first);
    llmt_context_free(ctx);

    /* A second context with the same seed draws the same numbers. */
    assert_int_equal(llmt_context_create(&ctx, &cfg), LLMT_OK);
    assert_int_equal(llmt_context_rng_set(ctx, &saved), LLMT_OK);
    assert_int_equal(llmt_context_rng_uniform(ctx, again, 100), LLMT_OK);
    assert_memory_equal(first, again, sizeof first);
    llmt_context_free(ctx);
}

static void test_save_restore_internal(void **state)
{
    (void)state;
    llmt_rng_state s = {42, LLMT_STREAM_DATA, 0};
    float normals[9];
    llmt_rng_fill_normal(&s, normals, 9, 0.0f, 1.0f);
    assert_int_equal(s.offset, 10); /* 2 * ceil(9 / 2) */
    llmt_rng_state saved = s;
    uint64_t a[50], b[50];
    for (int i = 0; i < 50; i++)
        a[i] = llmt_rng_next_below(&s, 1000 + (uint64_t)i);
    s = saved;
    for (int i = 0; i < 50; i++)
        b[i] = llmt_rng_next_below(&s, 1000 + (uint64_t)i);
    assert_memory_equal(a, b, sizeof a);
    /* Sequential draws equal the random-access function. */
    s = saved;
    for (uint64_t i = 0; i < 20; i++)
        assert_int_equal(llmt_rng_next_u32(&s), llmt_rng_u32_at(42, LLMT_STREAM_DATA, 10 + i));
}

static void test_streams_differ(void **state)
{
    (void)state;
    int same = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        same += llmt_rng_u32_at(7, 1, i) == llmt_rng_u32_at(7, 2, i);
        same += llmt_rng_u32_at(7, 1, i) == llmt_rng_u32_at(8, 1, i);
    }
    assert_true(same <= 1); /* equal 32-bit values by chance: about 2000 / 2^32 */
}

static void test_distributions(void **state)
{
    (void)state;
    enum { N = 200000 };
    static float u[N], z[N];
    llmt_rng_state s = {99, LLMT_STREAM_INIT, 0};
    llmt_rng_fill_uniform(&s, u, N);
    llmt_rng_fill_normal(&s, z, N, 1.5f, 0.02f);
    double su = 0, su2 = 0, sz = 0, sz2 = 0;
    for (int i = 0; i < N; i++) {
        assert_true(u[i] >= 0.0f && u[i] < 1.0f);
        su += u[i];
        su2 += (double)u[i] * u[i];
        sz += z[i];
        sz2 += (double)z[i] * z[i];
    }
    double mu = su / N, vu = su2 / N - mu * mu;
    double mz = sz / N, sdz = sqrt(sz2 / N - mz * mz);
    /* Tolerances are about 5 standard errors of each estimate. */
    assert_true(fabs(mu - 0.5) < 5 * sqrt(1.0 / 12 / N));
    assert_true(fabs(vu - 1.0 / 12) < 0.002);
    assert_true(fabs(mz - 1.5) < 5 * 0.02 / sqrt(N));
    assert_true(fabs(sdz - 0.02) < 0.02 * 0.01);

    /* next_below: every value of a small range appears about equally often. */
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++) {
        uint64_t v = llmt_rng_next_below(&s, 7);
        assert_true(v < 7);
        counts[v]++;
    }
    for (int i = 0; i < 7; i++)
        assert_true(abs(counts[i] - 10000) < 500);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers),
        cmocka_unit_test(test_save_restore_context),
        cmocka_unit_test(test_save_restore_internal),
        cmocka_unit_test(test_streams_differ),
        cmocka_unit_test(test_distributions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
