/* Op test of grad_stats_blocks (used by test_ops.c): per block, the sum of
 * squares of factor * g against a double reference written from
 * lib/ops/ops.h's definition, the non-finite count exactly, and the
 * partials of the whole buffer equal bit for bit to those of two calls over
 * its halves split at a block boundary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

/* factor is not a power of two, so factor * g rounds in fp32 (as the op's
 * definition says it does) before it is squared. */
static const float gb_factor = 0.3f;

/* One case: n elements in blocks of `block`, split into two calls at block
 * split_block, with inf, -inf and NaN planted at the given elements. */
typedef struct gb_case {
    const char *name;
    int dt;
    int64_t n, block, split_block;
    int64_t plant[3];
} gb_case;

/* The sum of (double)(factor g)^2 over block b, in element order. */
static double gb_ref(const float *g, int64_t n, int64_t block, int64_t b)
{
    double s = 0.0;
    for (int64_t i = b * block; i < n && i < (b + 1) * block; i++) {
        const float x = g[i] * gb_factor;
        s += (double)x * (double)x;
    }
    return s;
}

/* partials (blocks of them, host) and the non-finite count of g[0, n). */
static int64_t gb_run(backend *b, const void *g, int64_t n, int dt, int64_t block,
                      double *partials, void *scratch)
{
    int64_t bad = -1;
    OK(b->ops->grad_stats_blocks(b->dev, g, n, dt, gb_factor, block, partials, &bad, scratch));
    return bad;
}

static void gb_check(backend *b, const gb_case *c, double tol)
{
    const int64_t blocks = (c->n + c->block - 1) / c->block, es = (int64_t)llmt_dtype_size(c->dt);
    uint64_t s = 11;
    float *g = randn(&s, c->n, 0.01, c->dt);
    const float planted[3] = {INFINITY, -INFINITY, NAN};
    for (int k = 0; k < 3; k++)
        g[c->plant[k]] = planted[k];
    void *dg = dput(b, g, c->n, c->dt);
    void *scratch = dalloc(b, b->ops->optim_scratch_bytes);
    /* One extra slot each, poisoned: nothing may be written past the last block. */
    double *whole = malloc((size_t)(blocks + 1) * sizeof *whole);
    double *split = malloc((size_t)(blocks + 1) * sizeof *split);
    memset(whole, 0xFF, (size_t)(blocks + 1) * sizeof *whole);
    memset(split, 0xFF, (size_t)(blocks + 1) * sizeof *split);

    const int64_t bad = gb_run(b, dg, c->n, c->dt, c->block, whole, scratch);
    const int64_t at = c->split_block * c->block;
    const int64_t bad_split =
        gb_run(b, dg, at, c->dt, c->block, split, scratch) +
        gb_run(b, (const char *)dg + at * es, c->n - at, c->dt, c->block, split + c->split_block,
               scratch);
    assert_int_equal(bad, 3);
    assert_int_equal(bad_split, 3);
    assert_memory_equal(whole, split, (size_t)(blocks + 1) * sizeof *whole);
    const unsigned char *past = (const unsigned char *)&whole[blocks];
    for (size_t k = 0; k < sizeof *whole; k++)
        assert_int_equal(past[k], 0xFF);
    double worst = 0.0;
    for (int64_t i = 0; i < blocks; i++) {
        int planted_here = 0;
        for (int k = 0; k < 3; k++)
            planted_here |= c->plant[k] / c->block == i;
        if (planted_here) {
            if (isfinite(whole[i]))
                fail_msg("%s %s: block %lld holds inf or NaN, partial %g", b->name, c->name,
                         (long long)i, whole[i]);
            continue;
        }
        const double want = gb_ref(g, c->n, c->block, i);
        const double err = fabs(whole[i] - want) / want;
        worst = err > worst ? err : worst;
        if (!(err <= tol))
            fail_msg("%s %s: block %lld partial %.17g, reference %.17g (relative %.3g > %.3g)",
                     b->name, c->name, (long long)i, whole[i], want, err, tol);
    }
    print_message("grad_stats_blocks %s %s: %lld blocks, worst relative error %.3g\n", b->name,
                  c->name, (long long)blocks, worst);
    free(whole);
    free(split);
    dfree(b, scratch);
    dfree(b, dg);
    free(g);
}

void check_grad_stats_blocks(backend *b, double tol)
{
    if (!b->ops->grad_stats_blocks)
        fail_msg("the %s backend has no grad_stats_blocks", b->name);
    enum { G = 4096 }; /* LLMT_SHARD_GRANULE */
    /* Granules of 4096 with a short last one, split after two: every dtype. */
    const gb_case granules[] = {
        {"F32", LLMT_DTYPE_F32, 3 * G + 1000, G, 2, {5, 2 * G + 77, 3 * G + 999}},
        {"BF16", LLMT_DTYPE_BF16, 3 * G + 1000, G, 2, {5, 2 * G + 77, 3 * G + 999}},
        {"F16", LLMT_DTYPE_F16, 3 * G + 1000, G, 2, {5, 2 * G + 77, 3 * G + 999}},
    };
    for (size_t i = 0; i < sizeof granules / sizeof *granules; i++)
        gb_check(b, &granules[i], tol);
    /* More blocks than CUDA's launch of 4096 holds: blocks 4096.. of the
     * whole buffer are in its second launch but in the first launch of the
     * second half; non-finite values in both launches. */
    const gb_case launches = {"F32 4102 blocks of 16", LLMT_DTYPE_F32, 4101 * 16 + 3, 16, 1000,
                              {100, 4097 * 16 + 1, 4101 * 16 + 2}};
    gb_check(b, &launches, tol);
}

/* The CUDA backend refuses what it cannot use, naming it. */
void check_grad_stats_blocks_args(backend *b)
{
    void *g = dalloc(b, 64), *scratch = dalloc(b, b->ops->optim_scratch_bytes);
    double partials[2];
    int64_t bad = 0;
    assert_int_equal(b->ops->grad_stats_blocks(b->dev, g, 16, LLMT_DTYPE_F32, 1.0f, 8, partials,
                                               &bad, NULL),
                     LLMT_EINVAL);
    assert_non_null(strstr(llmt_error_last(), "scratch is NULL"));
    assert_int_equal(b->ops->grad_stats_blocks(b->dev, g, 16, LLMT_DTYPE_F32, 1.0f, 0, partials,
                                               &bad, scratch),
                     LLMT_EINVAL);
    assert_non_null(strstr(llmt_error_last(), "block is not positive"));
    /* Nothing to sum: no partial, no count, no launch. */
    bad = -1;
    OK(b->ops->grad_stats_blocks(b->dev, g, 0, LLMT_DTYPE_F32, 1.0f, 8, partials, &bad, scratch));
    assert_int_equal(bad, 0);
    dfree(b, scratch);
    dfree(b, g);
}
