/* The planner for one rank of a data-parallel run (world_size, rank) and for
 * an ordered slicer (batch_size, ordered_accumulation): every rank's bytes
 * against a hand computation of the ZeRO-1 shard, uneven splits, ranks that
 * own nothing, the exchange window, the fit per rank, version 1 structs, and
 * errors that name the field; and measured: a sharded optimizer over a
 * communicator of one process, its state offloaded or not, and an ordered
 * slicer, after training steps (several ranks: tests/mpi/test_plan_ranks.c). */
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_self_comm.h"

/* The tiny model: vocab 41, d 32, 3 layers, 4 heads of 8 (2 kv), FFN 48,
 * untied: 2 x 41 x 32 + 3 x (2 x 32 + 2 x 32^2 + 2 x 32 x 16 + 3 x 32 x 48)
 * + 32 = 25888 parameters, 7 granules of 4096 (the last of 1312). */
#define TINY_PARAMS 25888

static llmt_plan_config tiny(int precision, int32_t world_size, int32_t rank)
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
    pc.micro_batch = 3;
    pc.seq_len = 16;
    pc.world_size = world_size;
    pc.rank = rank;
    return pc;
}

/* Hugging Face LLaMA-7B (6738415616 parameters) or 13B (13015864320). */
static llmt_plan_config llama(int b13, int precision, int32_t world_size)
{
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model.vocab_size = 32000;
    pc.model.hidden_size = b13 ? 5120 : 4096;
    pc.model.num_layers = b13 ? 40 : 32;
    pc.model.num_heads = pc.model.num_kv_heads = b13 ? 40 : 32;
    pc.model.ffn_size = b13 ? 13824 : 11008;
    pc.model.max_seq_len = 2048;
    pc.model.precision = precision;
    pc.micro_batch = 1;
    pc.seq_len = 2048;
    pc.world_size = world_size;
    return pc;
}

/* One rank's ZeRO-1 share, by hand: P parameters in granules of 4096, G of
 * them, rank r of N owning granules [G r / N, G (r + 1) / N) (floors; the
 * last granule ends at P); an exchange window of 64 MiB / N / e elements
 * rounded down to whole granules, at least one. The rank holds AdamW's state
 * for its elements (fp32 m and v: 8 bytes; mixed: 8 + a 4-byte master;
 * bf16_pure: 2 + 2), their gradient sum (fp32, 4 bytes each, whatever e)
 * and a receive buffer of min(owned, window) elements from each of the N
 * ranks. */
typedef struct share {
    int64_t first, end;
    uint64_t optimizer, grad_sum, recv;
} share;

static share hand_share(int64_t P, int32_t N, int32_t r, int precision)
{
    const int64_t granule = 4096, G = (P + granule - 1) / granule;
    const uint64_t e = precision == LLMT_PRECISION_FP32 ? 4 : 2;
    const uint64_t state = precision == LLMT_PRECISION_FP32        ? 8
                           : precision == LLMT_PRECISION_BF16_PURE ? 4
                                                                   : 12;
    share s;
    s.first = G * r / N * granule;
    s.end = G * (r + 1) / N * granule;
    s.first = s.first < P ? s.first : P;
    s.end = s.end < P ? s.end : P;
    int64_t window = (int64_t)(((uint64_t)64 << 20) / (uint64_t)N / e);
    window -= window % granule;
    window = window < granule ? granule : window;
    const int64_t owned = s.end - s.first;
    s.optimizer = (uint64_t)owned * state;
    s.grad_sum = (uint64_t)owned * 4;
    s.recv = (uint64_t)(owned < window ? owned : window) * (uint64_t)N * e;
    return s;
}

static llmt_plan compute(llmt_plan_config pc)
{
    llmt_plan p = LLMT_PLAN_INIT;
    if (llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &p) != LLMT_OK)
        fail_msg("%s", llmt_error_last());
    return p;
}

/* pc (world_size N >= 1, rank r or -1) planned against the single-process
 * plan of the same model with rank want_rank's share in place of the whole
 * optimizer. */
static void check_rank(llmt_plan_config pc, int32_t want_rank)
{
    llmt_plan_config single = pc;
    single.world_size = 0;
    single.rank = -1;
    const llmt_plan base = compute(single), got = compute(pc);
    const share s = hand_share(base.num_params, pc.world_size, want_rank, pc.model.precision);
    llmt_plan want = base;
    want.bytes[LLMT_MEM_OPTIMIZER] = s.optimizer;
    want.bytes[LLMT_MEM_GRADS] += s.grad_sum;
    want.bytes[LLMT_MEM_WORKSPACE] += s.recv;
    want.peak = base.peak - base.bytes[LLMT_MEM_OPTIMIZER] + s.optimizer + s.grad_sum + s.recv;
    if (got.rank != want_rank || got.shard_first != s.first || got.shard_end != s.end)
        fail_msg("world %d rank %d: planned rank %d [%lld, %lld), by hand rank %d [%lld, %lld)",
                 pc.world_size, pc.rank, got.rank, (long long)got.shard_first,
                 (long long)got.shard_end, want_rank, (long long)s.first, (long long)s.end);
    for (int c = 0; c < LLMT_MEM_CATEGORY_SLOTS; c++)
        if (got.bytes[c] != want.bytes[c])
            fail_msg("world %d rank %d precision %d: %s planned %llu, by hand %llu", pc.world_size,
                     pc.rank, pc.model.precision, llmt_mem_category_name(c),
                     (unsigned long long)got.bytes[c], (unsigned long long)want.bytes[c]);
    assert_int_equal(got.peak, want.peak);
    assert_int_equal(got.num_params, base.num_params);
}

/* The rank with the largest peak by hand: the lowest with the most bytes. */
static int32_t hand_largest_rank(int64_t P, int32_t N, int precision)
{
    int32_t best = 0;
    uint64_t most = 0;
    for (int32_t r = 0; r < N; r++) {
        share s = hand_share(P, N, r, precision);
        if (s.optimizer + s.grad_sum + s.recv > most) {
            most = s.optimizer + s.grad_sum + s.recv;
            best = r;
        }
    }
    return best;
}

/* 7 granules over 3 ranks: [0, 8192), [8192, 16384), [16384, 25888); the
 * last rank, with the partial granule, holds the most. */
static void test_uneven_split(void **state)
{
    (void)state;
    for (int prec = 0; prec < 4; prec++) {
        for (int32_t r = 0; r < 3; r++)
            check_rank(tiny(prec, 3, r), r);
        check_rank(tiny(prec, 3, -1), 2);
    }
    llmt_plan p = compute(tiny(LLMT_PRECISION_FP32, 3, -1));
    assert_int_equal(p.num_params, TINY_PARAMS);
    assert_int_equal(p.shard_first, 16384);
    assert_int_equal(p.shard_end, TINY_PARAMS);
    /* fp32: 9504 elements x (8 state + 4 gradient sum) + 3 x 9504 x 4 received. */
    llmt_plan_config single = tiny(LLMT_PRECISION_FP32, 0, -1);
    llmt_plan whole = compute(single);
    assert_int_equal(p.bytes[LLMT_MEM_OPTIMIZER], 9504 * 8);
    assert_int_equal(p.bytes[LLMT_MEM_GRADS], whole.bytes[LLMT_MEM_GRADS] + 9504 * 4);
    assert_int_equal(p.bytes[LLMT_MEM_WORKSPACE], whole.bytes[LLMT_MEM_WORKSPACE] + 3 * 9504 * 4);
}

/* 7 granules over 16 ranks: ranks 0 and 1 own nothing (and allocate no shard
 * buffers), rank 2 owns [0, 4096) and is the largest, rank 15 the partial
 * last granule. Then the most ranks a plan takes. */
static void test_ranks_owning_nothing(void **state)
{
    (void)state;
    for (int prec = 0; prec < 4; prec++)
        for (int32_t r = -1; r < 16; r++)
            check_rank(tiny(prec, 16, r), r < 0 ? 2 : r);
    llmt_plan_config pc = tiny(LLMT_PRECISION_BF16_MIXED, 16, 0);
    llmt_plan p = compute(pc);
    assert_int_equal(p.shard_first, 0);
    assert_int_equal(p.shard_end, 0);
    assert_int_equal(p.bytes[LLMT_MEM_OPTIMIZER], 0);
    pc.rank = 15;
    p = compute(pc);
    assert_int_equal(p.shard_first, 6 * 4096);
    assert_int_equal(p.shard_end, TINY_PARAMS);
    assert_int_equal(p.bytes[LLMT_MEM_OPTIMIZER], (TINY_PARAMS - 6 * 4096) * 12);
    check_rank(tiny(LLMT_PRECISION_FP32, LLMT_PLAN_MAX_WORLD, -1),
               hand_largest_rank(TINY_PARAMS, LLMT_PLAN_MAX_WORLD, LLMT_PRECISION_FP32));
    check_rank(tiny(LLMT_PRECISION_FP32, LLMT_PLAN_MAX_WORLD, LLMT_PLAN_MAX_WORLD - 1),
               LLMT_PLAN_MAX_WORLD - 1);
}

/* One rank owns everything and still has the two buffers. */
static void test_world_of_one(void **state)
{
    (void)state;
    for (int prec = 0; prec < 4; prec++) {
        check_rank(tiny(prec, 1, -1), 0);
        llmt_plan p = compute(tiny(prec, 1, 0));
        assert_int_equal(p.shard_first, 0);
        assert_int_equal(p.shard_end, TINY_PARAMS);
    }
}

/* LLaMA-7B and 13B on 8 ranks: the window (64 MiB / 8 / 2 = 4194304 bf16
 * elements) binds, so each rank receives 64 MiB. 7B's 1645121 granules
 * (= 8 x 205640 + 1) leave one more on rank 7; 13B's 3177702 (8 x 397212
 * + 6, the last of 1024 elements) one more on ranks 1, 2, 3, 5, 6 and 7, of
 * which rank 7 holds the partial granule: rank 1 is the largest. */
static void test_llama_on_8_ranks(void **state)
{
    (void)state;
    const int bf16 = LLMT_PRECISION_BF16_MIXED;
    assert_int_equal(hand_largest_rank(6738415616, 8, bf16), 7);
    assert_int_equal(hand_largest_rank(13015864320, 8, bf16), 1);
    check_rank(llama(0, bf16, 8), 7);
    check_rank(llama(1, bf16, 8), 1);
    check_rank(llama(1, LLMT_PRECISION_FP32, 8), 1);
    llmt_plan_config last = llama(1, bf16, 8);
    last.rank = 7;
    check_rank(last, 7);
    const llmt_plan p = compute(llama(0, bf16, 8)), single = compute(llama(0, bf16, 0));
    assert_int_equal(p.bytes[LLMT_MEM_WORKSPACE] - single.bytes[LLMT_MEM_WORKSPACE],
                     (uint64_t)64 << 20);
    assert_int_equal(p.shard_end - p.shard_first, (int64_t)205641 * 4096);
}

/* Without a communicator an ordered slicer adds one fp32 gradient buffer
 * (4 bytes a parameter, in bf16_mixed too) when the global batch has more
 * than one micro-batch; with one it adds nothing. */
static void test_ordered_accumulation(void **state)
{
    (void)state;
    llmt_plan_config pc = tiny(LLMT_PRECISION_BF16_MIXED, 0, -1);
    const llmt_plan plain = compute(pc);
    const uint64_t grads = (uint64_t)TINY_PARAMS * 2;
    assert_int_equal(plain.bytes[LLMT_MEM_GRADS], grads);
    pc.ordered_accumulation = 1;
    const int32_t batches[4] = {0, 3, 4, 9}; /* micro-batch 3: 1, 1, 2 and 3 micro-batches */
    for (int k = 0; k < 4; k++) {
        pc.batch_size = batches[k];
        llmt_plan p = compute(pc);
        uint64_t extra = batches[k] > 3 ? (uint64_t)TINY_PARAMS * 4 : 0;
        assert_int_equal(p.bytes[LLMT_MEM_GRADS], grads + extra);
        assert_int_equal(p.peak, plain.peak + extra);
    }
    llmt_plan_config dist = tiny(LLMT_PRECISION_BF16_MIXED, 2, -1);
    const llmt_plan unordered = compute(dist);
    dist.ordered_accumulation = 1;
    dist.batch_size = 9;
    llmt_plan p = compute(dist);
    assert_int_equal(p.bytes[LLMT_MEM_GRADS], unordered.bytes[LLMT_MEM_GRADS]);
    assert_int_equal(p.peak, unordered.peak);
}

/* The fit by brute force over the recompute ladder, halving from
 * pc.micro_batch, each plan with the global batch batch_size (0: each
 * micro-batch alone). */
static void hand_fit(llmt_plan_config pc, int32_t batch_size, uint64_t budget, int32_t *b,
                     int32_t *r)
{
    static const int32_t ladder[5] = {
        LLMT_RECOMPUTE_NONE, LLMT_RECOMPUTE_FFN_ACT,
        LLMT_RECOMPUTE_FFN_ACT | LLMT_RECOMPUTE_ATTN_CORE,
        LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN, LLMT_RECOMPUTE_FULL};
    *b = *r = -1;
    for (int32_t micro = pc.micro_batch; micro >= 1; micro = micro == 1 ? 0 : (micro + 1) / 2)
        for (int k = 0; k < 5; k++) {
            llmt_plan_config c = pc;
            c.micro_batch = micro;
            c.batch_size = batch_size;
            c.recompute = ladder[k];
            if (compute(c).peak <= budget) {
                *b = micro;
                *r = ladder[k];
                return;
            }
        }
}

/* The fit is per rank: a budget of the 8-rank peak fits 8 ranks, not one
 * process; it keeps the global batch while the micro-batch halves, so an
 * ordered slicer's buffer appears once there is more than one micro-batch. */
static void test_fit(void **state)
{
    (void)state;
    llmt_plan_config pc = tiny(LLMT_PRECISION_FP32, 8, -1);
    const llmt_plan ranked = compute(pc);
    int32_t b = 0, r = -1;
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, &pc, ranked.peak, &b, &r), LLMT_OK);
    assert_int_equal(b, 3);
    assert_int_equal(r, LLMT_RECOMPUTE_NONE);
    llmt_plan_config single = tiny(LLMT_PRECISION_FP32, 0, -1);
    assert_true(compute(single).peak > ranked.peak);
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, &single, ranked.peak, &b, &r),
                     LLMT_OK);
    assert_true(b < 3 || r != LLMT_RECOMPUTE_NONE);
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, &pc, 1000, &b, &r), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "nothing fits 1000 bytes on rank 1 of 8");

    /* Micro-batch 4 of an ordered batch of 4, a byte short of full
     * recompute: the fit halves, and from micro-batch 2 on there are several
     * micro-batches, which need the extra gradient buffer; a search that
     * forgot the global batch would find another fit. */
    llmt_plan_config ord = tiny(LLMT_PRECISION_FP32, 0, -1);
    ord.micro_batch = 4;
    ord.ordered_accumulation = 1;
    llmt_plan_config probe = ord;
    probe.recompute = LLMT_RECOMPUTE_FULL;
    const uint64_t budget = compute(probe).peak - 1;
    int32_t want_b = 0, want_r = -1, forgot_b = 0, forgot_r = -1;
    hand_fit(ord, 4, budget, &want_b, &want_r);
    hand_fit(ord, 0, budget, &forgot_b, &forgot_r);
    assert_true(want_b != forgot_b || want_r != forgot_r);
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, &ord, budget, &b, &r), LLMT_OK);
    assert_int_equal(b, want_b);
    assert_int_equal(r, want_r);
}

/* A version 1 configuration ends before world_size: the bytes after it are
 * not read (garbage there changes nothing), and a version 1 plan gets only
 * its own fields (the bytes after them stay as they were). */
static void test_version_1_structs(void **state)
{
    (void)state;
    llmt_plan_config pc = tiny(LLMT_PRECISION_BF16_MIXED, 0, -1);
    const llmt_plan want = compute(pc);
    llmt_plan_config *v1 = malloc(sizeof *v1);
    assert_non_null(v1);
    memset(v1, 0xA5, sizeof *v1);
    memcpy(v1, &pc, offsetof(llmt_plan_config, world_size));
    v1->version = 1;
    llmt_plan *out = malloc(sizeof *out);
    assert_non_null(out);
    memset(out, 0x5A, sizeof *out);
    out->version = 1;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, v1, out), LLMT_OK);
    for (int c = 0; c < LLMT_MEM_CATEGORY_SLOTS; c++)
        assert_int_equal(out->bytes[c], want.bytes[c]);
    assert_int_equal(out->peak, want.peak);
    assert_int_equal(out->num_params, want.num_params);
    assert_int_equal(out->version, 1);
    const unsigned char *tail = (const unsigned char *)out + offsetof(llmt_plan, rank);
    for (size_t i = 0; i < sizeof *out - offsetof(llmt_plan, rank); i++)
        assert_int_equal(tail[i], 0x5A);
    int32_t b = 0, r = -1;
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, v1, want.peak, &b, &r), LLMT_OK);
    assert_int_equal(b, 3);
    free(out);
    free(v1);
}

static void expect_error(llmt_plan_config pc, int code, const char *words)
{
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &p), code);
    assert_contains(llmt_error_last(), words);
    int32_t b = 0, r = 0;
    assert_int_equal(llmt_plan_fit_backend(LLMT_BACKEND_CPU, 1, &pc, 1 << 30, &b, &r), code);
    assert_contains(llmt_error_last(), words);
}

static void test_errors_named(void **state)
{
    (void)state;
    const int fp32 = LLMT_PRECISION_FP32;
    expect_error(tiny(fp32, -1, -1), LLMT_EINVAL,
                 "cfg->world_size = -1 (must be 0, no communicator, or 1..65536 ranks)");
    expect_error(tiny(fp32, LLMT_PLAN_MAX_WORLD + 1, -1), LLMT_EINVAL, "world_size = 65537");
    expect_error(tiny(fp32, 3, 3), LLMT_EINVAL, "cfg->rank = 3 (must be -1, the rank with the "
                 "largest peak, or 0..2: cfg->world_size is 3)");
    expect_error(tiny(fp32, 3, -2), LLMT_EINVAL, "cfg->rank = -2");
    expect_error(tiny(fp32, 0, 0), LLMT_EINVAL, "cfg->rank = 0 with cfg->world_size = 0");
    llmt_plan_config pc = tiny(fp32, 2, -1);
    pc.with_optimizer = 0;
    expect_error(pc, LLMT_EINVAL, "cfg->world_size = 2 needs cfg->with_optimizer = 1");
    pc = tiny(fp32, 0, -1);
    pc.batch_size = 2;
    expect_error(pc, LLMT_EINVAL, "cfg->batch_size = 2 (must be 0, meaning micro_batch, or at "
                 "least cfg->micro_batch = 3)");
    pc.batch_size = -1;
    expect_error(pc, LLMT_EINVAL, "cfg->batch_size = -1");
    pc.batch_size = 0;
    pc.ordered_accumulation = 2;
    expect_error(pc, LLMT_EINVAL, "cfg->ordered_accumulation = 2");
    pc = tiny(fp32, 2, -1);
    pc.reduce_mode = 2;
    expect_error(pc, LLMT_EINVAL, "cfg->reduce_mode = 2 is not an llmt_reduce_mode");
    /* A version 4 struct ends before reduce_mode: what follows is not read. */
    pc.version = 4;
    llmt_plan p4 = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &p4), LLMT_OK);
    pc = tiny(fp32, 0, -1);
    pc.version = 6;
    expect_error(pc, LLMT_EVERSION, "cfg->version = 6, this library knows 1..5");
    pc.version = 0;
    expect_error(pc, LLMT_EVERSION, "cfg->version = 0");
    pc = tiny(fp32, 0, -1);
    llmt_plan p = LLMT_PLAN_INIT;
    p.version = 4;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &p), LLMT_EVERSION);
    assert_contains(llmt_error_last(), "out->version = 4, this library knows 1..3");
}

enum { B = 8, T = 12 };

/* Two training steps of a batch of B in micro-batches of micro on a fresh
 * context (sharded over a communicator of one when sharded, else with an
 * optimizer of its own and the slicer's accumulation), the optimizer's
 * state of the first offload_layers layers (0: none) in host memory; the
 * plan (world_size 1 when sharded, else the accumulation and the global
 * batch B) must equal the measured peak of every category, and the
 * optimizer's device and host bytes the context's current bytes. */
static void check_measured(int precision, int sharded, int32_t accumulation, int32_t micro,
                           int32_t offload_layers)
{
    llmt_plan_config pc = tiny(precision, sharded ? 1 : 0, -1);
    pc.seq_len = T;
    pc.micro_batch = micro;
    pc.batch_size = B;
    pc.ordered_accumulation = accumulation == LLMT_ACCUMULATE_ORDERED;
    pc.offload_parts = offload_layers ? LLMT_OFFLOAD_OPTIMIZER : LLMT_OFFLOAD_NONE;
    pc.offload_layers = offload_layers;
    llmt_context *ctx = test_context(2, 1);
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
    llmt_comm *comm = NULL;
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_slicer *sl = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.offload_parts = pc.offload_parts;
    oc.offload_layers = offload_layers;
    assert_int_equal(llmt_model_create(&m, ctx, &pc.model), LLMT_OK);
    if (sharded) {
        assert_non_null(comm = test_self_comm());
        assert_int_equal(llmt_optimizer_create_sharded(&o, m, &oc, comm, LLMT_REDUCE_DETERMINISTIC),
                         LLMT_OK);
    } else {
        assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    }
    assert_int_equal(llmt_slicer_create(&sl, m, micro), LLMT_OK);
    assert_int_equal(llmt_slicer_set_accumulation(sl, accumulation), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (i * 7 + 3) % 41;
        targets[i] = (i * 11 + 5) % 41;
    }
    for (int step = 0; step < 2; step++) {
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, NULL),
                         LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, NULL, NULL), LLMT_OK);
    }
    int64_t first = -1, end = -1;
    assert_int_equal(llmt_optimizer_shard(o, &first, &end), LLMT_OK);
    assert_int_equal(first, p.shard_first);
    assert_int_equal(end, p.shard_end);
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++)
        if (s.peak[c] != p.bytes[c])
            fail_msg("precision %d, sharded %d, accumulation %d, micro-batch %d, offload %d "
                     "layers: %s planned %llu, measured peak %llu", precision, sharded,
                     accumulation, micro, offload_layers, llmt_mem_category_name(c),
                     (unsigned long long)p.bytes[c], (unsigned long long)s.peak[c]);
    assert_int_equal(s.total_peak, p.peak);
    assert_int_equal(s.current[LLMT_MEM_OPTIMIZER], p.bytes[LLMT_MEM_OPTIMIZER]);
    assert_int_equal(s.current[LLMT_MEM_HOST_STATE], p.bytes[LLMT_MEM_HOST_STATE]);
    assert_int_equal(p.host_peak, p.bytes[LLMT_MEM_HOST_STATE]);
    assert_true((offload_layers > 0) == (s.current[LLMT_MEM_HOST_STATE] > 0));
    llmt_slicer_free(sl);
    llmt_optimizer_free(o);
    llmt_comm_free(comm);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* A world of one owns everything and still allocates the owner's gradient
 * sum and the exchange buffer; offloaded, the state of the embedding and
 * its first one or two layers (9056 or 16800 of 25888 elements) is on the
 * host; an ordered slicer's extra buffer appears only with more than one
 * micro-batch. */
static void test_measured(void **state)
{
    (void)state;
    for (int prec = 0; prec < 4; prec++) {
        check_measured(prec, 1, LLMT_ACCUMULATE_IN_PLACE, 4, 0);
        check_measured(prec, 1, LLMT_ACCUMULATE_IN_PLACE, 4, 1 + prec % 2);
    }
    check_measured(LLMT_PRECISION_BF16_MIXED, 0, LLMT_ACCUMULATE_ORDERED, 4, 0);
    check_measured(LLMT_PRECISION_FP32, 0, LLMT_ACCUMULATE_ORDERED, 3, 0); /* 3, 3, 2 */
    check_measured(LLMT_PRECISION_FP32, 0, LLMT_ACCUMULATE_ORDERED, B, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uneven_split),
        cmocka_unit_test(test_ranks_owning_nothing),
        cmocka_unit_test(test_world_of_one),
        cmocka_unit_test(test_llama_on_8_ranks),
        cmocka_unit_test(test_ordered_accumulation),
        cmocka_unit_test(test_fit),
        cmocka_unit_test(test_version_1_structs),
        cmocka_unit_test(test_errors_named),
        cmocka_unit_test(test_measured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
