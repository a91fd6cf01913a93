/* Benchmark of data-parallel steps on the CPU backend: one process, or one
 * rank of an mpiexec job, trains the "small" model (dim 512, 8 layers, FFN
 * 1408, vocab 8192; global batch 4 x 512 in micro-batches of 2) and prints
 * one line with its step times (min and median after a warm-up step), and
 * for ranks the share of the step spent inside the collectives and the
 * bytes this rank sends per step, against ZeRO-1's minimum of
 * 2 x params x dtype bytes x (N - 1) / N (a reduce-scatter of the gradients
 * and an all-gather of the weights).
 *
 * Usage: bench_dp single|deterministic|fast [steps] [threads] [fp32|bf16]
 *                 [none|optimizer|optimizer+grads]
 * The last argument offloads the optimizer's state of every layer (and with
 * optimizer+grads the gradients) to host memory. tests/bench/run_dp.sh
 * alternates `-n 2` one thread each with one process of two threads, or
 * (`offload`) `-n 2` without offload and with, and gives the ratios
 * (docs/PERFORMANCE.md). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "bench_util.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"

enum { VOCAB = 8192, B = 4, MICRO = 2, T = 512 };

static void must(int rc, const char *what)
{
    if (rc != LLMT_OK) {
        fprintf(stderr, "bench_dp: %s: %s\n", what, llmt_error_last());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* The adapter's collectives, timed. */
static llmt_comm_ops inner;
static double comm_seconds;

static int timed_alltoallv(void *u, const void *s, const size_t *sb, const size_t *so, void *r,
                           const size_t *rb, const size_t *ro)
{
    double t = bench_now();
    int rc = inner.alltoallv(u, s, sb, so, r, rb, ro);
    comm_seconds += bench_now() - t;
    return rc;
}

static int timed_allgatherv(void *u, const void *s, void *r, const size_t *b, const size_t *o)
{
    double t = bench_now();
    int rc = inner.allgatherv(u, s, r, b, o);
    comm_seconds += bench_now() - t;
    return rc;
}

static int timed_broadcast(void *u, void *buf, size_t bytes, int32_t root)
{
    double t = bench_now();
    int rc = inner.broadcast(u, buf, bytes, root);
    comm_seconds += bench_now() - t;
    return rc;
}

static int timed_allreduce(void *u, int64_t *v, size_t n, int32_t op)
{
    double t = bench_now();
    int rc = inner.allreduce_i64(u, v, n, op);
    comm_seconds += bench_now() - t;
    return rc;
}

/* A shard of random tokens, written by rank 0 into a fresh directory. */
static void make_data(char *dir)
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        if (!mkdtemp(dir))
            must(LLMT_EIO, "mkdtemp");
        enum { N = 64 * B * T + 1 };
        static int32_t tokens[N];
        uint32_t x = 99u;
        for (int i = 0; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            tokens[i] = (int32_t)((x >> 8) % VOCAB);
        }
        char path[600];
        snprintf(path, sizeof path, "%s/train_000000.bin", dir);
        must(llmt_shard_write(path, tokens, N, LLMT_SHARD_VERSION_U16), "shard");
    }
    MPI_Bcast(dir, 32, MPI_CHAR, 0, MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "deterministic";
    int steps = argc > 2 ? atoi(argv[2]) : 6, threads = argc > 3 ? atoi(argv[3]) : 1;
    int bf16 = argc > 4 && strcmp(argv[4], "bf16") == 0;
    const char *offload = argc > 5 ? argv[5] : "none";
    const int32_t parts = !strcmp(offload, "none")        ? LLMT_OFFLOAD_NONE
                        : !strcmp(offload, "optimizer") ? LLMT_OFFLOAD_OPTIMIZER
                        : !strcmp(offload, "optimizer+grads")
                            ? LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS
                            : -1;
    int single = strcmp(mode, "single") == 0;
    if ((!single && strcmp(mode, "deterministic") != 0 && strcmp(mode, "fast") != 0) ||
        steps < 2 || steps > 1000 || threads < 1 || (single && size > 1) || parts < 0) {
        fprintf(stderr, "usage: bench_dp single|deterministic|fast [steps >= 2] [threads] "
                        "[fp32|bf16] [none|optimizer|optimizer+grads] (single: one process)\n");
        MPI_Finalize();
        return 2;
    }
    char dir[32] = "/tmp/llmt-bench-dp-XXXXXX";
    make_data(dir);

    llmt_comm_mpi *m = NULL;
    llmt_comm *comm = NULL;
    if (!single) {
        must(llmt_comm_mpi_create(&m, MPI_COMM_WORLD), "adapter");
        inner = m->ops;
        llmt_comm_ops ops = m->ops;
        ops.alltoallv = timed_alltoallv;
        ops.allgatherv = timed_allgatherv;
        ops.broadcast = timed_broadcast;
        ops.allreduce_i64 = timed_allreduce;
        must(llmt_comm_create(&comm, &ops), "comm");
    }
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = threads;
    llmt_context *ctx = NULL;
    must(llmt_context_create(&ctx, &cc), "context");
    llmt_train_config c;
    llmt_train_config_init(&c);
    c.model.vocab_size = VOCAB;
    c.model.hidden_size = 512;
    c.model.num_layers = 8;
    c.model.num_heads = 8;
    c.model.num_kv_heads = 8;
    c.model.ffn_size = 1408;
    c.model.max_seq_len = T;
    c.model.precision = bf16 ? LLMT_PRECISION_BF16_MIXED : LLMT_PRECISION_FP32;
    c.batch_size = B;
    c.micro_batch = MICRO;
    c.seq_len = T;
    c.steps = steps;
    c.adaptive = 0;
    c.dist_reduce = strcmp(mode, "fast") == 0 ? LLMT_REDUCE_FAST : LLMT_REDUCE_DETERMINISTIC;
    c.optimizer.offload_parts = parts;
    c.optimizer.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    snprintf(c.train_data, sizeof c.train_data, "%s/train_*.bin", dir);
    llmt_trainer *tr = NULL;
    must(llmt_trainer_create_from_config_dist(&tr, ctx, &c, comm), "trainer");
    double *times = calloc((size_t)steps, sizeof *times), share = 0.0;
    int64_t bytes = 0;
    for (int s = 0; s < steps; s++) {
        llmt_step_report r;
        memset(&r, 0, sizeof r);
        r.version = LLMT_STEP_REPORT_VERSION;
        double c0 = comm_seconds;
        int64_t b0 = comm ? llmt_comm_bytes_sent(comm) : 0;
        double t0 = bench_now();
        must(llmt_trainer_step(tr, &r), "step");
        times[s] = bench_now() - t0;
        if (s > 0) { /* the first step warms up */
            share += (comm_seconds - c0) / times[s];
            bytes += (comm ? llmt_comm_bytes_sent(comm) : 0) - b0;
        }
    }
    int64_t params = llmt_model_num_params(llmt_trainer_model(tr));
    double minimum = 2.0 * (double)params * (bf16 ? 2 : 4) * (size - 1) / size;
    double step_min = 1e30;
    for (int s = 1; s < steps; s++)
        step_min = times[s] < step_min ? times[s] : step_min;
    double median = bench_median(times + 1, steps - 1);
    if (rank == 0)
        printf("bench_dp %s ranks %d threads %d %s offload %s params %lld step_min %.4f "
               "step_median %.4f comm_share %.3f bytes_per_step %.0f zero1_minimum %.0f\n",
               mode, size, threads, bf16 ? "bf16" : "fp32", offload, (long long)params, step_min,
               median, share / (steps - 1), (double)bytes / (steps - 1), minimum);
    free(times);
    llmt_trainer_free(tr);
    llmt_context_free(ctx);
    llmt_comm_free(comm);
    llmt_comm_mpi_free(m);
    if (rank == 0) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_dp: could not remove %s\n", dir);
    }
    MPI_Finalize();
    return 0;
}
