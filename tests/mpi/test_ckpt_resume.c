/* A data-parallel resume reads a sharded checkpoint in one pass (under
 * mpiexec -n 2 and 3, on the checkpoints of the mpi_ckpt_sharded_save
 * fixture, saved by 4 ranks):
 *
 *   - each rank reads each file at most once, and only the files it needs:
 *     model.safetensors on rank 0 alone, a shard file only on the ranks
 *     whose range overlaps it (counted through wrappers of the library's
 *     two file readers, llmt_pread_all and llmt_hash_file);
 *   - damage in a shard file rank 0 does not read is found by rank 1, and
 *     every rank falls back to step FIRST, both logs naming the file;
 *   - a byte flipped in a middle chunk of a shard (4 KiB chunks) is refused
 *     naming the file and the chunk, and every rank falls back;
 *   - when no checkpoint loads after one was partly loaded, every rank fails
 *     with LLMT_ECORRUPT saying the objects may be partly overwritten.
 *
 * Usage: mpiexec -n N test_ckpt_resume DIR (DIR: the fixture's). */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "ckpt_fixture.h"
#include "core/error.h"
#include "dist/shard.h"
#include "llmt/comm_mpi.h"
#include "optim/optim_internal.h"

/* ---- what this rank reads: bytes per file name, while counting */

enum { MAX_NAMES = 16 };
static atomic_int counting;
static struct {
    char name[64];
    uint64_t bytes;
} reads[MAX_NAMES];
static int n_reads;

/* Rank 0's range reader thread and its weights load both read. */
static pthread_mutex_t reads_lock = PTHREAD_MUTEX_INITIALIZER;

static void count_read(const char *path, uint64_t bytes)
{
    if (!atomic_load(&counting))
        return;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    pthread_mutex_lock(&reads_lock);
    int i = 0;
    while (i < n_reads && strcmp(reads[i].name, name))
        i++;
    if (i == n_reads && n_reads < MAX_NAMES)
        snprintf(reads[n_reads++].name, sizeof reads[0].name, "%s", name);
    if (i < n_reads)
        reads[i].bytes += bytes;
    pthread_mutex_unlock(&reads_lock);
}

static uint64_t bytes_read(const char *name)
{
    for (int i = 0; i < n_reads; i++)
        if (!strcmp(reads[i].name, name))
            return reads[i].bytes;
    return 0;
}

int __real_llmt_pread_all(int fd, const char *path, void *buf, size_t len, uint64_t offset);
int __wrap_llmt_pread_all(int fd, const char *path, void *buf, size_t len, uint64_t offset);
/* A read error injected on rank eio_rank for paths containing eio_part. */
static int eio_rank = -1;
static char eio_part[128];

int __wrap_llmt_pread_all(int fd, const char *path, void *buf, size_t len, uint64_t offset)
{
    if (rank == eio_rank && strstr(path, eio_part))
        return llmt_fail(LLMT_EIO, "%s: injected read error", path);
    int rc = __real_llmt_pread_all(fd, path, buf, len, offset);
    if (!rc)
        count_read(path, len);
    return rc;
}

int __real_llmt_hash_file(const char *path, uint64_t *size, uint64_t *xxh3);
int __wrap_llmt_hash_file(const char *path, uint64_t *size, uint64_t *xxh3);
int __wrap_llmt_hash_file(const char *path, uint64_t *size, uint64_t *xxh3)
{
    int rc = __real_llmt_hash_file(path, size, xxh3);
    if (!rc)
        count_read(path, *size);
    return rc;
}

/* ---- the tests */

/* Whether [a, b) and [c, d) share an element. */
static int overlap(int64_t a, int64_t b, int64_t c, int64_t d)
{
    return a < b && c < d && a < d && c < b;
}

/* A clean resume: rank 0 reads model.safetensors once, the others not at
 * all; each rank reads each shard file its range overlaps (at most whole)
 * and no other non-empty one. */
static void test_single_pass(const char *dir, llmt_comm *comm)
{
    char ckpt[900];
    copy_ckpt(dir, "pass", ckpt, sizeof ckpt);
    llmt_manifest mf;
    read_manifest(ckpt, HALF, &mf);
    run r;
    int rc = LLMT_OK;
    n_reads = 0;
    atomic_store(&counting, 1);
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    atomic_store(&counting, 0);
    EXPECT(rc == LLMT_OK && step == HALF, "resume: status %d, step %lld: %s", rc,
           (long long)step, llmt_error_last());
    const llmt_manifest_file *model = llmt_manifest_find(&mf, "model.safetensors");
    uint64_t got = bytes_read("model.safetensors");
    EXPECT(got == (rank == 0 ? model->bytes : 0), "model.safetensors (%llu bytes): %llu bytes "
           "read", (unsigned long long)model->bytes, (unsigned long long)got);
    for (int32_t k = 0; k < mf.world_size; k++) {
        const llmt_manifest_shard *s = &mf.shards[k];
        got = bytes_read(s->file.name);
        int mine = overlap(s->first, s->end, r.opt->first, r.opt->end);
        EXPECT(got <= s->file.bytes, "%s (%llu bytes) read %llu bytes: some twice", s->file.name,
               (unsigned long long)s->file.bytes, (unsigned long long)got);
        EXPECT(!mine || got > 0, "%s overlaps [%lld, %lld) but was not read", s->file.name,
               (long long)r.opt->first, (long long)r.opt->end);
        EXPECT(mine || s->first == s->end || got == 0, "%s does not overlap [%lld, %lld) but "
               "%llu bytes of it were read", s->file.name, (long long)r.opt->first,
               (long long)r.opt->end, (unsigned long long)got);
    }
    llmt_manifest_clear(&mf);
    run_close(&r);
}

/* Flips the byte at offset of file name of step in ckpt (rank 0). */
static void flip(const char *ckpt, int step, const char *name, uint64_t offset)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/step-%08d/%s", ckpt, step, name);
    unsigned char b = 0;
    int fd = open(path, O_RDWR);
    if (fd < 0 || pread(fd, &b, 1, (off_t)offset) != 1)
        must(LLMT_EIO, path);
    b ^= 0xff;
    if (pwrite(fd, &b, 1, (off_t)offset) != 1 || close(fd) != 0)
        must(LLMT_EIO, path);
}

/* Damages (rank 0 writes) the middle of a shard file of step HALF that
 * rank 1 reads and rank 0 does not; its name into name ("" if none). */
static void damage_rank1_only(const char *ckpt, const llmt_manifest *mf, char *name, size_t cap)
{
    int64_t f0, e0, f1, e1;
    llmt_shard_range(mf->num_elements, size, 0, &f0, &e0);
    llmt_shard_range(mf->num_elements, size, 1, &f1, &e1);
    name[0] = '\0';
    for (int32_t k = 0; k < mf->world_size && !name[0]; k++) {
        const llmt_manifest_shard *s = &mf->shards[k];
        if (overlap(s->first, s->end, f1, e1) && !overlap(s->first, s->end, f0, e0)) {
            snprintf(name, cap, "%s", s->file.name);
            if (rank == 0)
                flip(ckpt, HALF, name, s->file.bytes / 2);
        }
    }
}

/* A shard of step HALF with elements that rank 1 owns and rank 0 none of,
 * damaged mid-file: rank 1 (the lowest rank that reads it) finds it, every
 * rank falls back to FIRST, and both logs name the file. */
static void test_found_by_rank1(const char *dir, llmt_comm *comm)
{
    char ckpt[900], name[64] = "";
    copy_ckpt(dir, "rank1", ckpt, sizeof ckpt);
    llmt_manifest mf;
    read_manifest(ckpt, HALF, &mf);
    damage_rank1_only(ckpt, &mf, name, sizeof name);
    llmt_manifest_clear(&mf);
    EXPECT(name[0], "no shard file that rank 1 reads and rank 0 does not, at %d ranks", size);
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_OK && step == FIRST, "%s damaged: status %d, step %lld: %s", name, rc,
           (long long)step, llmt_error_last());
    EXPECT(rank != 0 || (strstr(log_text, "rank 1 failed") && strstr(log_text, name)),
           "rank 0 does not log rank 1's refusal of %s: %s", name, log_text);
    EXPECT(rank != 1 || (strstr(log_text, "refused") && strstr(log_text, name)),
           "rank 1 does not log its refusal of %s: %s", name, log_text);
    run_close(&r);
}

/* 4 KiB chunks, a byte flipped in the middle chunk of the first shard: the
 * chunk and the file named, every rank back at FIRST. */
static void test_middle_chunk(const char *dir, llmt_comm *comm)
{
    char ckpt[900], chunk[32];
    copy_ckpt(dir, "middle", ckpt, sizeof ckpt);
    llmt_manifest mf;
    read_manifest(ckpt, HALF, &mf);
    uint64_t c = (mf.shards[0].file.bytes / 4096) / 2;
    snprintf(chunk, sizeof chunk, "chunk %llu ", (unsigned long long)c);
    if (rank == 0) {
        rechunk(ckpt, -1);
        flip(ckpt, HALF, mf.shards[0].file.name, c * 4096 + 7);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_OK && step == FIRST, "middle chunk: status %d, step %lld: %s", rc,
           (long long)step, llmt_error_last());
    EXPECT(rank != 0 || (strstr(log_text, mf.shards[0].file.name) && strstr(log_text, chunk)),
           "rank 0 does not log the refusal of %s naming its %s: %s", mf.shards[0].file.name,
           chunk, log_text);
    llmt_manifest_clear(&mf);
    run_close(&r);
}

/* Step HALF damaged where only a reader finds it (after rank 0 loaded the
 * weights), step FIRST missing a shard: every rank fails, saying so. */
static void test_none_loads(const char *dir, llmt_comm *comm)
{
    char ckpt[900], path[1100];
    copy_ckpt(dir, "none", ckpt, sizeof ckpt);
    if (rank == 0) {
        llmt_manifest mf;
        read_manifest(ckpt, HALF, &mf);
        const llmt_manifest_shard *last = &mf.shards[mf.world_size - 1];
        flip(ckpt, HALF, last->file.name, last->file.bytes / 2);
        snprintf(path, sizeof path, "%s/step-%08d/%s", ckpt, FIRST, last->file.name);
        if (unlink(path) != 0)
            must(LLMT_EIO, path);
        llmt_manifest_clear(&mf);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    const char *why = llmt_error_last();
    EXPECT(rc == LLMT_ECORRUPT && step == -1 && strstr(why, "partly overwritten"),
           "no checkpoint loads: status %d, step %lld: %s", rc, (long long)step, why);
    EXPECT(rank != 0 || (strstr(why, "step-00000010") && strstr(why, "step-00000005")),
           "the error does not name both checkpoints: %s", why);
    run_close(&r);
}

/* The JSON header of step HALF's model.safetensors damaged (rank 0 parses
 * it before its checksum is known): damage, not a crash or a refusal of
 * the file's format, so every rank falls back to FIRST. */
static void test_model_header(const char *dir, llmt_comm *comm)
{
    char ckpt[900];
    copy_ckpt(dir, "header", ckpt, sizeof ckpt);
    if (rank == 0)
        flip(ckpt, HALF, "model.safetensors", 12);
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_OK && step == FIRST, "model.safetensors' header damaged: status %d, step "
           "%lld: %s", rc, (long long)step, llmt_error_last());
    EXPECT(rank != 0 || strstr(log_text, "model.safetensors"),
           "rank 0 does not log the refusal of model.safetensors: %s", log_text);
    run_close(&r);
}

/* Rank 0 cannot read its first shard file of step HALF (a read error),
 * while rank 1 finds damage in a shard only it reads: the damage decides,
 * every rank falls back to FIRST. */
static void test_damage_beats_read_error(const char *dir, llmt_comm *comm)
{
    char ckpt[900], name[64] = "";
    copy_ckpt(dir, "mixed", ckpt, sizeof ckpt);
    llmt_manifest mf;
    read_manifest(ckpt, HALF, &mf);
    damage_rank1_only(ckpt, &mf, name, sizeof name);
    snprintf(eio_part, sizeof eio_part, "step-%08d/%s", HALF, mf.shards[0].file.name);
    llmt_manifest_clear(&mf);
    EXPECT(name[0], "no shard file that rank 1 reads and rank 0 does not, at %d ranks", size);
    MPI_Barrier(MPI_COMM_WORLD);
    eio_rank = 0;
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    eio_rank = -1;
    EXPECT(rc == LLMT_OK && step == FIRST, "read error on rank 0, %s damaged: status %d, step "
           "%lld: %s", name, rc, (long long)step, llmt_error_last());
    EXPECT(rank != 0 || strstr(log_text, "injected read error"),
           "rank 0 does not log its own read error: %s", log_text);
    run_close(&r);
}

/* The context's random stream continues from the checkpoint on every rank,
 * not only on rank 0 (the others' streams are moved on before the resume). */
static void test_rng_everywhere(const char *dir, llmt_comm *comm)
{
    char ckpt[900];
    copy_ckpt(dir, "rng", ckpt, sizeof ckpt);
    run r;
    run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 5);
    float x[3];
    if (rank != 0)
        must(llmt_context_rng_uniform(r.ctx, x, 3), "rng");
    int64_t step = -1;
    must(llmt_trainer_resume_latest(r.tr, &step), "resume");
    must(llmt_context_rng_uniform(r.ctx, x, 1), "rng");
    int32_t bits = 0, lo = 0, hi = 0;
    memcpy(&bits, &x[0], sizeof bits);
    MPI_Allreduce(&bits, &lo, 1, MPI_INT32_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&bits, &hi, 1, MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT(step == HALF && lo == hi, "after the resume (step %lld) the ranks' random streams "
           "differ", (long long)step);
    run_close(&r);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 2 || size < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpiexec -n N test_ckpt_resume DIR (N >= 2)\n");
        MPI_Finalize();
        return 2;
    }
    llmt_comm_mpi *m = NULL;
    must(llmt_comm_mpi_create(&m, MPI_COMM_WORLD), "comm");
    test_single_pass(argv[1], m->comm);
    test_found_by_rank1(argv[1], m->comm);
    test_middle_chunk(argv[1], m->comm);
    test_none_loads(argv[1], m->comm);
    test_model_header(argv[1], m->comm);
    test_damage_beats_read_error(argv[1], m->comm);
    test_rng_everywhere(argv[1], m->comm);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    llmt_comm_mpi_free(m);
    MPI_Finalize();
    if (rank == 0)
        printf("resume %s on %d ranks: %s\n", argv[1], size, all ? "FAILED" : "all passed");
    return all ? 1 : 0;
}
