/* Sharded checkpoints (format_version 2) under mpiexec.
 *
 *   test_ckpt_sharded save DIR   (-n 4) trains a bf16_mixed run, saves at
 *       steps 5 and 10 (each rank writes its own optimizer file, checked
 *       here against the rank's own buffers), records the state at step 10
 *       and that of the uninterrupted run at step 20, and checks that a
 *       save failing on one rank fails on all and leaves nothing behind.
 *   test_ckpt_sharded load DIR   (-n 1, 2, 3, 8) resumes DIR's checkpoint
 *       at its world size: every weight and state tensor equal to the saved
 *       ones, and 10 more steps give the uninterrupted run's bits; a
 *       flipped, truncated or deleted optimizer file is refused (file named)
 *       and every rank falls back to step 5; a rank that finds damage while
 *       reading fails the load on all ranks with the file named. With -n 1
 *       also: llmt_ckpt_consolidate against a single-process save of the
 *       same state, byte for byte.
 *   test_ckpt_sharded churn DIR SEED   trains DIR's run from step 0, saving
 *       after every step, while one rank (chosen by SEED) kills itself with
 *       SIGKILL at a random instant; then
 *   test_ckpt_sharded check DIR   checks that every checkpoint left
 *       verifies, that the newest loads with the uninterrupted run's state,
 *       and that the run saves again (ckpt_kill.sh runs the trials).
 *
 * DIR is shared by the save (a ctest fixture) and the loads; each load works
 * on its own copies, so loads may run side by side. Threads: one per rank. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>
#include <xxhash.h>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "dp_run.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"

enum { FIRST = 5 }; /* the earlier checkpoint, the fallback */

static void sh(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0)
        must(LLMT_EIO, cmd);
}

/* The element sizes of the state sections (exp_avg, exp_avg_sq, master). */
static void section_sizes(const run *r, size_t es[3])
{
    es[0] = es[1] = llmt_dtype_size(r->opt->state_dt);
    es[2] = sizeof(float);
}

/* The raw bytes of the weights, then of each state section over the whole
 * flat buffer (gathered from the ranks' ranges), written by rank 0 to path. */
static void dump(const char *path, const run *r)
{
    const llmt_model *m = r->model;
    const llmt_optimizer *o = r->opt;
    const llmt_buf *bufs[3] = {&o->m, &o->v, &o->master};
    size_t es[3];
    section_sizes(r, es);
    size_t total = m->weights.bytes + (size_t)m->num_params * (es[0] + es[1] + es[2]);
    char *out = malloc(total);
    int *counts = calloc((size_t)size * 2, sizeof *counts), *displs = counts + size;
    memcpy(out, m->weights.ptr, m->weights.bytes);
    size_t at = m->weights.bytes;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < size; i++) {
            counts[i] = (int)((size_t)(o->bounds[i + 1] - o->bounds[i]) * es[k]);
            displs[i] = (int)((size_t)o->bounds[i] * es[k]);
        }
        MPI_Gatherv(bufs[k]->ptr, counts[rank], MPI_BYTE, out + at, counts, displs, MPI_BYTE, 0,
                    MPI_COMM_WORLD);
        at += (size_t)m->num_params * es[k];
    }
    FILE *f = rank == 0 ? fopen(path, "wb") : NULL;
    if (rank == 0 && (!f || fwrite(out, 1, total, f) != total || fclose(f) != 0))
        must(LLMT_EIO, path);
    free(counts);
    free(out);
}

/* r's weights and this rank's range of each state section against what
 * dump wrote to path, byte for byte. */
static void expect_state(const char *path, const run *r, const char *what)
{
    const llmt_model *m = r->model;
    const llmt_optimizer *o = r->opt;
    const llmt_buf *bufs[3] = {&o->m, &o->v, &o->master};
    size_t es[3];
    section_sizes(r, es);
    size_t total = m->weights.bytes + (size_t)m->num_params * (es[0] + es[1] + es[2]);
    char *want = malloc(total);
    FILE *f = fopen(path, "rb");
    if (!f || fread(want, 1, total, f) != total)
        must(LLMT_EIO, path);
    fclose(f);
    EXPECT(memcmp(want, m->weights.ptr, m->weights.bytes) == 0, "%s on %d ranks: the weights "
           "differ from %s", what, size, path);
    size_t at = m->weights.bytes;
    for (int k = 0; k < 3; k++) {
        size_t n = (size_t)(o->end - o->first) * es[k];
        EXPECT(n == 0 || memcmp(want + at + (size_t)o->first * es[k], bufs[k]->ptr, n) == 0,
               "%s on %d ranks: state section %d of [%lld, %lld) differs from %s", what, size, k,
               (long long)o->first, (long long)o->end, path);
        at += (size_t)m->num_params * es[k];
    }
    free(want);
}

/* ---- save */

/* This rank's optimizer file, decoded: its range, and bytes equal to the
 * rank's own state buffers. */
static void check_own_shard(const char *ckpt, const run *r)
{
    char path[1024], name[64];
    llmt_manifest_shard_name(name, sizeof name, rank, size);
    snprintf(path, sizeof path, "%s/step-%08d/%s", ckpt, HALF, name);
    int64_t first = 0, end = 0;
    must(llmt_optimizer_shard(r->opt, &first, &end), "shard");
    llmt_st_file *f = NULL;
    must(llmt_st_open(path, NULL, &f), path);
    char want[24];
    snprintf(want, sizeof want, "%lld", (long long)first);
    EXPECT(llmt_st_meta_get(f, "llmt.first") && !strcmp(llmt_st_meta_get(f, "llmt.first"), want),
           "%s: llmt.first is not %s", name, want);
    snprintf(want, sizeof want, "%lld", (long long)end);
    EXPECT(llmt_st_meta_get(f, "llmt.end") && !strcmp(llmt_st_meta_get(f, "llmt.end"), want),
           "%s: llmt.end is not %s", name, want);
    const llmt_buf *bufs[3] = {&r->opt->m, &r->opt->v, &r->opt->master};
    const char *names[3] = {"exp_avg", "exp_avg_sq", "master"};
    EXPECT(llmt_st_count(f) == 3, "%s: %zu tensors", name, llmt_st_count(f));
    for (int k = 0; k < 3; k++) {
        size_t idx = 0;
        must(llmt_st_find(f, names[k], &idx), names[k]);
        const llmt_st_tensor *t = llmt_st_tensor_at(f, idx);
        size_t bytes = (size_t)(t->end - t->begin);
        EXPECT(t->ndim == 1 && t->shape[0] == (uint64_t)(end - first) && bytes == bufs[k]->bytes,
               "%s: %s has %llu elements, %zu bytes, not the range's", name, names[k],
               (unsigned long long)t->shape[0], bytes);
        char *got = malloc(bytes + 1);
        if (bytes == bufs[k]->bytes) {
            must(llmt_st_read(f, idx, 0, got, bytes), "read");
            EXPECT(memcmp(got, bufs[k]->ptr, bytes) == 0, "%s: %s differs from the rank's buffer",
                   name, names[k]);
        }
        free(got);
    }
    llmt_st_close(f);
}

/* The step-10 MANIFEST, hand-checked on rank 0: format 2, four shard files
 * whose ranges tile the state, no optimizer.safetensors. */
static void check_manifest(const char *ckpt, const run *r)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/step-%08d/optimizer.safetensors", ckpt, HALF);
    EXPECT(access(path, F_OK) != 0, "%s exists in a sharded checkpoint", path);
    snprintf(path, sizeof path, "%s/step-%08d/MANIFEST", ckpt, HALF);
    FILE *f = fopen(path, "rb");
    static char text[1 << 16];
    size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    text[len] = '\0';
    EXPECT(strstr(text, "\"format_version\":2"), "MANIFEST: no format_version 2");
    EXPECT(strstr(text, "\"world_size\":4"), "MANIFEST: no world_size 4");
    char range[128];
    int64_t at = 0;
    for (int32_t i = 0; i < size; i++) {
        int64_t first = r->opt->bounds[i], end = r->opt->bounds[i + 1];
        char name[64];
        llmt_manifest_shard_name(name, sizeof name, i, size);
        snprintf(range, sizeof range, "\"name\":\"%s\"", name);
        EXPECT(strstr(text, range), "MANIFEST does not list %s", name);
        snprintf(range, sizeof range, "\"range\":[%lld,%lld]", (long long)first, (long long)end);
        EXPECT(strstr(text, range) && first == at, "MANIFEST: no %s for rank %d", range, i);
        at = end;
    }
    EXPECT(at == r->model->num_params, "ranges end at %lld", (long long)at);
}

/* A save that fails on rank 2 (its file size limit) fails on every rank,
 * naming rank 2 elsewhere, and leaves neither the step nor a temporary
 * directory: step 10 stays the newest. */
static void test_failed_save(const char *ckpt, run *r)
{
    struct rlimit old, tiny = {1024, 1024};
    getrlimit(RLIMIT_FSIZE, &old);
    tiny.rlim_max = old.rlim_max;
    if (rank == 2) {
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &tiny);
    }
    int rc = llmt_trainer_save(r->tr, LLMT_CKPT_DURABLE);
    if (rank == 2)
        setrlimit(RLIMIT_FSIZE, &old);
    EXPECT(rc != LLMT_OK, "a save failing on rank 2 succeeded here");
    EXPECT(rank == 2 || strstr(llmt_error_last(), "rank 2"), "the message does not name rank 2: %s",
           llmt_error_last());
    EXPECT(rank != 2 || strstr(llmt_error_last(), "optimizer-00003-of-00004"),
           "rank 2's message does not name its file: %s", llmt_error_last());
    if (rank == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "test \"$(ls '%s' | grep -c -v -e '^step-00000005$' -e "
                 "'^step-00000010$' -e '^llmt.lock$')\" = 0", ckpt);
        EXPECT(system(cmd) == 0, "the failed save left something in %s", ckpt);
        int64_t step = -1;
        int32_t tier = -1;
        must(llmt_ckpt_latest(r->store, &step, &tier, NULL, 0), "latest");
        EXPECT(step == HALF, "latest after a failed save: %lld", (long long)step);
    }
}

static void do_save(const char *dir, llmt_comm *comm)
{
    EXPECT(size == 4, "the save runs on 4 ranks, not %d", size);
    if (rank == 0) {
        sh("rm -rf '%s' && mkdir -p '%s'", dir, dir);
        write_shard(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char ckpt[900], path[1000];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    run r;
    run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 77);
    if (rank == 0) { /* an empty store lists nothing (UBSan: no memcpy from NULL) */
        int64_t steps[4];
        size_t n = 9;
        must(llmt_ckpt_list(r.store, LLMT_CKPT_DURABLE, steps, 4, &n), "list");
        EXPECT(n == 0, "an empty store lists %zu checkpoints", n);
    }
    train(&r, FIRST, NULL);
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "save at 5");
    train(&r, HALF - FIRST, NULL);
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "save at 10");
    check_own_shard(ckpt, &r);
    if (rank == 0)
        check_manifest(ckpt, &r);
    snprintf(path, sizeof path, "%s/saved.bin", dir);
    dump(path, &r);
    train(&r, STEPS - HALF, NULL);
    snprintf(path, sizeof path, "%s/final.bin", dir);
    dump(path, &r);
    test_failed_save(ckpt, &r);
    run_close(&r);
}

/* ---- load */

/* Resumes a run over ckpt; the step every rank resumed from (all agree). */
static int64_t resume(run *r, const char *dir, llmt_comm *comm, const char *ckpt, int *status)
{
    /* Another seed: every value must come from the checkpoint. */
    run_open(r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 5);
    int64_t step = -1, lo = 0, hi = 0;
    *status = llmt_trainer_resume_latest(r->tr, &step);
    MPI_Allreduce(&step, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&step, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT(lo == hi, "the ranks resumed from steps %lld..%lld", (long long)lo, (long long)hi);
    return step;
}

/* A copy of the saved checkpoints at DIR/<tag>-npN, made by rank 0. */
static void copy_ckpt(const char *dir, const char *tag, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s-np%d", dir, tag, size);
    char from[900];
    snprintf(from, sizeof from, "%s/ckpt", dir);
    if (rank == 0) {
        sh("rm -rf '%s'%s", out, "");
        sh("cp -a '%s' '%s'", from, out);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* A damaged optimizer file of step 10 (flipped byte, truncated, deleted):
 * rank 0 refuses it naming the file, and every rank resumes from step 5. */
static void test_damage(const char *dir, llmt_comm *comm, const char *how)
{
    char ckpt[900], file[1100];
    copy_ckpt(dir, how, ckpt, sizeof ckpt);
    snprintf(file, sizeof file, "%s/step-%08d/optimizer-00002-of-00004.safetensors", ckpt, HALF);
    if (rank == 0) {
        char cmd[2400];
        if (!strcmp(how, "flip"))
            snprintf(cmd, sizeof cmd, "printf '\\377' | dd of='%s' bs=1 seek=3000 conv=notrunc "
                     "status=none", file);
        else if (!strcmp(how, "truncate"))
            snprintf(cmd, sizeof cmd, "truncate -s -100 '%s'", file);
        else
            snprintf(cmd, sizeof cmd, "rm '%s'", file);
        if (system(cmd) != 0)
            must(LLMT_EIO, cmd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_OK && step == FIRST, "%s: resumed from %lld (status %d: %s), not step %d",
           how, (long long)step, rc, llmt_error_last(), FIRST);
    if (rank == 0) {
        rc = llmt_ckpt_verify(r.store, HALF, LLMT_CKPT_DURABLE);
        EXPECT(rc == LLMT_ECORRUPT && strstr(llmt_error_last(), "optimizer-00002-of-00004"),
               "%s: verify gave status %d: %s", how, rc, llmt_error_last());
    }
    run_close(&r);
}

/* Rewrites the MANIFEST of step 10 in ckpt with chunk checksums of 4 KiB
 * (computed here), so reads start and end inside chunks and cross their
 * bounds; with spoil >= 0, that chunk of the last optimizer file is recorded
 * wrong (rank 0's check of whole files still passes). Rank 0 only. */
static void rechunk(const char *ckpt, int spoil)
{
    enum { CH = 4096 };
    char path[1100];
    snprintf(path, sizeof path, "%s/step-%08d/MANIFEST", ckpt, HALF);
    static char text[1 << 16], data[1 << 18];
    FILE *f = fopen(path, "rb");
    size_t len = f ? fread(text, 1, sizeof text, f) : 0;
    if (f)
        fclose(f);
    llmt_manifest m;
    must(llmt_manifest_parse(text, len, &m), "parse the MANIFEST");
    m.chunk_bytes = CH;
    for (int32_t r = 0; r < m.world_size; r++) {
        llmt_manifest_shard *s = &m.shards[r];
        snprintf(path, sizeof path, "%s/step-%08d/%s", ckpt, HALF, s->file.name);
        f = fopen(path, "rb");
        size_t n = f ? fread(data, 1, sizeof data, f) : 0;
        if (f)
            fclose(f);
        if (n != s->file.bytes)
            must(LLMT_EIO, path);
        free(s->chunks);
        s->n_chunks = (n + CH - 1) / CH;
        s->chunks = malloc(s->n_chunks * sizeof *s->chunks);
        for (size_t c = 0; c < s->n_chunks; c++)
            s->chunks[c] = XXH3_64bits(data + c * CH, n - c * CH < CH ? n - c * CH : CH);
    }
    if (spoil >= 0)
        m.shards[m.world_size - 1].chunks[spoil] ^= 1;
    char *out = NULL;
    must(llmt_manifest_format(&m, &out, &len), "format the MANIFEST");
    snprintf(path, sizeof path, "%s/step-%08d/MANIFEST", ckpt, HALF);
    f = fopen(path, "wb");
    if (!f || fwrite(out, 1, len, f) != len || fclose(f) != 0)
        must(LLMT_EIO, path);
    free(out);
    llmt_manifest_clear(&m);
}

/* Chunks of 4 KiB: the state loads whole; a chunk recorded wrong is found
 * by the rank that reads it, and the load fails on every rank with the
 * file and the chunk named. */
static void test_chunks(const char *dir, llmt_comm *comm)
{
    char ckpt[900], path[1000];
    copy_ckpt(dir, "chunks", ckpt, sizeof ckpt);
    if (rank == 0)
        rechunk(ckpt, -1);
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_OK && step == HALF, "4 KiB chunks: status %d, step %lld: %s", rc,
           (long long)step, llmt_error_last());
    snprintf(path, sizeof path, "%s/saved.bin", dir);
    expect_state(path, &r, "the state loaded in 4 KiB chunks");
    run_close(&r);

    copy_ckpt(dir, "spoilt", ckpt, sizeof ckpt);
    if (rank == 0)
        rechunk(ckpt, 5);
    MPI_Barrier(MPI_COMM_WORLD);
    step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_ECORRUPT && step == -1 &&
               strstr(llmt_error_last(), "optimizer-00004-of-00004") &&
               strstr(llmt_error_last(), "chunk 5"),
           "a chunk found damaged by the reader: status %d, step %lld: %s", rc, (long long)step,
           llmt_error_last());
    run_close(&r);
}

static int same_file(const char *a, const char *b)
{
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

/* One process: consolidate step 10, then load it as one process does and
 * save it with the trainer's own state into another store: the same bytes. */
static void test_consolidate(const char *dir)
{
    char ckpt[900], out[900], solo[900];
    copy_ckpt(dir, "cons", ckpt, sizeof ckpt);
    snprintf(out, sizeof out, "%s/cons-out", dir);
    snprintf(solo, sizeof solo, "%s/cons-solo", dir);
    sh("rm -rf '%s' '%s'", out, solo);
    run r;
    run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, NULL, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 5);
    int64_t step = -1;
    must(llmt_trainer_resume_latest(r.tr, &step), "resume alone");
    EXPECT(step == HALF, "one process resumed from %lld", (long long)step);
    must(llmt_ckpt_consolidate(r.store, HALF, LLMT_CKPT_DURABLE, out), "consolidate");
    int rc = llmt_ckpt_consolidate(r.store, HALF, LLMT_CKPT_DURABLE, out);
    EXPECT(rc == LLMT_EINVAL && strstr(llmt_error_last(), "already exists"),
           "consolidating again: status %d: %s", rc, llmt_error_last());
    llmt_ckpt_store *other = NULL;
    must(llmt_ckpt_store_open(&other, r.ctx, solo, NULL), "solo store");
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    char blob[256];
    llmt_trainer_fill_state(r.tr, &st, blob, sizeof blob);
    must(llmt_ckpt_save(other, &st, LLMT_CKPT_DURABLE), "solo save");
    llmt_ckpt_store_free(other);
    static const char *const files[] = {"MANIFEST", "model.safetensors", "optimizer.safetensors",
                                        "user.bin"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[1100], b[1100];
        snprintf(a, sizeof a, "%s/step-%08d/%s", out, HALF, files[i]);
        snprintf(b, sizeof b, "%s/step-%08d/%s", solo, HALF, files[i]);
        EXPECT(same_file(a, b), "consolidated %s differs from a single-process save's", files[i]);
    }
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "test $(ls '%s/step-%08d' | wc -l) = 4", out, HALF);
    EXPECT(system(cmd) == 0, "the consolidated checkpoint holds other files than the four");
    rc = llmt_ckpt_consolidate(r.store, FIRST, LLMT_CKPT_DURABLE, NULL);
    EXPECT(rc == LLMT_EINVAL && strstr(llmt_error_last(), "out_dir"), "out_dir NULL: %d: %s", rc,
           llmt_error_last());
    run_close(&r);
}

/* The checkpoint consolidated to the single-file layout (format 1) loads at
 * this world size too, each rank reading its slices of optimizer.safetensors. */
static void test_single_file(const char *dir, llmt_comm *comm)
{
    char ckpt[900], out[900], path[1000];
    copy_ckpt(dir, "v2", ckpt, sizeof ckpt);
    snprintf(out, sizeof out, "%s/v1-np%d", dir, size);
    if (rank == 0) {
        sh("rm -rf '%s'%s", out, "");
        llmt_context *ctx = NULL;
        llmt_ckpt_store *store = NULL;
        llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
        cc.num_threads = 1;
        must(llmt_context_create(&ctx, &cc), "context");
        must(llmt_ckpt_store_open(&store, ctx, ckpt, NULL), "store");
        must(llmt_ckpt_consolidate(store, HALF, LLMT_CKPT_DURABLE, out), "consolidate");
        llmt_ckpt_store_free(store);
        llmt_context_free(ctx);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, out, &rc);
    EXPECT(rc == LLMT_OK && step == HALF, "format 1: status %d, step %lld: %s", rc,
           (long long)step, llmt_error_last());
    snprintf(path, sizeof path, "%s/saved.bin", dir);
    expect_state(path, &r, "the state loaded from the single-file layout");
    run_close(&r);
}

static void do_load(const char *dir, llmt_comm *comm)
{
    char ckpt[900], path[1000];
    copy_ckpt(dir, "load", ckpt, sizeof ckpt);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    must(rc, "resume");
    EXPECT(step == HALF, "resumed from step %lld, not %d", (long long)step, HALF);
    snprintf(path, sizeof path, "%s/saved.bin", dir);
    expect_state(path, &r, "the loaded state");
    train(&r, STEPS - HALF, NULL);
    snprintf(path, sizeof path, "%s/final.bin", dir);
    expect_state(path, &r, "10 steps after the resume");
    run_close(&r);
    test_damage(dir, comm, "flip");
    test_damage(dir, comm, "truncate");
    test_damage(dir, comm, "delete");
    test_chunks(dir, comm);
    test_single_file(dir, comm);
    if (size == 1)
        test_consolidate(dir);
}

/* ---- SIGKILL trials (driven by ckpt_kill.sh) */

/* Trains and saves after every step, up to STEPS; rank victim kills itself
 * (SIGKILL) after delay_us microseconds, at whatever point it then is. */
static void *killer(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg);
    raise(SIGKILL);
    return NULL;
}

static void do_churn(const char *dir, llmt_comm *comm, unsigned seed)
{
    srand(seed);
    int victim = rand() % size;
    uintptr_t delay = (uintptr_t)(rand() % 120000);
    char ckpt[900];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    char data[1000];
    snprintf(data, sizeof data, "%s/train_000000.bin", dir);
    if (rank == 0 && access(data, F_OK) != 0) {
        sh("mkdir -p '%s'%s", dir, "");
        write_shard(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run r;
    run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 77);
    pthread_t t;
    if (rank == victim)
        pthread_create(&t, NULL, killer, (void *)delay);
    for (int s = 0; s < STEPS; s++) {
        train(&r, 1, NULL);
        must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "save");
    }
    run_close(&r); /* not killed in time: the trial is a plain run */
}

/* After a trial: every checkpoint in the store verifies (no partial one is
 * ever a step-N directory), the newest loads, its state equals that of an
 * uninterrupted run to its step, and the run saves again. */
static void do_check(const char *dir, llmt_comm *comm)
{
    char ckpt[900];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    run r, ref;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_OK, "resume after a kill: status %d: %s", rc, llmt_error_last());
    if (rank == 0) {
        int64_t steps[64];
        size_t n = 0;
        must(llmt_ckpt_list(r.store, LLMT_CKPT_DURABLE, steps, 64, &n), "list");
        for (size_t i = 0; i < n; i++)
            EXPECT(llmt_ckpt_verify(r.store, steps[i], LLMT_CKPT_DURABLE) == LLMT_OK,
                   "step %lld does not verify: %s", (long long)steps[i], llmt_error_last());
        EXPECT(n == 0 || steps[n - 1] == step, "resumed from %lld, the newest is %lld",
               (long long)step, (long long)steps[n - 1]);
    }
    if (step > 0) {
        run_open(&ref, dir, LLMT_PRECISION_BF16_MIXED, NULL, LLMT_REDUCE_DETERMINISTIC, NULL, 0,
                 77);
        train(&ref, (int)step, NULL);
        const llmt_buf *a[3] = {&r.opt->m, &r.opt->v, &r.opt->master};
        const llmt_buf *b[3] = {&ref.opt->m, &ref.opt->v, &ref.opt->master};
        size_t es[3];
        section_sizes(&r, es);
        int same = memcmp(r.model->weights.ptr, ref.model->weights.ptr, r.model->weights.bytes) == 0;
        for (int k = 0; k < 3; k++)
            same &= r.opt->end == r.opt->first ||
                    memcmp(a[k]->ptr, (const char *)b[k]->ptr + (size_t)r.opt->first * es[k],
                           (size_t)(r.opt->end - r.opt->first) * es[k]) == 0;
        EXPECT(same, "the state resumed from step %lld is not the uninterrupted run's",
               (long long)step);
        run_close(&ref);
    }
    train(&r, 1, NULL);
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "save after the resume");
    run_close(&r);
    if (rank == 0)
        printf("resumed from step %lld\n", (long long)step);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc >= 3 ? argv[1] : "";
    if (!(argc == 3 && (!strcmp(mode, "save") || !strcmp(mode, "load") || !strcmp(mode, "check"))) &&
        !(argc == 4 && !strcmp(mode, "churn"))) {
        if (rank == 0)
            fprintf(stderr, "usage: %s save|load|check DIR, or churn DIR SEED\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    llmt_comm_mpi *m = NULL;
    must(llmt_comm_mpi_create(&m, MPI_COMM_WORLD), "comm");
    if (!strcmp(mode, "save"))
        do_save(argv[2], m->comm);
    else if (!strcmp(mode, "load"))
        do_load(argv[2], m->comm);
    else if (!strcmp(mode, "check"))
        do_check(argv[2], m->comm);
    else
        do_churn(argv[2], m->comm, (unsigned)strtoul(argv[3], NULL, 10));
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    llmt_comm_mpi_free(m);
    MPI_Finalize();
    if (rank == 0)
        printf("%s %s on %d ranks: %s\n", argv[1], argv[2], size, all ? "FAILED" : "all passed");
    return all ? 1 : 0;
}
