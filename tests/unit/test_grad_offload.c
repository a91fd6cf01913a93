/* Gradient offload, the model side (issue 15, stage 2): with the gradients
 * of a prefix placed in host memory (llmt_grads_place) and written through
 * one device bucket, backward gives bitwise the gradients of a model without
 * offload, in every precision, tied or not; the accounting holds exactly the
 * two segments and the bucket; zeroing, reading and writing work across the
 * split; placements move values and refusals change nothing; the ordered
 * slicer sums across the split to the same bits; a bucket sent from its
 * slot reads as zero and holds its slot until the engine is joined; the
 * host copy kept on demand grows only as the stores need it. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "core/half.h"
#include "llmt/llmt.h"
#include "dist/shard.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "optim/offload.h"
#include "test_batch.h"
#include "test_context.h"

/* Dimensions that put several granules (4096 elements) in each bucket. */
enum { VOCAB = 256, D = 64, LAYERS = 3, HEADS = 4, KV = 2, FFN = 128, T = 8 };
/* Global batch of three micro-batches. */
enum { B = 3, MICRO = 1 };
enum { GRANULE = 4096 };

static const int precisions[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                                  LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};
/* Offloaded prefixes (optimizer offload's `layers`): the embedding and layer
 * 0, and layer 1; everything. */
static const int32_t prefixes[3] = {1, 2, LLMT_OFFLOAD_ALL_LAYERS};

static llmt_model_config model_config(int precision, int tied)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = VOCAB;
    c.hidden_size = D;
    c.num_layers = LAYERS;
    c.num_heads = HEADS;
    c.num_kv_heads = KV;
    c.ffn_size = FFN;
    c.max_seq_len = T;
    c.precision = precision;
    c.tie_embeddings = tied;
    return c;
}

/* Bytes of an element of the gradients in a precision. */
static size_t elem_size(int precision)
{
    return precision == LLMT_PRECISION_FP32 ? 4 : 2;
}

/* The bucket sizes from the configuration alone: the embedding, one
 * layer (two norms, q k v o, gate up down), the tail (final norm and the
 * LM head when untied). */
static int64_t embed_elems(void)
{
    return (int64_t)VOCAB * D;
}

static int64_t layer_elems(void)
{
    int64_t hd = D / HEADS;
    return 2 * D + (int64_t)(HEADS + 2 * KV) * hd * D + (int64_t)D * HEADS * hd +
           3 * (int64_t)FFN * D;
}

static int64_t tail_elems(int tied)
{
    return D + (tied ? 0 : embed_elems());
}

static int64_t total_elems(int tied)
{
    return embed_elems() + LAYERS * layer_elems() + tail_elems(tied);
}

/* The largest bucket starting below split (the CPU reads host memory, so
 * no norm chunk enters). */
static int64_t expected_bucket(int tied, int64_t split)
{
    int64_t most = 0, start = 0;
    for (int b = 0; b < LAYERS + 2; b++) {
        int64_t n = b == 0 ? embed_elems() : b <= LAYERS ? layer_elems() : tail_elems(tied);
        if (start < split && n > most)
            most = n;
        start += n;
    }
    return most;
}

static llmt_model *model_new(llmt_context *ctx, int precision, int tied)
{
    llmt_model_config c = model_config(precision, tied);
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_model_num_params(m), total_elems(tied));
    return m;
}

/* The gradient split of optimizer offload's prefix `layers`. */
static int64_t split_of(const llmt_model *m, int32_t layers)
{
    int64_t p = llmt_offload_prefix(m, LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS, layers);
    return p / GRANULE * GRANULE;
}

/* Every gradient tensor in parameter order, as fp32 (malloc'ed). */
static float *all_grads(const llmt_model *m)
{
    float *g = malloc((size_t)llmt_model_num_params(m) * sizeof *g), *at = g;
    assert_non_null(g);
    for (int32_t t = 0; t < llmt_model_num_tensors(m); t++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, t, &info), LLMT_OK);
        assert_int_equal(llmt_model_get_grad(m, info.name, at, (size_t)info.numel), LLMT_OK);
        at += info.numel;
    }
    return g;
}

/* Fails unless a and b hold the same gradient bits, naming the first tensor
 * that differs. */
static void assert_same_grads(const llmt_model *a, const llmt_model *b, const char *what)
{
    float *ga = all_grads(a), *gb = all_grads(b);
    int64_t at = 0;
    for (int32_t t = 0; t < llmt_model_num_tensors(a); t++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(a, t, &info), LLMT_OK);
        if (memcmp(ga + at, gb + at, (size_t)info.numel * sizeof *ga))
            fail_msg("%s: the gradient of %s differs", what, info.name);
        at += info.numel;
    }
    free(ga);
    free(gb);
}

/* Fails unless every gradient of m is zero (want_zero) or each tensor has a
 * nonzero one. */
static void assert_grads_zero(const llmt_model *m, int want_zero, const char *what)
{
    float *g = all_grads(m);
    int64_t at = 0;
    for (int32_t t = 0; t < llmt_model_num_tensors(m); t++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, t, &info), LLMT_OK);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < info.numel; i++)
            nonzero += g[at + i] != 0.0f;
        if (want_zero ? nonzero != 0 : nonzero == 0)
            fail_msg("%s: %s has %lld nonzero gradients", what, info.name, (long long)nonzero);
        at += info.numel;
    }
    free(g);
}

static llmt_memory_stats stats_of(const llmt_context *ctx)
{
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    return s;
}

/* GRADS and HOST_STATE of a context holding only model m placed at split. */
static void assert_accounting(const llmt_context *ctx, int precision, int tied, int64_t split)
{
    llmt_memory_stats s = stats_of(ctx);
    uint64_t es = elem_size(precision);
    assert_int_equal(s.current[LLMT_MEM_GRADS],
                     (uint64_t)(total_elems(tied) - split) * es +
                         (uint64_t)expected_bucket(tied, split) * es);
    assert_int_equal(s.current[LLMT_MEM_HOST_STATE], (uint64_t)split * es);
}

/* One global batch of step `step` through slicer sl (in place). */
static void slice_batch(llmt_slicer *sl, int step)
{
    int32_t tokens[B * T], targets[B * T];
    test_learnable_batch(step, B, T, VOCAB, tokens, targets);
    double loss = 0.0;
    assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, &loss), LLMT_OK);
}

/* For each precision, tied and untied, and each prefix: a model whose
 * gradients are offloaded gets bitwise the gradients of one that keeps them
 * on the device, on top of the placement's values, after zeroing, and
 * accumulated over two global batches; the accounting is exact. */
static void test_offloaded_backward_is_bitwise(void **state)
{
    (void)state;
    for (int p = 0; p < 4; p++)
        for (int tied = 0; tied < 2; tied++)
            for (int k = 0; k < 3; k++) {
                llmt_context *ref_ctx = test_context(2, 7), *ctx = test_context(2, 7);
                llmt_model *ref = model_new(ref_ctx, precisions[p], tied);
                llmt_model *m = model_new(ctx, precisions[p], tied);
                int64_t split = split_of(m, prefixes[k]);
                assert_true(split >= GRANULE && split < total_elems(tied));
                assert_int_equal(llmt_grads_place(m, split), LLMT_OK);
                assert_int_equal(m->grad_split, split);
                /* Allocated at their first use, where placed: none yet. */
                assert_int_equal(stats_of(ctx).current[LLMT_MEM_GRADS], 0);
                assert_int_equal(stats_of(ctx).current[LLMT_MEM_HOST_STATE], 0);
                llmt_slicer *rs = NULL, *s = NULL;
                assert_int_equal(llmt_slicer_create(&rs, ref, MICRO), LLMT_OK);
                assert_int_equal(llmt_slicer_create(&s, m, MICRO), LLMT_OK);
                char what[96];
                snprintf(what, sizeof what, "precision %d, tied %d, layers %d", precisions[p],
                         tied, prefixes[k]);
                /* Onto the placed (zero) values, then zeroed, then twice. */
                for (int round = 0; round < 3; round++) {
                    if (round == 1) {
                        assert_int_equal(llmt_model_zero_grads(ref), LLMT_OK);
                        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
                    }
                    slice_batch(rs, round);
                    slice_batch(s, round);
                    assert_int_equal(m->loaded, -1); /* no bucket held between calls */
                    assert_same_grads(ref, m, what);
                }
                assert_grads_zero(m, 0, what);
                assert_accounting(ctx, precisions[p], tied, split);
                llmt_slicer_free(rs);
                llmt_slicer_free(s);
                llmt_model_free(ref);
                llmt_model_free(m);
                llmt_context_free(ref_ctx);
                llmt_context_free(ctx);
            }
}

/* Adds the gradients of global batch `step` to m's (in place). */
static void train_once(llmt_model *m, int step)
{
    llmt_slicer *s = NULL;
    assert_int_equal(llmt_slicer_create(&s, m, MICRO), LLMT_OK);
    slice_batch(s, step);
    llmt_slicer_free(s);
}

/* A model of precision p at the split of prefix layers, with a global
 * batch's gradients in it. */
static llmt_model *trained_model(llmt_context *ctx, int precision, int tied, int32_t layers)
{
    llmt_model *m = model_new(ctx, precision, tied);
    assert_int_equal(llmt_grads_place(m, split_of(m, layers)), LLMT_OK);
    train_once(m, 3);
    return m;
}

/* Zeroing reaches the host segment too: the stale host bytes never show,
 * neither through get_grad nor after a move to another placement. */
static void test_zero_grads_across_the_split(void **state)
{
    (void)state;
    for (int tied = 0; tied < 2; tied++) {
        llmt_context *ctx = test_context(2, 3);
        llmt_model *m = trained_model(ctx, LLMT_PRECISION_BF16_MIXED, tied, 2);
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_grads_zero(m, 1, "zeroed");
        train_once(m, 4);
        assert_grads_zero(m, 0, "trained");
        /* Zeroed, then moved while no host part holds a value. */
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_grads_place(m, split_of(m, 1)), LLMT_OK);
        assert_grads_zero(m, 1, "zeroed, then moved");
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
}

/* The value written at flat element i: exact in every dtype. */
static float pattern(int64_t i)
{
    return (float)(i % 97 - 48) / 16.0f;
}

/* A bucket sent from its slot by an overlapped exchange (llmt_grads_sent),
 * on the CPU (one slot): only the loaded bucket may be; afterwards its
 * host part reads as zero and its straddling part past the split holds
 * what the slot held (written there after the load), every other bucket
 * its values; and a load into its slot is refused, naming the queued
 * exchange, until llmt_grads_sent_joined. */
static void test_sent_bucket_and_its_slot(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_model *m = model_new(ctx, LLMT_PRECISION_FP32, 0);
    const int64_t split = split_of(m, 1), n = llmt_model_num_params(m);
    assert_int_equal(llmt_grads_place(m, split), LLMT_OK);
    float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    for (int64_t i = 0; i < n; i++)
        want[i] = pattern(i) + 0.5f; /* no zero */
    assert_int_equal(llmt_grads_io(m, 0, n, want, 1), LLMT_OK);
    int64_t s = 0, e = 0;
    llmt_grad_bucket_range(m, 1, &s, &e); /* layer 0: across the split */
    assert_true(s < split && split < e);
    char *base = NULL;
    assert_int_equal(llmt_grads_acquire(m, 1, &base), LLMT_OK);
    /* The straddling tail as backward would leave it in the slot (host
     * memory on the CPU): these values, not the loaded ones, must reach the
     * device segment. */
    for (int64_t i = split; i < e; i++) {
        want[i] = -pattern(i) - 0.25f;
        memcpy(base + (size_t)(i - s) * sizeof(float), &want[i], sizeof(float));
    }
    assert_int_equal(llmt_grads_sent(m, 2), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "bucket 2 was sent from its slot, but bucket 1 is loaded");
    assert_int_equal(llmt_grads_sent(m, 1), LLMT_OK);
    assert_int_equal(llmt_grads_acquire(m, 0, &base), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "gradient bucket 0: its slot is still read by a queued "
                                       "exchange");
    llmt_grads_sent_joined(m);
    assert_int_equal(llmt_grads_io(m, 0, n, got, 0), LLMT_OK);
    for (int64_t i = 0; i < n; i++) {
        float expect = i >= s && i < split ? 0.0f : want[i];
        if (got[i] != expect)
            fail_msg("element %lld: %g, not %g (bucket 1 is [%lld, %lld), split %lld)",
                     (long long)i, got[i], expect, (long long)s, (long long)e, (long long)split);
    }
    assert_int_equal(llmt_grads_acquire(m, 0, &base), LLMT_OK);
    free(want);
    free(got);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Writes pattern(i) + 0.5 (no zero) into bucket b through its slot, and
 * into want; stores it (the flush). */
static void write_bucket(llmt_model *m, int32_t b, float *want)
{
    int64_t s = 0, e = 0;
    llmt_grad_bucket_range(m, b, &s, &e);
    char *base = NULL;
    assert_int_equal(llmt_grads_acquire(m, b, &base), LLMT_OK);
    for (int64_t i = s; i < e; i++) {
        want[i] = pattern(i) + 0.5f;
        memcpy(base + (size_t)(i - s) * sizeof(float), &want[i], sizeof(float));
    }
    assert_int_equal(llmt_grads_flush(m), LLMT_OK);
}

/* Fails unless the host copy has room for `elems` gradients (fp32), all of
 * the context's HOST_STATE. */
static void assert_home(const llmt_context *ctx, const llmt_model *m, int64_t elems,
                        const char *what)
{
    if (m->host_grads.bytes != (size_t)elems * 4 ||
        stats_of(ctx).current[LLMT_MEM_HOST_STATE] != (uint64_t)elems * 4)
        fail_msg("%s: the host copy holds %zu bytes (HOST_STATE %llu), not %lld", what,
                 m->host_grads.bytes,
                 (unsigned long long)stats_of(ctx).current[LLMT_MEM_HOST_STATE],
                 (long long)elems * 4);
}

/* Fails unless got holds want's n values, naming the first that differs. */
static void assert_values(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("%s: element %lld: %g, not %g", what, (long long)i, got[i], want[i]);
}

/* The host copy kept on demand (llmt_grads_home_on_demand, as a
 * data-parallel step that sends the offloaded buckets from their slots
 * keeps it), untied and tied: allocated with room for what a step keeps
 * (none, or the tied embedding's bucket); a store makes room
 * up to the end of the stored bucket's host part and no further, a read
 * none (what lies past the room reads as zero), a write and a move to a
 * larger split of values room for all (zeros filled in past the old
 * room), a move to a smaller split keeps the room within it; every value
 * written survives (read back against what was written, also a write
 * right after a zeroing, then moved); zeroing brings the room back to a
 * step's (none, or the tied embedding's bucket), and zero gradients move
 * with no copy and no more room (to a split inside the embedding's bucket,
 * the room of its part before the split). */
static void test_home_on_demand(void **state)
{
    (void)state;
#ifdef M_PERTURB
    /* Fresh allocations hold no zeros (glibc's malloc fills them), so that
     * a zero fill left out of a move shows in the values read back. */
    mallopt(M_PERTURB, 0x5A);
#endif
    for (int tied = 0; tied < 2; tied++) {
        llmt_context *ctx = test_context(2, 3);
        llmt_model *m = model_new(ctx, LLMT_PRECISION_FP32, tied);
        const int64_t split = split_of(m, LLMT_OFFLOAD_ALL_LAYERS), n = llmt_model_num_params(m);
        const int64_t small = split_of(m, 1);
        int64_t s = 0, e0 = 0, e1 = 0;
        llmt_grad_bucket_range(m, 0, &s, &e0);
        llmt_grad_bucket_range(m, 1, &s, &e1);
        assert_true(e0 < small && small < e1 && e1 < split); /* layer 0 straddles `small` */
        const int64_t kept = tied ? e0 : 0;                  /* what a step keeps */
        float *want = calloc((size_t)n, sizeof *want), *got = malloc((size_t)n * sizeof *got);
        assert_non_null(want);
        assert_non_null(got);
        assert_int_equal(llmt_grads_place(m, small), LLMT_OK);
        llmt_grads_home_on_demand(m, 1);
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_home(ctx, m, kept, "allocated");
        write_bucket(m, 0, want);
        assert_home(ctx, m, e0, "the embedding stored");
        assert_int_equal(llmt_grads_io(m, 0, n, got, 0), LLMT_OK);
        assert_values(got, want, n, "the embedding stored, then read");
        assert_home(ctx, m, e0, "the embedding stored, then read");
        assert_int_equal(llmt_grads_place(m, split), LLMT_OK);
        assert_home(ctx, m, split, "moved to a larger split");
        assert_int_equal(llmt_grads_io(m, 0, n, got, 0), LLMT_OK);
        assert_values(got, want, n, "moved to a larger split");
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_home(ctx, m, kept, "zeroed");
        memset(want, 0, (size_t)n * sizeof *want);
        write_bucket(m, 0, want);
        assert_int_equal(llmt_grads_place(m, small), LLMT_OK);
        assert_home(ctx, m, e0, "moved to a smaller split");
        write_bucket(m, 1, want);
        assert_home(ctx, m, small, "layer 0 stored, across the split");
        assert_int_equal(llmt_grads_io(m, 0, n, got, 0), LLMT_OK);
        assert_values(got, want, n, "layer 0 stored, across the split");
        /* A write right after a zeroing, then a move: the values move. */
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        for (int64_t i = 0; i < n; i++)
            want[i] = pattern(i);
        assert_int_equal(llmt_grads_io(m, 0, n, want, 1), LLMT_OK);
        assert_int_equal(llmt_grads_place(m, split), LLMT_OK);
        assert_int_equal(llmt_grads_io(m, 0, n, got, 0), LLMT_OK);
        assert_values(got, want, n, "written after a zeroing, then moved");
        /* Zero gradients move with no copy and no more room. */
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_grads_place(m, small), LLMT_OK);
        assert_home(ctx, m, kept < small ? kept : small, "zero gradients moved");
        assert_grads_zero(m, 1, "zero gradients moved");
        /* A split inside the embedding's bucket: a tied step keeps only
         * the bucket's part before it. */
        assert_true(GRANULE < e0);
        assert_int_equal(llmt_grads_place(m, GRANULE), LLMT_OK);
        assert_home(ctx, m, tied ? GRANULE : 0, "zero gradients moved inside the embedding");
        assert_grads_zero(m, 1, "zero gradients moved inside the embedding");
        free(want);
        free(got);
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
#ifdef M_PERTURB
    mallopt(M_PERTURB, 0);
#endif
}

/* What a data-parallel rank keeps of the offloaded gradients
 * (llmt_dp_grad_home, the planner's and the controller's figure), against
 * the fast windows worked out by hand (rank r of N runs micro-batches
 * [floor(c r / N), floor(c (r + 1) / N)) of c): all of them (SPLIT) where
 * the engine does not send them from the slots or a window holds two,
 * else KEPT, also for a rank that runs none. */
static void test_dp_grad_home_by_hand(void **state)
{
    (void)state;
    enum { SPLIT = 1000, KEPT = 7 };
    const int det = LLMT_REDUCE_DETERMINISTIC, fast = LLMT_REDUCE_FAST;
    static const struct {
        int from_slots, mode;
        int32_t count, size, rank;
        int64_t want;
    } cases[] = {
        {1, det, 12, 4, 3, KEPT},  /* rounds of one micro-batch a rank */
        {1, det, 3, 5, 4, KEPT},   /* a rank that runs none */
        {0, det, 12, 4, 3, SPLIT}, /* the CPU over MPI: stored, sent after backward */
        {1, fast, 3, 2, 0, KEPT},  /* [0, 1) */
        {1, fast, 3, 2, 1, SPLIT}, /* [1, 3) */
        {1, fast, 3, 5, 2, KEPT},  /* [1, 1): none */
        {1, fast, 2, 5, 4, KEPT},  /* [1, 2) */
        {1, fast, 12, 4, 0, SPLIT},                       /* [0, 3) */
        {1, fast, 2147483647, 65536, 65535, SPLIT},       /* 32767 or 32768, without overflow */
        {1, fast, 65535, 65536, 65535, KEPT},             /* [65534, 65535) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int64_t got = llmt_dp_grad_home(SPLIT, KEPT, cases[i].from_slots, cases[i].mode,
                                        cases[i].count, cases[i].size, cases[i].rank);
        if (got != cases[i].want)
            fail_msg("case %zu (mode %d, %d micro-batches, rank %d of %d): %lld, not %lld", i,
                     cases[i].mode, cases[i].count, cases[i].rank, cases[i].size,
                     (long long)got, (long long)cases[i].want);
    }
    int32_t first = 0, end = 0;
    llmt_fast_window(2147483647, 65536, 65535, &first, &end);
    assert_int_equal(first, 2147450879); /* floor((2^31 - 1) 65535 / 65536) */
    assert_int_equal(end, 2147483647);
}

/* The bytes of value v in a precision's gradient dtype, decoded by hand:
 * fp32 itself, bf16 its upper half (exact values), f16 through the half
 * conversion. */
static void encode(int precision, float v, unsigned char *out)
{
    if (precision == LLMT_PRECISION_FP32) {
        memcpy(out, &v, 4);
        return;
    }
    uint16_t h;
    if (precision == LLMT_PRECISION_FP16_MIXED) {
        h = llmt_f32_to_f16(v);
    } else {
        uint32_t bits;
        memcpy(&bits, &v, 4);
        h = (uint16_t)(bits >> 16);
    }
    memcpy(out, &h, 2);
}

/* set_grad writes each tensor across the split, the offloaded elements at
 * their flat index in host memory (what the optimizer reads), the others in
 * the device segment; get_grad reads the same values back. */
static void test_set_get_across_the_split(void **state)
{
    (void)state;
    for (int p = 0; p < 4; p++) {
        llmt_context *ctx = test_context(2, 5);
        llmt_model *m = trained_model(ctx, precisions[p], 0, 1);
        const int64_t n = llmt_model_num_params(m), split = m->grad_split;
        float *in = malloc((size_t)n * sizeof *in);
        assert_non_null(in);
        for (int64_t i = 0; i < n; i++)
            in[i] = pattern(i);
        int64_t at = 0;
        for (int32_t t = 0; t < llmt_model_num_tensors(m); t++) {
            llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
            assert_int_equal(llmt_model_tensor_info(m, t, &info), LLMT_OK);
            assert_int_equal(llmt_model_set_grad(m, info.name, in + at, (size_t)info.numel),
                             LLMT_OK);
            at += info.numel;
        }
        size_t es = elem_size(precisions[p]);
        for (int64_t i = 0; i < n; i++) {
            unsigned char want[4];
            encode(precisions[p], in[i], want);
            const unsigned char *got =
                i < split ? (const unsigned char *)m->host_grads.ptr + (size_t)i * es
                          : (const unsigned char *)m->grads.ptr + (size_t)(i - split) * es;
            if (memcmp(got, want, es))
                fail_msg("precision %d: element %lld (split %lld) holds the wrong bytes",
                         precisions[p], (long long)i, (long long)split);
        }
        float *out = all_grads(m);
        assert_memory_equal(out, in, (size_t)n * sizeof *in);
        free(out);
        free(in);
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
}

/* Moving the gradients between placements and back keeps every value, and
 * the accounting returns to the model's own. */
static void test_place_and_back_keeps_values(void **state)
{
    (void)state;
    for (int tied = 0; tied < 2; tied++) {
        llmt_context *ctx = test_context(2, 9);
        llmt_model *m = trained_model(ctx, LLMT_PRECISION_FP16_MIXED, tied, 0);
        assert_int_equal(m->grad_split, 0);
        llmt_memory_stats before = stats_of(ctx);
        float *g0 = all_grads(m);
        const int32_t moves[4] = {1, LLMT_OFFLOAD_ALL_LAYERS, 2, 0};
        for (int i = 0; i < 4; i++) {
            int64_t split = split_of(m, moves[i]);
            assert_int_equal(llmt_grads_place(m, split), LLMT_OK);
            assert_accounting(ctx, LLMT_PRECISION_FP16_MIXED, tied, split);
            float *g = all_grads(m);
            if (memcmp(g, g0, (size_t)llmt_model_num_params(m) * sizeof *g))
                fail_msg("tied %d: the gradients changed moving to layers %d", tied, moves[i]);
            free(g);
        }
        llmt_memory_stats after = stats_of(ctx);
        assert_memory_equal(after.current, before.current, sizeof before.current);
        free(g0);
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
}

/* A move refused by the host budget, the device budget or a bad split
 * changes nothing: placement, accounting, values; backward then still
 * gives the reference's gradients. */
static void test_refused_place_changes_nothing(void **state)
{
    (void)state;
    llmt_context *ref_ctx = test_context(2, 11), *ctx = test_context(2, 11);
    llmt_model *ref = trained_model(ref_ctx, LLMT_PRECISION_BF16_PURE, 0, 0);
    llmt_model *m = trained_model(ctx, LLMT_PRECISION_BF16_PURE, 0, 1);
    const int64_t split = m->grad_split, larger = split_of(m, 2);
    assert_true(larger > split);
    llmt_memory_stats before = stats_of(ctx);
    float *g0 = all_grads(m);

    /* HOST_STATE cannot hold the larger host segment. */
    assert_int_equal(llmt_context_set_host_budget(ctx, before.current[LLMT_MEM_HOST_STATE] +
                                                           (uint64_t)(larger - split)),
                     LLMT_OK);
    assert_int_equal(llmt_grads_place(m, larger), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "offloaded gradients");
    assert_int_equal(llmt_context_set_host_budget(ctx, 0), LLMT_OK);
    /* The device cannot hold the new device segment beside the old one. */
    assert_int_equal(llmt_context_set_budget(ctx, before.total_current + 1), LLMT_OK);
    assert_int_equal(llmt_grads_place(m, 0), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "model gradients");
    assert_int_equal(llmt_context_set_budget(ctx, 0), LLMT_OK);
    /* Not a granule multiple; past the end. */
    assert_int_equal(llmt_grads_place(m, split + 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "split");
    assert_int_equal(llmt_grads_place(m, (llmt_model_num_params(m) / GRANULE + 1) * GRANULE),
                     LLMT_EINVAL);

    assert_int_equal(m->grad_split, split);
    llmt_memory_stats after = stats_of(ctx);
    assert_memory_equal(after.current, before.current, sizeof before.current);
    float *g = all_grads(m);
    assert_memory_equal(g, g0, (size_t)llmt_model_num_params(m) * sizeof *g);
    free(g);
    free(g0);
    assert_same_grads(ref, m, "after the refusals");
    llmt_model_free(ref);
    llmt_model_free(m);
    llmt_context_free(ref_ctx);
    llmt_context_free(ctx);
}

/* The ordered slicer over several micro-batches with the gradients
 * offloaded (layer 0's prefix, or every layer) sums them in fp32 across
 * the split: starting from a batch's gradients already held (the sum
 * starts as them), another batch gives gradients bitwise those of the
 * same run with every gradient on the device, in each precision mode, tied
 * or not; while held, the sum's host part (4 bytes a parameter of the
 * split) is in HOST_STATE beside the gradients, its device part in GRADS. */
static void test_ordered_slicer_with_offload(void **state)
{
    (void)state;
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 2; k++) {
            const int tied = k, layers = k ? LAYERS : 1;
            llmt_context *ctx = test_context(2, 13), *ref_ctx = test_context(2, 13);
            llmt_model *m = trained_model(ctx, precisions[p], tied, layers);
            llmt_model *ref = trained_model(ref_ctx, precisions[p], tied, 0);
            llmt_slicer *s = NULL, *rs = NULL;
            assert_int_equal(llmt_slicer_create(&s, m, MICRO), LLMT_OK);
            assert_int_equal(llmt_slicer_create(&rs, ref, MICRO), LLMT_OK);
            assert_int_equal(llmt_slicer_set_accumulation(s, LLMT_ACCUMULATE_ORDERED), LLMT_OK);
            assert_int_equal(llmt_slicer_set_accumulation(rs, LLMT_ACCUMULATE_ORDERED), LLMT_OK);
            slice_batch(s, 4);
            slice_batch(rs, 4);
            char what[64];
            snprintf(what, sizeof what, "precision %d, tied %d, %d layers", precisions[p], tied,
                     layers);
            assert_same_grads(m, ref, what);
            const int64_t split = split_of(m, layers);
            assert_true(split > 0);
            llmt_memory_stats a = stats_of(ctx);
            assert_int_equal(a.current[LLMT_MEM_HOST_STATE],
                             (uint64_t)split * (elem_size(precisions[p]) + 4));
            assert_int_equal(a.current[LLMT_MEM_GRADS],
                             (uint64_t)(total_elems(tied) - split) * (elem_size(precisions[p]) + 4) +
                                 (uint64_t)expected_bucket(tied, split) * elem_size(precisions[p]));
            llmt_slicer_free(s);
            llmt_slicer_free(rs);
            assert_accounting(ctx, precisions[p], tied, split); /* the sum freed with its slicer */
            llmt_model_free(m);
            llmt_model_free(ref);
            llmt_context_free(ctx);
            llmt_context_free(ref_ctx);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offloaded_backward_is_bitwise),
        cmocka_unit_test(test_zero_grads_across_the_split),
        cmocka_unit_test(test_set_get_across_the_split),
        cmocka_unit_test(test_place_and_back_keeps_values),
        cmocka_unit_test(test_refused_place_changes_nothing),
        cmocka_unit_test(test_ordered_slicer_with_offload),
        cmocka_unit_test(test_sent_bucket_and_its_slot),
        cmocka_unit_test(test_home_on_demand),
        cmocka_unit_test(test_dp_grad_home_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
