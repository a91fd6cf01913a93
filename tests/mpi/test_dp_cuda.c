/* Data-parallel training on the CUDA backend, under mpiexec -n N with the
 * emulated plugin (tests/gpu/emulate.sh runs it at 2 and 3 ranks with
 * LLMT_CUDA_PLUGIN set; it is no CTest test: on a GPU, MPI cannot move
 * device memory).
 *
 * On the emulator device memory is plain host memory, so an MPI
 * communicator can move it: the test flags one as a device-memory
 * communicator (lib/dist/comm_internal.h), as an NCCL one is, and the
 * sharded optimizer and the trainer then run their CUDA code paths (the
 * gradient exchange on device buffers, the owner's fp32 sum, the rounding,
 * the norm's host partials, AdamW on the sum, the weight all-gather,
 * get/set_state, sharded checkpoints written and read through device
 * copies). It exercises everything but NCCL's transport (and what only a
 * GPU shows: tests/gpu/run.sh's nccl-sharded stage).
 *
 * It checks: a CUDA model with a host-memory communicator is refused,
 * naming NCCL, and one with a communicator of another context; other
 * weights on one rank (hashed through host copies) are refused; in deterministic mode, after 5 steps (fp32 and bf16_mixed, 6
 * micro-batches of 2 rows) the weights, each rank's optimizer range (read
 * from its device buffers), the gathered state and the losses are bitwise
 * those of one emulated-CUDA process with an ordered slicer and the same
 * global batch; set_state then get_state round-trips every tensor; a
 * sharded checkpoint saved at N ranks at step 3 (synchronously: the log
 * says so) resumes in one process and at N ranks, and one process's
 * checkpoint (format 1) at N ranks, each to the uninterrupted run's bits
 * after step 5. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "core/context_internal.h"
#include "dp_run.h"
#include "dist/comm_internal.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"

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

/* dp's optimizer range [first, end) of each state section, read from its
 * device buffers, against the same elements of the unsharded ref's. */
static int same_range(const run *dp, const run *ref)
{
    const llmt_optimizer *o = dp->opt, *q = ref->opt;
    int same = 1;
    for (int sec = 0; sec < (o->has_master ? 3 : 2); sec++) {
        const llmt_buf *host, *b, *c;
        llmt_offload_section(o, sec, &host, &b);
        llmt_offload_section(q, sec, &host, &c);
        size_t es = llmt_dtype_size(sec == 2 ? LLMT_DTYPE_F32 : o->state_dt);
        size_t bytes = (size_t)(o->end - o->first) * es;
        void *x = host_copy(dp->model, b->ptr, bytes);
        void *y = host_copy(ref->model, (const char *)c->ptr + (size_t)o->first * es, bytes);
        same &= memcmp(x, y, bytes) == 0;
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
    EXPECT(same_weights(dp, ref), "%s: the weights differ from one process's", what);
    if (dp->opt->comm)
        EXPECT(same_range(dp, ref), "%s: this rank's optimizer range [%lld, %lld) differs from "
               "one process's", what, (long long)dp->opt->first, (long long)dp->opt->end);
    EXPECT(same_state(dp, ref), "%s: the optimizer state differs from one process's", what);
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
    if (rank == 0)
        printf("%s on %d ranks (emulated CUDA): bitwise %s\n", name, size, failures ? "NO" : "yes");
    run_close(&dp);
    run_close(&ref);
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
        printf("checkpoints on %d ranks (emulated CUDA): resumed bitwise %s\n", size,
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
    llmt_comm_mpi *host = NULL, *dev = NULL;
    must(llmt_comm_mpi_create(&host, MPI_COMM_WORLD), "comm");
    must(llmt_comm_mpi_create(&dev, MPI_COMM_WORLD), "comm");
    device_comm = dev->comm; /* device memory is host memory here: MPI moves it */
    char dir[] = "/tmp/llmt-dp-cuda-XXXXXX";
    if (rank == 0 && !mkdtemp(dir))
        must(LLMT_EIO, "mkdtemp");
    if (rank == 0)
        write_shard(dir);
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);

    test_host_comm_refused(host->comm);
    test_other_context_refused(dev->comm);
    test_weights_disagree(dev->comm);
    test_precision(dir, LLMT_PRECISION_FP32, "fp32", dev->comm);
    test_precision(dir, LLMT_PRECISION_BF16_MIXED, "bf16_mixed", dev->comm);
    test_resume(dir, dev->comm);

    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (rank == 0 && system(cmd) != 0)
        fprintf(stderr, "rank %d: could not remove %s\n", rank, dir);
    llmt_comm_mpi_free(dev);
    llmt_comm_mpi_free(host);
    MPI_Finalize();
    if (rank == 0)
        printf("%s\n", all ? "FAILED" : "all passed");
    return all ? 1 : 0;
}
