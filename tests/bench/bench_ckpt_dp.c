/* Sharded checkpoints of a data-parallel run against plain file I/O of the
 * same bytes, every rank at the same time (run under mpiexec; see
 * tests/bench/run_ckpt_dp.sh). The run is an fp32 model with a ZeRO-1
 * AdamW optimizer (llmt_optimizer_create_sharded) in a trainer whose rank 0
 * holds the store, as llmt-train builds it. Each of R interleaved rounds
 * trains one step, then:
 *   save: llmt_trainer_save (every rank writes and fsyncs its optimizer
 *     range, rank 0 the weights and the rest; rank 0 commits and removes
 *     the previous step) against each rank writing a new file of as many
 *     bytes as it wrote into the checkpoint, fsync, and removing its file of
 *     the round before;
 *   load: llmt_trainer_resume_latest from a cold page cache (rank 0 picks
 *     the newest checkpoint by the cheap checks, loads the weights hashing
 *     them as it reads and broadcasts them, while each rank reads and
 *     checks its range of the state) against each rank reading cold the
 *     checkpoint files it wrote (the same bytes in the same blocks); and,
 *     for scale, a cold llmt_ckpt_verify of every file on rank 0 (the
 *     resume's first pass before it became a single pass).
 * Which side goes first alternates by round; each side's time is the
 * slowest rank's (barriers around it); ratio = plain / ours (> 1: we are
 * faster), per round, and the summaries of bench_ratio.h.
 *
 * Usage: mpiexec -n N bench_ckpt_dp DIR [rounds] [hidden] — DIR on the
 * file system to measure (shared by the ranks); rounds 6 by default (even:
 * as many of each order); hidden 1024 by default: 143M parameters, 1.71 GB
 * of state (weights and AdamW moments, 12 bytes per parameter), as
 * bench_ckpt. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "bench_file_io.h"
#include "bench_ratio.h"
#include "bench_util.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"

#define MAX_FILES 8
enum { VOCAB = 32000, T = 16 };

static int rank, size;

static void must(int rc, const char *what)
{
    if (rc != LLMT_OK) {
        fprintf(stderr, "bench_ckpt_dp rank %d: %s: %s\n", rank, what, llmt_error_last());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static void die(const char *what)
{
    fprintf(stderr, "bench_ckpt_dp rank %d: %s failed\n", rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* snprintf into a path buffer; a path that does not fit ends the run. */
__attribute__((format(printf, 3, 4))) static void path_fmt(char *out, size_t cap,
                                                            const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap)
        die("a path too long");
}

/* The files of a checkpoint step that this rank wrote: its optimizer file,
 * and on rank 0 every other file of the step (weights, MANIFEST, ...). */
typedef struct rank_files {
    int n;
    char path[MAX_FILES][1200];
    size_t bytes; /* their sizes summed */
} rank_files;

static void files_of(rank_files *f, const char *store_dir, int64_t step)
{
    char dir[1100], mine[64];
    path_fmt(dir, sizeof dir, "%s/step-%08lld", store_dir, (long long)step);
    snprintf(mine, sizeof mine, "optimizer-%05d-of-%05d.safetensors", rank + 1, size);
    DIR *d = opendir(dir);
    if (!d)
        die(dir);
    f->n = 0;
    f->bytes = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int other_shard = strncmp(e->d_name, "optimizer-", 10) == 0 && strcmp(e->d_name, mine);
        if (e->d_name[0] == '.' || other_shard || (rank != 0 && strcmp(e->d_name, mine)))
            continue;
        if (f->n == MAX_FILES)
            die("too many files in the checkpoint");
        path_fmt(f->path[f->n], sizeof f->path[0], "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(f->path[f->n], &st) != 0)
            die(f->path[f->n]);
        f->bytes += (size_t)st.st_size;
        f->n++;
    }
    closedir(d);
}

/* Drops the cached pages of every file of checkpoint step. */
static void drop_step(const char *store_dir, int64_t step)
{
    char dir[1100], path[1400];
    path_fmt(dir, sizeof dir, "%s/step-%08lld", store_dir, (long long)step);
    DIR *d = opendir(dir);
    if (!d)
        die(dir);
    for (struct dirent *e; (e = readdir(d));) {
        path_fmt(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.')
            bench_drop_cache(path);
    }
    closedir(d);
}

static void plain_write(const char *path, const char *old, const char *buf, size_t n)
{
    const char *failed = bench_write_new(path, old, buf, n);
    if (failed)
        die(failed);
}

/* Reads the files of f whole into buf (cap bytes), one after the other. */
static void plain_read(const rank_files *f, char *buf, size_t cap)
{
    for (int i = 0; i < f->n; i++) {
        size_t got = 0;
        const char *failed = bench_read_whole(f->path[i], buf, cap, &got);
        if (failed)
            die(failed);
        buf += got;
        cap -= got;
    }
}

/* Barriers around: the slowest rank's time. Each phase starts with no
 * dirty pages left by the one before and after the settling wait
 * (bench_settle, untimed), so neither side pays for the other's writeback,
 * removed files or freed memory. */
static double phase_start(void)
{
    bench_settle();
    MPI_Barrier(MPI_COMM_WORLD);
    return bench_now();
}

static double phase_end(double t)
{
    MPI_Barrier(MPI_COMM_WORLD);
    return bench_now() - t;
}

/* A shard of random tokens in a fresh directory under dir, written by rank
 * 0; its path pattern into pattern (every rank). */
static void make_data(const char *dir, char *pattern, size_t cap)
{
    char data[1100];
    path_fmt(data, sizeof data, "%s/bench-ckpt-dp-data", dir);
    if (rank == 0) {
        enum { N = 64 * T + 1 };
        static int32_t tokens[N];
        uint32_t x = 99u;
        for (int i = 0; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            tokens[i] = (int32_t)((x >> 8) % VOCAB);
        }
        char path[1200];
        path_fmt(path, sizeof path, "%s/train_000000.bin", data);
        if (mkdir(data, 0755) != 0)
            die("mkdir of the data directory (a leftover of an earlier run?)");
        must(llmt_shard_write(path, tokens, N, LLMT_SHARD_VERSION_U16), "shard");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    path_fmt(pattern, cap, "%s/train_*.bin", data);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rounds = argc > 2 ? atoi(argv[2]) : 6;
    int hidden = argc > 3 ? atoi(argv[3]) : 1024;
    if (argc < 2 || argc > 4 || rounds < 1 || rounds > BENCH_MAX_ROUNDS || hidden < 64 ||
        hidden % 64) {
        if (rank == 0)
            fprintf(stderr, "usage: mpiexec -n N bench_ckpt_dp DIR [rounds 1..%d, default 6] "
                            "[hidden: a multiple of 64, default 1024]\n", BENCH_MAX_ROUNDS);
        MPI_Finalize();
        return 2;
    }
    const char *dir = argv[1];
    char pattern[1200], store_dir[1100], plain_path[2][1200];
    make_data(dir, pattern, sizeof pattern);
    path_fmt(store_dir, sizeof store_dir, "%s/bench-ckpt-dp", dir);

    llmt_comm_mpi *mpi = NULL;
    must(llmt_comm_mpi_create(&mpi, MPI_COMM_WORLD), "adapter");
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    llmt_context *ctx = NULL;
    must(llmt_context_create(&ctx, &cc), "context");
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = VOCAB, c.hidden_size = hidden, c.num_layers = 6, c.num_heads = hidden / 64;
    c.num_kv_heads = hidden / 64, c.ffn_size = hidden * 11 / 4, c.max_seq_len = T;
    c.precision = LLMT_PRECISION_FP32;
    llmt_model *m = NULL;
    must(llmt_model_create(&m, ctx, &c), "model");
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_optimizer *o = NULL;
    must(llmt_optimizer_create_sharded(&o, m, &oc, mpi->comm, LLMT_REDUCE_DETERMINISTIC),
         "sharded optimizer");
    llmt_slicer *slicer = NULL; /* one sequence per rank and step */
    must(llmt_slicer_create(&slicer, m, 1), "slicer");
    llmt_loader_config dc = LLMT_LOADER_CONFIG_INIT;
    dc.batch_size = size;
    dc.seq_len = T;
    dc.vocab_size = VOCAB;
    llmt_loader *loader = NULL;
    must(llmt_loader_open_glob(&loader, ctx, pattern, &dc), "loader");
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = 1;
    llmt_ckpt_store *store = NULL;
    if (rank == 0)
        must(llmt_ckpt_store_open(&store, ctx, store_dir, &sc), "store");
    llmt_trainer_parts parts = LLMT_TRAINER_PARTS_INIT;
    parts.model = m;
    parts.optimizer = o;
    parts.slicer = slicer;
    parts.loader = loader;
    parts.store = store;
    llmt_trainer_config tc = LLMT_TRAINER_CONFIG_INIT;
    tc.batch_size = size;
    tc.seq_len = T;
    tc.adaptive = 0;
    llmt_trainer *tr = NULL;
    must(llmt_trainer_create(&tr, &parts, &tc), "trainer");

    /* A first step and save, untimed: this rank's share of the bytes. */
    llmt_step_report rep;
    memset(&rep, 0, sizeof rep);
    rep.version = LLMT_STEP_REPORT_VERSION;
    must(llmt_trainer_step(tr, &rep), "step");
    must(llmt_trainer_save(tr, LLMT_CKPT_DURABLE), "save");
    rank_files f;
    files_of(&f, store_dir, llmt_trainer_step_index(tr));
    unsigned long long mine = f.bytes, total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    size_t cap = f.bytes + ((size_t)1 << 20); /* room for the files of any step */
    char *buf = malloc(cap);
    if (!buf)
        die("malloc");
    memset(buf, 1, cap);
    double gb = (double)total / 1e9;
    if (rank == 0)
        printf("bench_ckpt_dp: %d ranks, %.0fM parameters, checkpoint %.2f GB (fp32 weights + "
               "AdamW moments, ZeRO-1), rank 0 writes %.2f GB; %d interleaved rounds, ratio = "
               "plain / ours (> 1: we are faster)\n", size,
               (double)llmt_model_num_params(m) / 1e6, gb, (double)mine / 1e9, rounds);

    double save[BENCH_MAX_ROUNDS], write_t[BENCH_MAX_ROUNDS];
    double load[BENCH_MAX_ROUNDS], read_t[BENCH_MAX_ROUNDS];
    double verify[BENCH_MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        must(llmt_trainer_step(tr, &rep), "step");
        int64_t step = llmt_trainer_step_index(tr);
        int plain_first = r % 2 == 0;
        char *path = plain_path[r % 2], *old = r ? plain_path[(r + 1) % 2] : NULL;
        path_fmt(path, sizeof plain_path[0], "%s/bench-plain-%d-%d.bin", dir, rank, r + 1);
        for (int side = 0; side < 2; side++) {
            double t = phase_start();
            if (side == plain_first) {
                must(llmt_trainer_save(tr, LLMT_CKPT_DURABLE), "save");
                save[r] = phase_end(t);
            } else {
                plain_write(path, old, buf, f.bytes);
                write_t[r] = phase_end(t);
            }
        }
        files_of(&f, store_dir, step); /* this step's: the same sizes */
        for (int side = 0; side < 2; side++) {
            /* Cold: each rank's own files, and on rank 0 every file of
             * the step (it reads the weights and may hash any file). */
            for (int i = 0; i < f.n; i++)
                bench_drop_cache(f.path[i]);
            if (rank == 0)
                drop_step(store_dir, step);
            double t = phase_start();
            if (side == plain_first) {
                int64_t got = -1;
                must(llmt_trainer_resume_latest(tr, &got), "resume");
                load[r] = phase_end(t);
                if (got != step)
                    die("resume: not the step just saved");
            } else {
                plain_read(&f, buf, cap);
                read_t[r] = phase_end(t);
            }
        }
        if (rank == 0) { /* for scale: a cold verify of every file */
            drop_step(store_dir, step);
            double t = bench_now();
            must(llmt_ckpt_verify(store, step, LLMT_CKPT_DURABLE), "verify");
            verify[r] = bench_now() - t;
            printf("round %d (%s first): save %5.2f s, plain write+fsync %5.2f s, ratio %.2f | "
                   "resume %5.2f s, plain read %5.2f s, ratio %.2f | verify alone %5.2f s\n",
                   r + 1, plain_first ? "plain" : "ours", save[r], write_t[r],
                   write_t[r] / save[r], load[r], read_t[r], read_t[r] / load[r], verify[r]);
        }
        fflush(stdout);
    }
    if (rank == 0) {
        bench_ratio_summary("sync save", save, "plain write+fsync", write_t, rounds, gb);
        bench_ratio_summary("resume", load, "plain read (cold)", read_t, rounds, gb);
        double v_med = bench_median(verify, rounds);
        printf("for scale, a verification of every file (rank 0, cold): min %.2f s"
               "  median %.2f s\n", verify[0], v_med);
    }
    unlink(plain_path[(rounds - 1) % 2]);
    llmt_trainer_free(tr);
    llmt_ckpt_store_free(store);
    llmt_loader_free(loader);
    llmt_slicer_free(slicer);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    llmt_comm_mpi_free(mpi);
    if (rank == 0) {
        char cmd[2400];
        path_fmt(cmd, sizeof cmd, "rm -rf '%s' '%s/bench-ckpt-dp-data'", store_dir, dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_ckpt_dp: cannot remove %s\n", store_dir);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
