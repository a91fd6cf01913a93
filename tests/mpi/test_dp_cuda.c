/* Data-parallel training on the CUDA backend, under mpiexec -n N with the
 * emulated plugin (tests/gpu/emulate.sh runs it at 2 and 3 ranks with
 * LLMT_CUDA_PLUGIN set and its stand-in libnccl.so.2, tests/gpu/emu/nccl,
 * first on LD_LIBRARY_PATH; it is no CTest test: it needs both).
 *
 * The communicator is the plugin's NCCL engine (cuda/comm_nccl.cu):
 * llmt_comm_nccl_unique_id on rank 0, the id broadcast over MPI,
 * llmt_comm_create_nccl on a CUDA context of each rank, with the stand-in NCCL
 * moving the bytes over MPI. So the sharded optimizer and the trainer run
 * their CUDA code paths (the gradient exchange on device buffers, queued
 * bucket by bucket as backward ends each, the owner's fp32 sum, the
 * rounding, the norm's host partials, AdamW on the
 * sum, the weight all-gather, get/set_state, sharded checkpoints written
 * and read through device copies) over the engine's: its staging of host
 * buffers (the ranks' agreement messages), its alltoallv and allgatherv as
 * grouped sends and recvs, its broadcast, all-reduce and wait. One
 * communicator serves every run: run_open points it at each run's context
 * (dp_run.h's device_comm), which on the emulator (one device, work done
 * at launch) moves the bytes a communicator made on that context would.
 * NCCL's own transport, and what only a GPU shows, are tests/gpu/run.sh's
 * nccl-sharded stage.
 *
 * It checks: a rank given another unique id fails llmt_comm_create_nccl on
 * every rank (LLMT_ECUDA naming ncclCommInitRank and the rank), without a
 * hang; a CUDA model with a host-memory communicator is refused, naming
 * NCCL, and one with a communicator of another context; other weights on
 * one rank (hashed through host copies) are refused; in deterministic
 * mode, after 5 steps (fp32 and bf16_mixed, 6 micro-batches of 2 rows) the
 * weights, each rank's optimizer range (read from its device buffers), the
 * gathered state and the losses are bitwise those of one emulated-CUDA
 * process with an ordered slicer and the same global batch; set_state
 * then get_state round-trips every tensor; the reduction overlapped with
 * backward gives the bits and bytes sent of the exchange after backward
 * in both reduce modes, with a round in which a rank has no micro-batch,
 * also with every layer's gradients offloaded (sent from the gradient
 * bucket's slots, untied and tied), on an engine that holds each exchange
 * until the join (the emulator runs everything at launch, so it does not
 * show that the streams overlap; held, an exchange reads its slot as late
 * as a GPU's may); with the state of the embedding and layer 0 offloaded
 * (LLMT_OFFLOAD_OPTIMIZER, a rank's range straddling the split), the
 * pipelined host AdamW reads the reduced sum from the device and 3 steps
 * (fp32 offloaded from the start, bf16_mixed from step 1, and bf16_mixed
 * with the gradients of the prefix too, sent from the gradient bucket's
 * slots) give bitwise the weights and state of the run without offload;
 * adaptive
 * (fp32, 5 steps) under a device budget that fits full recompute only with
 * at least half of each rank's optimizer state on the host: step 1 runs out
 * of memory on every rank, the ranks agree on the heaviest of their least
 * fitting offload rungs (some rank's state moves to the host, a rank's
 * range straddling the split), the budget grows after step 3 and the
 * controller relaxes a notch a step (the state moves back to the device);
 * at every step every rank has the same notch and offload, and its device
 * optimizer bytes (the context's count) are those of its range past the
 * split, from the parameters' names, and the controller's prediction; the
 * weights, state and losses are bitwise one process's without budget; a rank whose
 * overlapped exchange is refused mid-backward fails the step on every rank
 * within the stand-in's bounded wait, itself naming the refusal, also with
 * the gradients offloaded (no slot left marked after it); a
 * sharded checkpoint saved at N ranks at step 3 (synchronously: the log
 * says so) resumes in one process and at N ranks, and one process's
 * checkpoint (format 1) at N ranks, each to the uninterrupted run's bits
 * after step 5; the release of a communicator that the last rank releases
 * late returns on the other ranks within the stand-in's bounded wait (its
 * ncclCommDestroy, as NCCL's, waits for every rank's release), aborted,
 * the message carrying the stand-in's ncclGetLastError text; a release 1 s
 * late is graceful on every rank, and one met by a peer's all-reduce is
 * refused by the barrier's sum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "dp_run.h"
#include "dist/comm_internal.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"

enum { STEPS_CUDA = 5, SAVED = 3 };

/* A host copy of bytes of device memory of m's backend (malloc'ed). */
static void *host_copy(const llmt_model *m, const void *dev, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    if (!h)
        must(LLMT_ENOMEM, "malloc");
    if (bytes)
        must(m->ops->copy_to_host(m->dev, h, dev, bytes), "copy to host");
    return h;
}

/* The weights of a and b, byte for byte in the model's dtype. */
static int same_weights(const run *a, const run *b)
{
    const llmt_model *ma = a->model, *mb = b->model;
    if (ma->weights.bytes != mb->weights.bytes)
        return 0;
    void *x = host_copy(ma, ma->weights.ptr, ma->weights.bytes);
    void *y = host_copy(mb, mb->weights.ptr, mb->weights.bytes);
    int same = memcmp(x, y, ma->weights.bytes) == 0;
    free(x);
    free(y);
    return same;
}

/* dp's optimizer range [first, end) of each state section, read where
 * it lives (the host segment [first, split) straight from host memory, the
 * device segment [split, end) through a copy), against the same elements
 * of ref's device buffer (ref offloads nothing: its split is its first). */
static int same_range(const run *dp, const run *ref)
{
    const llmt_optimizer *o = dp->opt, *q = ref->opt;
    int same = q->split == q->first;
    for (int sec = 0; sec < (o->has_master ? 3 : 2); sec++) {
        const llmt_buf *host, *b, *c, *unused;
        llmt_offload_section(o, sec, &host, &b);
        llmt_offload_section(q, sec, &unused, &c);
        size_t es = llmt_dtype_size(sec == 2 ? LLMT_DTYPE_F32 : o->state_dt);
        size_t host_bytes = (size_t)(o->split - o->first) * es;
        size_t dev_bytes = (size_t)(o->end - o->split) * es;
        void *x = host_copy(dp->model, b->ptr, dev_bytes);
        char *y = host_copy(ref->model, (const char *)c->ptr + (size_t)(o->first - q->first) * es,
                            host_bytes + dev_bytes);
        same &= (!host_bytes || memcmp(host->ptr, y, host_bytes) == 0) &&
                memcmp(x, y + host_bytes, dev_bytes) == 0;
        free(x);
        free(y);
    }
    return same;
}

/* Every state tensor of a and b through llmt_optimizer_get_state (for a
 * sharded optimizer a collective: every rank calls this in step). */
static int same_state(const run *a, const run *b)
{
    int same = 1;
    const llmt_model *m = a->model;
    for (int32_t i = 0; i < m->n_params; i++) {
        const llmt_param *p = &m->params[i];
        size_t n = (size_t)p->numel;
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        for (int kind = 0; kind < 3; kind++) {
            if (llmt_optimizer_state_dtype(a->opt, kind) < 0)
                continue;
            must(llmt_optimizer_get_state(a->opt, kind, p->name, x, n), "get_state");
            must(llmt_optimizer_get_state(b->opt, kind, p->name, y, n), "get_state");
            same &= memcmp(x, y, n * sizeof *x) == 0;
        }
        free(x);
        free(y);
    }
    return same;
}

/* Weights, this rank's range, the gathered state: bitwise. */
static void expect_same(const run *dp, const run *ref, const char *what)
{
    EXPECT(same_weights(dp, ref), "%s: the weights differ from the reference run's", what);
    if (dp->opt->comm)
        EXPECT(same_range(dp, ref), "%s: this rank's optimizer range [%lld, %lld) differs from "
               "the reference run's", what, (long long)dp->opt->first, (long long)dp->opt->end);
    EXPECT(same_state(dp, ref), "%s: the optimizer state differs from the reference run's",
           what);
}

/* A CUDA model of `layers` layers whose weights come from seed. */
static void cuda_model(llmt_context **ctx, llmt_model **model, uint64_t seed)
{
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.backend = LLMT_BACKEND_CUDA;
    cc.seed = seed;
    must(llmt_context_create(ctx, &cc), "CUDA context");
    llmt_model_config mc;
    dp_model_config(&mc, LLMT_PRECISION_FP32);
    must(llmt_model_create(model, *ctx, &mc), "model");
}

/* The NCCL unique id of rank 0 on every rank (rank 0 makes it on ctx). */
static void shared_unique_id(llmt_context *ctx, uint8_t id[LLMT_COMM_NCCL_ID_BYTES])
{
    if (rank == 0)
        must(llmt_comm_nccl_unique_id(ctx, id), "NCCL unique id");
    MPI_Bcast(id, LLMT_COMM_NCCL_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD);
}

/* The last rank joins with an id of its own: every rank's
 * llmt_comm_create_nccl fails, naming ncclCommInitRank and that rank. */
static void test_other_unique_id(llmt_context *ctx)
{
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES];
    shared_unique_id(ctx, id);
    if (rank == size - 1)
        must(llmt_comm_nccl_unique_id(ctx, id), "a second NCCL unique id");
    llmt_comm *comm = NULL;
    int rc = llmt_comm_create_nccl(&comm, ctx, id, rank, size);
    char expect[96];
    snprintf(expect, sizeof expect, "rank %d was given another unique id than rank 0", size - 1);
    EXPECT(rc == LLMT_ECUDA && !comm &&
               strstr(llmt_error_last(), "llmt_comm_create_nccl: ncclCommInitRank (rank ") &&
               strstr(llmt_error_last(), expect),
           "rank %d given another unique id: status %d, \"%s\"", size - 1, rc, llmt_error_last());
    llmt_comm_free(comm);
}

/* A CUDA model with a communicator that moves host memory (MPI's) is
 * refused on every rank, saying what to use. */
static void test_host_comm_refused(llmt_comm *host_comm)
{
    llmt_context *ctx = NULL;
    llmt_model *model = NULL;
    cuda_model(&ctx, &model, 77);
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_optimizer *o = NULL;
    int rc = llmt_optimizer_create_sharded(&o, model, &oc, host_comm, LLMT_REDUCE_DETERMINISTIC);
    EXPECT(rc == LLMT_EUNSUPPORTED && !o &&
               strstr(llmt_error_last(), "llmt_optimizer_create_sharded: the model is on the "
                      "cuda backend, whose buffers are device memory, but comm moves host "
                      "memory") &&
               strstr(llmt_error_last(), "use an NCCL communicator on the model's context "
                      "(llmt_comm_create_nccl)"),
           "CUDA with MPI's communicator: status %d, \"%s\"", rc, llmt_error_last());
    llmt_optimizer_free(o);
    llmt_model_free(model);
    llmt_context_free(ctx);
}

/* A communicator of another context than the model's (its collectives
 * would not wait for the model's kernels) is refused on every rank. */
static void test_other_context_refused(llmt_comm *comm)
{
    llmt_context *ctx = NULL, *other = NULL;
    llmt_model *model = NULL, *other_model = NULL;
    cuda_model(&ctx, &model, 77);
    cuda_model(&other, &other_model, 77);
    comm->device = other->backend;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_optimizer *o = NULL;
    int rc = llmt_optimizer_create_sharded(&o, model, &oc, comm, LLMT_REDUCE_DETERMINISTIC);
    EXPECT(rc == LLMT_EINVAL && !o && strstr(llmt_error_last(), "comm was made on another "
                                             "context than the model's"),
           "a communicator of another context: status %d, \"%s\"", rc, llmt_error_last());
    llmt_optimizer_free(o);
    llmt_model_free(other_model);
    llmt_model_free(model);
    llmt_context_free(other);
    llmt_context_free(ctx);
}

/* Other weights on the last rank (another seed), read from device memory
 * for the ranks' agreement, are refused on every rank. */
static void test_weights_disagree(llmt_comm *comm)
{
    llmt_context *ctx = NULL;
    llmt_model *model = NULL;
    cuda_model(&ctx, &model, rank == size - 1 ? 8 : 7);
    comm->device = ctx->backend;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_optimizer *o = NULL;
    int rc = llmt_optimizer_create_sharded(&o, model, &oc, comm, LLMT_REDUCE_DETERMINISTIC);
    char expect[64];
    snprintf(expect, sizeof expect, "rank %d", size - 1);
    EXPECT(rc == LLMT_ECOMM && !o && strstr(llmt_error_last(), "weights") &&
               strstr(llmt_error_last(), expect),
           "other weights on rank %d: status %d, \"%s\"", size - 1, rc, llmt_error_last());
    llmt_optimizer_free(o);
    llmt_model_free(model);
    llmt_context_free(ctx);
}

/* Checks, on this rank, that r's fp32 optimizer (8 bytes of moments an
 * element) splits its range [first, end) where offload_prefix_of puts its offload:
 * the device bytes of state measured by the context (LLMT_MEM_OPTIMIZER,
 * device memory) are those of [split, end) and the controller's
 * prediction, the host moments those of [first, split) (read from the
 * optimizer's buffers: LLMT_MEM_HOST_STATE holds the pipelined update's
 * pinned staging too). Returns this rank's host moment bytes. */
static int64_t expect_predicted(const run *r, int step)
{
    const llmt_optimizer *o = r->opt;
    int64_t first = 0, end = 0;
    int32_t parts = 0, off = 0;
    must(llmt_optimizer_shard(o, &first, &end), "shard");
    must(llmt_optimizer_get_offload(o, &parts, &off), "get_offload");
    int64_t split = parts ? offload_prefix_of(r->model, off) : first;
    split = split < first ? first : split > end ? end : split;
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    const uint64_t device = ms.current[LLMT_MEM_OPTIMIZER];
    const uint64_t host = (uint64_t)(o->hm.bytes + o->hv.bytes);
    EXPECT(device == (uint64_t)(end - split) * 8 && host == (uint64_t)(split - first) * 8 &&
               device == llmt_controller_placed_bytes(&r->tr->ctl),
           "step %d: [%lld, %lld) with %d layers offloaded: %llu device and %llu host bytes of "
           "state, the controller predicts %llu device bytes, the split %lld gives %lld and %lld",
           step, (long long)first, (long long)end, off, (unsigned long long)device,
           (unsigned long long)host, (unsigned long long)llmt_controller_placed_bytes(&r->tr->ctl),
           (long long)split, (long long)(end - split) * 8, (long long)(split - first) * 8);
    return (int64_t)host;
}

/* An adaptive run's device budget before its first step: what this rank
 * holds now and the arena of full recompute at micro-batch MICRO (the
 * controller's figure, which before the first step places no optimizer
 * state), less half this rank's optimizer state: full recompute does not
 * fit, offloading half the state does. Not test_dp.c's tight_budget (room
 * for half the arena beside the state): on CUDA the arena is mostly the
 * GEMM's fixed workspace, which no notch shrinks. */
static uint64_t tight_budget(const run *r)
{
    const llmt_controller *c = &r->tr->ctl;
    uint64_t arena = 0;
    must(llmt_controller_bytes(c, (int64_t)(LLMT_LADDER_LEVELS - 1) * c->layers, &arena),
         "the arena of full recompute");
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    return ms.total_current + arena - ms.current[LLMT_MEM_OPTIMIZER] / 2;
}

/* adaptive_step_agreed, and this rank's optimizer's device bytes are
 * predicted. Returns the notch. */
static int64_t adaptive_step(run *r, int i, uint64_t budget, double *loss)
{
    adaptive_step_agreed(r, i, budget, loss);
    expect_predicted(r, i + 1);
    return r->tr->ctl.notch;
}

/* Adaptive (memory.adaptive) and deterministic, fp32, over the engine,
 * under tight_budget (device memory): no recompute notch fits, so step 1
 * runs out of memory on every rank and the ranks agree on an offload rung
 * (the heaviest of their least fitting ones); some rank's state moves to
 * the host, where the pipelined host AdamW updates it. Before step TIGHT + 1
 * the budget grows eightfold and the controller relaxes a notch a step,
 * moving state back to device memory. At every step every rank has the
 * same notch and offload and its device state bytes are the controller's
 * prediction; after STEPS_CUDA steps the weights, this rank's range, the
 * gathered state and the losses are bitwise ref's (one process, no
 * budget). */
static void test_adaptive_offload(const char *dir, llmt_comm *comm, const run *ref,
                                  const double *ref_loss)
{
    enum { TIGHT = 3 };
    const double start = MPI_Wtime();
    static char log[8192];
    log[0] = '\0';
    run ad;
    double loss[STEPS_CUDA];
    adaptive = 1;
    run_open(&ad, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    adaptive = 0;
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    const uint64_t budget = tight_budget(&ad);
    must(llmt_context_set_budget(ad.ctx, budget), "budget");
    int64_t host = 0, host_max = 0, tight_notch = -1, notch = -1;
    int straddles = 0, any_straddles = 0;
    for (int i = 0; i < STEPS_CUDA; i++) {
        if (i == TIGHT) {
            host = expect_predicted(&ad, i);
            straddles = ad.opt->first < ad.opt->split && ad.opt->split < ad.opt->end;
            tight_notch = notch;
            must(llmt_context_set_budget(ad.ctx, budget * 8), "budget");
        }
        notch = adaptive_step(&ad, i, i < TIGHT ? budget : 0, loss);
    }
    MPI_Allreduce(&host, &host_max, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&straddles, &any_straddles, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    /* The cases the budget was chosen for, so the test cannot degrade. */
    EXPECT(host_max > 0 && any_straddles && strstr(log, "step 1: out of memory") &&
               strstr(log, "optimizer state offloaded: embedding and layers"),
           "no rank's state went to the host under the budget, or no rank's range straddles "
           "the split (most host bytes %lld, straddling %d); log:\n%s", (long long)host_max,
           any_straddles, log);
    EXPECT(notch < tight_notch && strstr(log, "relaxing from"), "no relaxing after the budget "
           "grew (notch %lld, %lld under the budget); log:\n%s", (long long)notch,
           (long long)tight_notch, log);
    expect_same(&ad, ref, "adaptive under a budget");
    EXPECT(memcmp(loss, ref_loss, sizeof loss) == 0, "adaptive under a budget: losses differ "
           "(step %d: %.17g vs %.17g)", STEPS_CUDA, loss[STEPS_CUDA - 1],
           ref_loss[STEPS_CUDA - 1]);
    if (rank == 0)
        printf("adaptive with offload on %d ranks (emulated CUDA, NCCL engine): notch %lld under "
               "the budget, %lld after, most host bytes %lld, bitwise %s (%.1f s)\n", size,
               (long long)tight_notch, (long long)notch, (long long)host_max,
               failures ? "NO" : "yes", MPI_Wtime() - start);
    run_close(&ad);
}

static void test_precision(const char *dir, int precision, const char *name, llmt_comm *comm)
{
    double ref_loss[STEPS_CUDA], dp_loss[STEPS_CUDA];
    run ref, dp;
    run_open(&ref, dir, precision, NULL, 0, NULL, 0, 77);
    train(&ref, STEPS_CUDA, ref_loss);
    run_open(&dp, dir, precision, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    train(&dp, STEPS_CUDA, dp_loss);
    EXPECT(llmt_optimizer_step_count(dp.opt) == STEPS_CUDA &&
               llmt_optimizer_step_count(ref.opt) == STEPS_CUDA,
           "%s: %lld and %lld updates, not %d", name, (long long)llmt_optimizer_step_count(dp.opt),
           (long long)llmt_optimizer_step_count(ref.opt), STEPS_CUDA);
    char what[96];
    snprintf(what, sizeof what, "%s deterministic on %d ranks", name, size);
    expect_same(&dp, &ref, what);
    EXPECT(memcmp(dp_loss, ref_loss, sizeof dp_loss) == 0, "%s: losses differ (step %d: %.17g vs "
           "%.17g)", what, STEPS_CUDA, dp_loss[STEPS_CUDA - 1], ref_loss[STEPS_CUDA - 1]);
    EXPECT(ref_loss[STEPS_CUDA - 1] < ref_loss[0], "%s: the reference did not learn (%g -> %g)",
           name, ref_loss[0], ref_loss[STEPS_CUDA - 1]);
    if (precision == LLMT_PRECISION_FP32) { /* set_state writes each rank's part on the device */
        int round_trip = 1;
        for (int32_t i = 0; i < dp.model->n_params; i++) {
            const llmt_param *p = &dp.model->params[i];
            size_t n = (size_t)p->numel;
            float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
            for (size_t j = 0; j < n; j++)
                in[j] = (float)((size_t)p->offset + j) * 0.25f - 3.0f; /* exact in fp32 */
            must(llmt_optimizer_set_state(dp.opt, LLMT_OPT_STATE_EXP_AVG_SQ, p->name, in, n),
                 "set_state");
            must(llmt_optimizer_get_state(dp.opt, LLMT_OPT_STATE_EXP_AVG_SQ, p->name, out, n),
                 "get_state");
            round_trip &= memcmp(in, out, n * sizeof *in) == 0;
            free(in);
            free(out);
        }
        EXPECT(round_trip, "%s: set_state then get_state differ", what);
    }
    if (precision == LLMT_PRECISION_FP32)
        test_adaptive_offload(dir, comm, &ref, ref_loss);
    if (rank == 0)
        printf("%s on %d ranks (emulated CUDA, NCCL engine): bitwise %s\n", name, size,
               failures ? "NO" : "yes");
    run_close(&dp);
    run_close(&ref);
}

/* The first micro-batch size (rows) whose micro-batch count the ranks do
 * not divide, so that some round has a rank with no micro-batch; the
 * default when every count divides (one rank). */
static int32_t uneven_micro(void)
{
    for (int32_t rows = 2; rows < B; rows++) {
        int32_t count = (B + rows - 1) / rows;
        if (count > 1 && count % size != 0)
            return rows;
    }
    return MICRO;
}

/* The engine's alltoallv_add and join, and how often test_overlap's
 * stand-in for alltoallv_add was called. */
static int (*engine_add)(void *, const void *, const size_t *, const size_t *, void *,
                         const size_t *, const size_t *, float *, int64_t, int);
static int (*engine_join)(void *);
static int64_t add_calls;

/* One alltoallv_add held back by deferring_add: its arguments, the four
 * count arrays copied (the caller reuses its own). */
typedef struct held_add {
    void *user;
    const void *send;
    void *recv;
    float *sum;
    int64_t n;
    int dt;
    size_t *counts; /* send bytes, send offsets, recv bytes, recv offsets: size each */
} held_add;

static held_add *held;
static size_t held_count, held_cap;

/* A slow engine's alltoallv_add: counted and held, run only at the next
 * join (deferring_join). A GPU's engine may run a queued exchange at any
 * time before the join's wait ends; the emulator's runs it at once. Held,
 * it reads its send buffer as late as a real engine may, so a buffer
 * written again before the join (a gradient slot reloaded for the next
 * bucket) sends the new bytes and changes the sums. */
static int deferring_add(void *user, const void *send, const size_t *send_bytes,
                         const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                         const size_t *recv_offsets, float *sum, int64_t n, int dt)
{
    add_calls++;
    if (held_count == held_cap) {
        size_t cap = held_cap ? 2 * held_cap : 64;
        held_add *more = realloc(held, cap * sizeof *more);
        if (!more)
            return llmt_fail(LLMT_ENOMEM, "deferring_add: out of host memory");
        held = more, held_cap = cap;
    }
    size_t *counts = malloc(4 * (size_t)size * sizeof *counts);
    if (!counts)
        return llmt_fail(LLMT_ENOMEM, "deferring_add: out of host memory");
    const size_t *from[4] = {send_bytes, send_offsets, recv_bytes, recv_offsets};
    for (int k = 0; k < 4; k++)
        memcpy(counts + (size_t)k * (size_t)size, from[k], (size_t)size * sizeof *counts);
    held[held_count++] = (held_add){user, send, recv, sum, n, dt, counts};
    return 0;
}

/* The join of deferring_add's engine: the held exchanges in the order
 * they were queued, then the engine's join. */
static int deferring_join(void *user)
{
    int rc = 0;
    for (size_t i = 0; i < held_count; i++) {
        const held_add *h = &held[i];
        const size_t *c = h->counts, z = (size_t)size;
        if (!rc)
            rc = engine_add(h->user, h->send, c, c + z, h->recv, c + 2 * z, c + 3 * z, h->sum,
                            h->n, h->dt);
        free(h->counts);
    }
    held_count = 0;
    return rc ? rc : engine_join(user);
}

/* This rank's fast window (the micro-batches it adds before an exchange in
 * fast mode: [floor(c r / N), floor(c (r + 1) / N)) of c), worked out by
 * hand, and in *count the step's micro-batch count c at `micro` rows. */
static int32_t fast_window(int32_t *count)
{
    *count = (B + micro - 1) / micro;
    return *count * (rank + 1) / size - *count * rank / size;
}

/* What an overlapped bf16_mixed run of test_overlap keeps in host memory
 * (mode: its reduce mode; parts: its offload of every layer): the
 * offloaded gradients' host copy is none where this rank adds one
 * micro-batch at a time (each offloaded bucket sent from its slot), the
 * embedding's bucket (VOCAB x 32 elements) of a tied model (the LM head
 * writes it in the forward, so it is stored once), all of them where a
 * fast window holds two micro-batches;
 * and the context's host bytes are llmt_plan_compute's for this rank, to
 * the byte. */
static void expect_grad_home(const run *r, int mode, int32_t parts, const char *what)
{
    const llmt_model *m = r->model;
    int32_t count = 0;
    const int32_t window = fast_window(&count);
    int64_t elems = 0;
    if (parts && mode == LLMT_REDUCE_FAST && window >= 2)
        elems = m->grad_split;
    else if (parts && tied)
        elems = m->grad_split < VOCAB * 32 ? m->grad_split : VOCAB * 32;
    EXPECT(m->host_grads.bytes == (size_t)elems * 2, "%s: rank %d (%d micro-batches of %d) keeps "
           "%zu bytes of offloaded gradients in host memory, not %lld", what, rank,
           mode == LLMT_REDUCE_FAST ? window : 1, count, m->host_grads.bytes,
           (long long)elems * 2);
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    dp_model_config(&pc.model, LLMT_PRECISION_BF16_MIXED);
    pc.micro_batch = micro;
    pc.seq_len = T;
    pc.world_size = size;
    pc.rank = rank;
    pc.batch_size = B;
    pc.offload_parts = parts;
    pc.reduce_mode = mode;
    llmt_plan plan = LLMT_PLAN_INIT;
    must(llmt_plan_compute(r->ctx, &pc, &plan), "plan");
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    EXPECT(plan.host_peak == ms.current[LLMT_MEM_HOST_STATE], "%s: rank %d holds %llu host "
           "bytes, the plan says %llu", what, rank,
           (unsigned long long)ms.current[LLMT_MEM_HOST_STATE],
           (unsigned long long)plan.host_peak);
}

/* The controller's host bytes for everything offloaded (the top offload
 * rung, as llmt_controller_host_cap counts them) against what the
 * overlapped run r of test_overlap holds so placed (mode: its reduce
 * mode): under a host budget of r's host bytes now, the cap is the top
 * rung where the controller counts what the step kept, and lower where it
 * counts more. It counts the most any micro-batch count 1..B could make a
 * step keep: in deterministic mode what a step keeps at one micro-batch
 * per exchange (expect_grad_home's), in fast mode every offloaded
 * gradient (at B micro-batches every rank's window holds two or more),
 * which a rank whose window holds one micro-batch now does not keep. The
 * controller is attached to r's optimizer, which the test placed (not one
 * llmt_controller_placeable allows), only to read its count at r's
 * placement, the top rung's. */
static void expect_controller_host(const run *r, int mode, const char *what)
{
    int32_t count = 0;
    const int32_t window = fast_window(&count);
    const int keeps_most = mode != LLMT_REDUCE_FAST || window >= 2;
    llmt_controller c;
    llmt_controller_init(&c, r->model, NULL, B, T, 0, micro);
    must(llmt_controller_attach(&c, r->opt, 1, 1), "attach a controller");
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    must(llmt_context_set_host_budget(r->ctx, ms.current[LLMT_MEM_HOST_STATE]), "host budget");
    const int32_t cap = llmt_controller_host_cap(&c);
    must(llmt_context_set_host_budget(r->ctx, ms.host_budget), "the host budget back");
    EXPECT(keeps_most ? cap == c.layers + 1 : cap <= c.layers, "%s: rank %d (%d micro-batches "
           "of %d): under a host budget of the %llu bytes it holds with everything offloaded, "
           "the controller's cap is rung %d of %d", what, rank,
           mode == LLMT_REDUCE_FAST ? window : 1, count,
           (unsigned long long)ms.current[LLMT_MEM_HOST_STATE], (int)cap, (int)c.layers + 1);
}

/* The reduction overlapped with backward (a bucket queued as backward ends
 * it, on deferring_add's slow engine; counted, so a path that never
 * overlaps fails) against the same engine without it (each round's
 * exchange after its backward, comm->alltoallv_add cleared): after 3
 * bf16_mixed steps, bitwise the same weights and state, and the same bytes
 * sent, in both reduce modes, with a micro-batch count the ranks do not
 * divide (deterministic mode then has a round in which a rank has none);
 * and so with the gradients of the embedding and every layer offloaded
 * (LLMT_OFFLOAD_GRADS), untied and tied (the embedding's bucket, which the
 * LM head writes in the forward, stored and reloaded once), which the
 * overlapped reduction sends from the two slots of the gradient bucket as
 * backward leaves them there (each slot reloaded after its exchange was
 * queued, which must wait for it), and the exchange after backward uploads
 * from host memory; after the overlapped run no offloaded bucket's host
 * part holds a gradient (each was sent from its slot, none stored after
 * its last write), and what it keeps in host memory is expect_grad_home's,
 * also after a write of one gradient (which makes room for all of them)
 * and one more step (whose rounds' zeroing gives the room back), and the
 * controller's count of it expect_controller_host's. */
static void test_overlap(const char *dir, llmt_comm *comm)
{
    EXPECT(comm->alltoallv_add && comm->join, "the NCCL engine has no overlapped reduction");
    if (!comm->alltoallv_add || !comm->join)
        return;
    const int32_t saved_micro = micro;
    micro = uneven_micro();
    const int modes[2] = {LLMT_REDUCE_DETERMINISTIC, LLMT_REDUCE_FAST};
    engine_add = comm->alltoallv_add;
    engine_join = comm->join;
    for (int i = 0; i < 6; i++) {
        const int mode = modes[i % 2];
        const int32_t parts = i < 2 ? LLMT_OFFLOAD_NONE
                                    : LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
        tied = i >= 4;
        run plain, overlapped;
        int64_t sent0 = llmt_comm_bytes_sent(comm);
        comm->alltoallv_add = NULL;
        run_open(&plain, dir, LLMT_PRECISION_BF16_MIXED, comm, mode, NULL, 0, 77);
        must(llmt_optimizer_set_offload(plain.opt, parts, LLMT_OFFLOAD_ALL_LAYERS), "offload");
        train(&plain, 3, NULL);
        comm->alltoallv_add = deferring_add;
        comm->join = deferring_join;
        add_calls = 0;
        int64_t sent1 = llmt_comm_bytes_sent(comm);
        run_open(&overlapped, dir, LLMT_PRECISION_BF16_MIXED, comm, mode, NULL, 0, 77);
        must(llmt_optimizer_set_offload(overlapped.opt, parts, LLMT_OFFLOAD_ALL_LAYERS),
             "offload");
        train(&overlapped, 3, NULL);
        int64_t sent2 = llmt_comm_bytes_sent(comm);
        comm->alltoallv_add = engine_add;
        comm->join = engine_join;
        char what[128];
        snprintf(what, sizeof what, "%s, overlapped, micro-batches of %d rows%s%s",
                 mode == LLMT_REDUCE_FAST ? "fast" : "deterministic", micro,
                 parts ? ", gradients offloaded" : "", tied ? ", tied" : "");
        const llmt_model *m = overlapped.model;
        EXPECT(!parts || m->grad_split > 0, "%s: no gradient is offloaded", what);
        for (int32_t b = 0; b < llmt_grad_bucket_count(m); b++) {
            int64_t s = 0, e = 0;
            llmt_grad_bucket_range(m, b, &s, &e);
            EXPECT(s >= m->grad_split || !m->host_valid[b], "%s: bucket %d's host part holds "
                   "values after the step (stored or settled, not sent from its slot)", what,
                   (int)b);
        }
        expect_grad_home(&overlapped, mode, parts, what);
        if (parts)
            expect_controller_host(&overlapped, mode, what);
        EXPECT(same_weights(&overlapped, &plain), "%s: the weights differ from the exchange "
               "after backward", what);
        EXPECT(same_state(&overlapped, &plain), "%s: the optimizer state differs from the "
               "exchange after backward", what);
        EXPECT(sent2 - sent1 == sent1 - sent0, "%s: %lld bytes sent, %lld after backward", what,
               (long long)(sent2 - sent1), (long long)(sent1 - sent0));
        /* At least every bucket of every step once (layers + 2 buckets). */
        EXPECT(add_calls >= 3 * (layers + 2), "%s: %lld overlapped exchanges in 3 steps",
               what, (long long)add_calls);
        if (parts) { /* a write makes room for every gradient; the next step gives it back */
            float one = 1.0f;
            must(llmt_grads_io(overlapped.model, 0, 1, &one, 1), "write a gradient");
            EXPECT(overlapped.model->host_grads.bytes == (size_t)m->grad_split * 2,
                   "%s: a write made room for %zu bytes", what,
                   overlapped.model->host_grads.bytes);
            comm->alltoallv_add = deferring_add;
            comm->join = deferring_join;
            train(&overlapped, 1, NULL);
            comm->alltoallv_add = engine_add;
            comm->join = engine_join;
            expect_grad_home(&overlapped, mode, parts, what);
            expect_controller_host(&overlapped, mode, what);
        }
        run_close(&overlapped);
        run_close(&plain);
    }
    EXPECT(held_count == 0, "%zu exchanges held after the last join", held_count);
    free(held);
    held = NULL, held_cap = 0;
    micro = saved_micro;
    tied = 0;
    if (rank == 0)
        printf("overlapped reduction on %d ranks (emulated CUDA, NCCL engine, exchanges held "
               "until the join): bitwise %s\n", size, failures ? "NO" : "yes");
}


/* The offloaded prefix of test_offload: the embedding and layer 0, whose
 * end lies inside a rank's range at 2 and at 3 ranks (asserted; with these
 * runs' model and granules, rank 0's at 2 ranks, rank 1's at 3, where rank
 * 0's range lies wholly inside the prefix and rank 2's past it). */
enum { OFFLOAD_LAYERS = 1, OFFLOAD_STEPS = 3 };

/* A sharded optimizer over the engine whose range's part inside the
 * prefix is offloaded (LLMT_OFFLOAD_OPTIMIZER, OFFLOAD_LAYERS of the
 * layers): the host AdamW of a rank that straddles the split runs the
 * pipelined update (the staging, the copy-stream fences) on the reduced
 * gradient sum it downloads from the device, not on the model's own
 * gradients, which at 2+ ranks differ from the sum. After OFFLOAD_STEPS
 * steps the weights, this rank's range (host and device segments) and the
 * gathered state are bitwise those of the same run without offload. fp32
 * offloads before the first step (the pipeline downloads the weights too);
 * bf16_mixed after the first (the state, master weights included, moves to
 * the host mid-run), and again with the gradients of the prefix too
 * (LLMT_OFFLOAD_GRADS: the overlapped exchange sends each offloaded
 * bucket from its slot of the gradient bucket as backward finishes it). */
static void test_offload(const char *dir, llmt_comm *comm)
{
    const int precisions[3] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                               LLMT_PRECISION_BF16_MIXED};
    const int32_t parts[3] = {LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_OPTIMIZER,
                              LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS};
    const double start = MPI_Wtime();
    for (int i = 0; i < 3; i++) {
        const int moved_after = i > 0; /* steps before the offload */
        run plain, offloaded;
        run_open(&plain, dir, precisions[i], comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
        train(&plain, OFFLOAD_STEPS, NULL);
        run_open(&offloaded, dir, precisions[i], comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
        train(&offloaded, moved_after, NULL);
        must(llmt_optimizer_set_offload(offloaded.opt, parts[i], OFFLOAD_LAYERS),
             "offload the sharded optimizer's state");
        train(&offloaded, OFFLOAD_STEPS - moved_after, NULL);
        const llmt_optimizer *o = offloaded.opt;
        /* The prefix ends where layer OFFLOAD_LAYERS begins (the embedding is
         * stored first); the ranks' host segments together are that prefix. */
        const int64_t prefix = offloaded.model->layer[OFFLOAD_LAYERS].ln1;
        long long offloaded_elems = (long long)(o->split - o->first), all_offloaded = 0;
        int straddles = o->first < o->split && o->split < o->end, any_straddles = 0;
        MPI_Allreduce(&offloaded_elems, &all_offloaded, 1, MPI_LONG_LONG, MPI_SUM,
                      MPI_COMM_WORLD);
        MPI_Allreduce(&straddles, &any_straddles, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        char what[160];
        snprintf(what, sizeof what, "%s, state of [%lld, %lld) of [%lld, %lld) offloaded%s",
                 i ? "bf16_mixed" : "fp32", (long long)o->first, (long long)o->split,
                 (long long)o->first, (long long)o->end,
                 parts[i] & LLMT_OFFLOAD_GRADS ? ", gradients too" : "");
        const int64_t gs = parts[i] & LLMT_OFFLOAD_GRADS ? prefix / 4096 * 4096 : 0;
        EXPECT(offloaded.model->grad_split == gs && (gs > 0 || !(parts[i] & LLMT_OFFLOAD_GRADS)),
               "%s: the gradients split at %lld, not %lld", what,
               (long long)offloaded.model->grad_split, (long long)gs);
        EXPECT(all_offloaded == prefix, "%s: the ranks offloaded %lld elements, the prefix is "
               "%lld", what, all_offloaded, (long long)prefix);
        EXPECT(any_straddles, "%s: no rank's range straddles the split at %lld", what,
               (long long)prefix);
        EXPECT(llmt_optimizer_step_count(o) == OFFLOAD_STEPS, "%s: %lld updates, not %d", what,
               (long long)llmt_optimizer_step_count(o), OFFLOAD_STEPS);
        expect_same(&offloaded, &plain, what);
        run_close(&offloaded);
        run_close(&plain);
    }
    if (rank == 0)
        printf("sharded optimizer with offloaded state on %d ranks (emulated CUDA, NCCL engine): "
               "bitwise %s (%.1f s)\n", size, failures ? "NO" : "yes", MPI_Wtime() - start);
}

/* The call of the engine's alltoallv_add (counted from 0) that
 * refusing_add spoils on this rank; -1: none. */
static int64_t spoil_call = -1;

/* The engine's alltoallv_add, except that call spoil_call says this rank
 * receives a byte more from itself than it sends, which the engine
 * refuses (and then aborts). */
static int refusing_add(void *user, const void *send, const size_t *send_bytes,
                        const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                        const size_t *recv_offsets, float *sum, int64_t n, int dt)
{
    size_t spoiled[64];
    if (add_calls++ != spoil_call || size > 64)
        return engine_add(user, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets,
                          sum, n, dt);
    memcpy(spoiled, recv_bytes, (size_t)size * sizeof *spoiled);
    spoiled[rank]++;
    return engine_add(user, send, send_bytes, send_offsets, recv, spoiled, recv_offsets, sum, n,
                      dt);
}

/* A rank whose overlapped exchange fails mid-backward (rank 1's third
 * queued exchange is refused; its engine aborts): the step fails on every
 * rank, rank 1 naming the refusal, the others after the stand-in's bounded
 * wait (10 s here), their communicators aborted too, and no rank hangs; so
 * the release waits for no rank (a release barrier would wait 10 s). A
 * communicator of its own, made on ctx, serves it. With parts, the state
 * and gradients of every layer offloaded: the refused exchange is then an
 * offloaded bucket's, sent from its slot, and afterwards no slot is left
 * marked as read by the dead engine's exchanges (a load into either works). */
static void overlap_failure(const char *dir, llmt_context *ctx, int32_t parts)
{
    setenv("LLMT_FAKE_NCCL_TIMEOUT_S", "10", 1);
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES];
    shared_unique_id(ctx, id);
    llmt_comm *comm = NULL, *shared = device_comm;
    must(llmt_comm_create_nccl(&comm, ctx, id, rank, size), "a communicator for the failure");
    device_comm = comm;
    run r;
    run_open(&r, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    must(llmt_optimizer_set_offload(r.opt, parts, LLMT_OFFLOAD_ALL_LAYERS), "offload");
    engine_add = comm->alltoallv_add;
    comm->alltoallv_add = refusing_add;
    add_calls = 0;
    spoil_call = rank == 1 ? 2 : -1;
    llmt_step_report rep;
    memset(&rep, 0, sizeof rep);
    rep.version = LLMT_STEP_REPORT_VERSION;
    const double start = MPI_Wtime();
    int rc = llmt_trainer_step(r.tr, &rep);
    const double took = MPI_Wtime() - start;
    EXPECT(rc != LLMT_OK && llmt_error_last()[0], "rank %d: the step did not fail (status %d)",
           rank, rc);
    if (rank == 1)
        EXPECT(strstr(llmt_error_last(), "sends itself") != NULL, "rank 1: the refusal is not "
               "named: \"%s\"", llmt_error_last());
    else
        EXPECT(strstr(llmt_error_last(), "the communicator is aborted") != NULL, "rank %d: the "
               "communicator is not aborted: \"%s\"", rank, llmt_error_last());
    EXPECT(took < 60.0, "rank %d: the failed step took %.0f s", rank, took);
    printf("rank %d's failure: %s\n", rank, llmt_error_last());
    if (rank == 1)
        EXPECT(add_calls == 3, "rank 1: %lld exchanges queued, 3 expected (none after the "
               "refused one)", (long long)add_calls);
    llmt_model *m = r.model;
    if (parts) {
        int64_t s = 0, e = 0;
        llmt_grad_bucket_range(m, 1, &s, &e); /* the refused exchange's bucket */
        EXPECT(s < m->grad_split, "rank %d: bucket 1 is not offloaded", rank);
        for (int32_t b = 0; b < 2; b++) { /* slots 0 and 1 */
            char *base = NULL;
            EXPECT(llmt_grads_acquire(m, b, &base) == LLMT_OK, "rank %d: after the failure, "
                   "bucket %d does not load into its slot: %s", rank, (int)b, llmt_error_last());
        }
    }
    run_close(&r);
    comm->alltoallv_add = engine_add;
    spoil_call = -1;
    const double released = MPI_Wtime();
    llmt_comm_free(comm);
    EXPECT(MPI_Wtime() - released < 5.0, "rank %d: the release of the aborted communicator took "
           "%.1f s", rank, MPI_Wtime() - released);
    device_comm = shared;
    unsetenv("LLMT_FAKE_NCCL_TIMEOUT_S");
    if (rank == 0)
        printf("overlapped exchange refused on rank 1 (emulated CUDA, NCCL engine%s): every rank "
               "failed in %.0f s\n", parts ? ", every layer's gradients offloaded" : "", took);
}

static void test_overlap_failure(const char *dir, llmt_context *ctx)
{
    overlap_failure(dir, ctx, LLMT_OFFLOAD_NONE);
    overlap_failure(dir, ctx, LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS);
}

/* Seconds the last rank waits before it releases test_release_late's
 * communicator, eight times the stand-in's bounded wait there (0.5 s): room
 * for a loaded machine (3 ranks on 2 cores in CI). */
enum { RELEASE_LATE_S = 4 };

/* The last rank releases a communicator RELEASE_LATE_S seconds after the
 * others: their llmt_comm_free returns within the stand-in's bounded wait
 * (LLMT_FAKE_NCCL_TIMEOUT_S, 0.5 s for the release), well before the last
 * rank starts its release (a release that waited for it, as the stand-in's
 * ncclCommDestroy does, takes RELEASE_LATE_S or more), the engine's release
 * barrier failing and the communicator aborted, the message carrying
 * ncclGetLastError's text (the stand-in's own words); the last rank's
 * release then returns as soon. */
static void test_release_late(llmt_context *ctx)
{
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES];
    shared_unique_id(ctx, id);
    llmt_comm *comm = NULL;
    must(llmt_comm_create_nccl(&comm, ctx, id, rank, size), "a communicator released late");
    const int late = rank == size - 1;
    if (late)
        sleep(RELEASE_LATE_S);
    setenv("LLMT_FAKE_NCCL_TIMEOUT_S", "0.5", 1);
    llmt_error_clear();
    const double start = MPI_Wtime();
    llmt_comm_free(comm);
    const double took = MPI_Wtime() - start;
    EXPECT(took < RELEASE_LATE_S - 0.5, "rank %d%s: the release took %.2f s", rank,
           late ? " (late)" : "", took);
    if (!late)
        EXPECT(strstr(llmt_error_last(), "NCCL release: ncclAllReduce: ") &&
                   strstr(llmt_error_last(), "the communicator is aborted") &&
                   strstr(llmt_error_last(), "NCCL's last error: fake NCCL over MPI: "
                          "ncclAllReduce: rank "),
               "rank %d: the release's message: \"%s\"", rank, llmt_error_last());
    unsetenv("LLMT_FAKE_NCCL_TIMEOUT_S");
    if (rank == 0)
        printf("release with rank %d %d s late (emulated CUDA, NCCL engine): rank 0's returned in "
               "%.2f s: %s\n", size - 1, RELEASE_LATE_S, took, llmt_error_last());
}

/* Two releases checked by the engine's barrier. A release the last rank
 * joins 1 s late, within the stand-in's wait (10 s), is NCCL's graceful
 * one on every rank: no error. A release the last rank meets with a
 * one-value SUM all-reduce of its own (not a release) sums to the wrong
 * value: the others' release fails naming the barrier's sum, aborted; the
 * last rank's own release then waits for no peer past the stand-in's
 * bound (0.5 s). */
static void test_release_checked(llmt_context *ctx)
{
    const int last = rank == size - 1;
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES];
    setenv("LLMT_FAKE_NCCL_TIMEOUT_S", "10", 1);
    shared_unique_id(ctx, id);
    llmt_comm *comm = NULL;
    must(llmt_comm_create_nccl(&comm, ctx, id, rank, size), "a communicator released 1 s late");
    if (last)
        sleep(1);
    llmt_error_clear();
    llmt_comm_free(comm);
    EXPECT(llmt_error_last()[0] == '\0', "rank %d: a release 1 s late failed: \"%s\"", rank,
           llmt_error_last());

    shared_unique_id(ctx, id);
    must(llmt_comm_create_nccl(&comm, ctx, id, rank, size), "a communicator met out of step");
    llmt_error_clear();
    if (last) {
        int64_t one = 1;
        EXPECT(comm->ops.allreduce_i64(comm->ops.user, &one, 1, LLMT_COMM_SUM) == LLMT_OK,
               "rank %d: the all-reduce met by the others' release failed: %s", rank,
               llmt_error_last());
        setenv("LLMT_FAKE_NCCL_TIMEOUT_S", "0.5", 1);
    }
    const double start = MPI_Wtime();
    llmt_comm_free(comm);
    EXPECT(MPI_Wtime() - start < 5.0, "rank %d: the release met out of step took %.1f s", rank,
           MPI_Wtime() - start);
    if (!last)
        EXPECT(strstr(llmt_error_last(), "NCCL release: the barrier's sum is ") &&
                   strstr(llmt_error_last(), "the communicator is aborted"),
               "rank %d: the release met out of step: \"%s\"", rank, llmt_error_last());
    unsetenv("LLMT_FAKE_NCCL_TIMEOUT_S");
    if (rank == 0)
        printf("release met by another collective (emulated CUDA, NCCL engine): %s\n",
               llmt_error_last());
}

/* Whether a "saving synchronously" line was logged (user: an int). */
static void note_sync(void *user, const char *line)
{
    if (strstr(line, "saving synchronously"))
        *(int *)user = 1;
}

/* Step SAVED's checkpoint: saved by N ranks (format 2), resumed in one
 * process and by N ranks; saved by one process (format 1, rank 0's
 * reference), resumed by N ranks; each run to step 5 ends at the bits of
 * the uninterrupted run. */
static void test_resume(const char *dir, llmt_comm *comm)
{
    const int bf16 = LLMT_PRECISION_BF16_MIXED;
    char sharded[600], single[600];
    snprintf(sharded, sizeof sharded, "%s/ckpt", dir);
    snprintf(single, sizeof single, "%s/ckpt-single-%d", dir, rank); /* one per rank's reference */
    run ref, saver, first, again, from_single;
    run_open(&ref, dir, bf16, NULL, 0, NULL, 0, 77);
    train(&ref, STEPS_CUDA, NULL);
    run_open(&saver, dir, bf16, NULL, 0, single, SAVED, 77);
    train(&saver, SAVED, NULL);
    must(llmt_trainer_save(saver.tr, LLMT_CKPT_DURABLE), "the wait for step 3"); /* async */
    run_close(&saver);
    run_open(&first, dir, bf16, comm, LLMT_REDUCE_DETERMINISTIC, sharded, SAVED, 77);
    int logged_sync = 0;
    must(llmt_trainer_set_log(first.tr, note_sync, &logged_sync), "log");
    train(&first, SAVED, NULL);
    must(llmt_trainer_save(first.tr, LLMT_CKPT_DURABLE), "the save of step 3");
    EXPECT(logged_sync, "the async save on device memory did not fall back to a synchronous one");
    run_close(&first);
    int64_t step = -1;
    if (rank == 0) { /* world size N -> 1 */
        run solo;
        run_open(&solo, dir, bf16, NULL, 0, sharded, 0, 5);
        must(llmt_trainer_resume_latest(solo.tr, &step), "resume alone");
        EXPECT(step == SAVED, "resumed alone from step %lld, not %d", (long long)step, SAVED);
        train(&solo, STEPS_CUDA - SAVED, NULL);
        expect_same(&solo, &ref, "resumed in one process");
        run_close(&solo);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* Another seed: every weight must come from the checkpoint. */
    run_open(&again, dir, bf16, comm, LLMT_REDUCE_DETERMINISTIC, sharded, 0, 5);
    must(llmt_trainer_resume_latest(again.tr, &step), "resume");
    EXPECT(step == SAVED, "resumed from step %lld, not %d", (long long)step, SAVED);
    train(&again, STEPS_CUDA - SAVED, NULL);
    expect_same(&again, &ref, "resumed on N ranks");
    run_close(&again);
    /* Rank 0's reference checkpoint (rank 0 alone holds the store). */
    snprintf(single, sizeof single, "%s/ckpt-single-0", dir);
    run_open(&from_single, dir, bf16, comm, LLMT_REDUCE_DETERMINISTIC, single, 0, 5);
    must(llmt_trainer_resume_latest(from_single.tr, &step), "resume from format 1");
    EXPECT(step == SAVED, "resumed from one process's step %lld, not %d", (long long)step, SAVED);
    train(&from_single, STEPS_CUDA - SAVED, NULL);
    expect_same(&from_single, &ref, "one process's checkpoint resumed on N ranks");
    run_close(&from_single);
    run_close(&ref);
    if (rank == 0)
        printf("checkpoints on %d ranks (emulated CUDA, NCCL engine): resumed bitwise %s\n", size,
               failures ? "NO" : "yes");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    backend = LLMT_BACKEND_CUDA;
    heads = 1; /* heads of 32 elements, as the CUDA kernels take */
    kv_heads = 1;
    llmt_comm_mpi *host = NULL;
    must(llmt_comm_mpi_create(&host, MPI_COMM_WORLD), "comm");
    llmt_context *nccl_ctx = NULL;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.backend = LLMT_BACKEND_CUDA;
    cc.num_threads = 1;
    must(llmt_context_create(&nccl_ctx, &cc), "the NCCL communicator's context");
    test_other_unique_id(nccl_ctx);
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES];
    shared_unique_id(nccl_ctx, id);
    llmt_comm *nccl = NULL;
    must(llmt_comm_create_nccl(&nccl, nccl_ctx, id, rank, size), "NCCL communicator");
    device_comm = nccl;
    char dir[] = "/tmp/llmt-dp-cuda-XXXXXX";
    if (rank == 0 && !mkdtemp(dir))
        must(LLMT_EIO, "mkdtemp");
    if (rank == 0)
        write_shard(dir);
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);

    test_host_comm_refused(host->comm);
    test_other_context_refused(nccl);
    test_weights_disagree(nccl);
    test_precision(dir, LLMT_PRECISION_FP32, "fp32", nccl);
    test_precision(dir, LLMT_PRECISION_BF16_MIXED, "bf16_mixed", nccl);
    test_overlap(dir, nccl);
    test_offload(dir, nccl);
    test_resume(dir, nccl);
    test_overlap_failure(dir, nccl_ctx);
    test_release_late(nccl_ctx);
    test_release_checked(nccl_ctx);

    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (rank == 0 && system(cmd) != 0)
        fprintf(stderr, "rank %d: could not remove %s\n", rank, dir);
    llmt_comm_free(nccl);
    llmt_context_free(nccl_ctx);
    llmt_comm_mpi_free(host);
    MPI_Finalize();
    if (rank == 0)
        printf("%s\n", all ? "FAILED" : "all passed");
    return all ? 1 : 0;
}
