/* Sharded checkpoints (format_version 2) under mpiexec.
 *
 *   test_ckpt_sharded save DIR   (-n 4) trains a bf16_mixed run, saves at
 *       steps 5 and 10 (each rank writes its own optimizer file, checked
 *       here against the rank's own buffers), records the state at step 10
 *       and that of the uninterrupted run at step 20, and checks that a
 *       save failing on one rank fails on all and leaves nothing behind;
 *       step 10 saved again from optimizers offloaded differently on each
 *       rank writes the same files, and resumed into ranks placed another
 *       way gives the same bits 10 steps later.
 *   test_ckpt_sharded load DIR   (-n 1, 2, 3, 8) resumes DIR's checkpoint
 *       at its world size: every weight and state tensor equal to the saved
 *       ones, and 10 more steps give the uninterrupted run's bits; a
 *       flipped, truncated or deleted optimizer file is refused (file named)
 *       and every rank falls back to step 5, as when a rank finds a chunk
 *       damaged while reading (test_ckpt_resume.c tests more). With -n 1
 *       also: llmt_ckpt_consolidate against a single-process save of the
 *       same state, byte for byte.
 *   test_ckpt_sharded async DIR   (-n 2, 3) saves every 2 steps: async
 *       saves write the very files of sync saves of the same steps, and the
 *       step returns while its writer thread is held; staging that does not
 *       fit on one rank makes every rank save synchronously (logged); a
 *       write failing on one rank's writer thread fails the next step on
 *       every rank, the previous checkpoint stays the newest, and the next
 *       save writes; llmt_trainer_free with a save in flight runs no
 *       collective: it returns at once on a rank whose peers are elsewhere,
 *       commits nothing and leaves no temporary directory.
 *   test_ckpt_sharded churn DIR SEED   trains DIR's run from step 0, saving
 *       after every step (keeping 2; async saves for an odd SEED), while one
 *       rank (chosen by SEED) kills itself with SIGKILL at a random instant
 *       inside one of the saves 4 to 7 (a timer armed as that save starts),
 *       the victim keeping in DIR/phase where it is: sync, S inside
 *       llmt_trainer_save; async, W in its writer, C in the commit (the
 *       join); - elsewhere; then
 *   test_ckpt_sharded check DIR   checks that every checkpoint left
 *       verifies, that the newest loads with the uninterrupted run's state,
 *       and that the run saves again (ckpt_kill.sh runs the trials).
 *   test_ckpt_sharded churn-nodes DIR SEED LAYOUT   the same with the ranks
 *       on two simulated nodes (LAYOUT: "AABB", a node per rank; DIR
 *       absolute), saving after every step into a fast tier local to each
 *       node and every 3 steps into the durable one, while one rank kills
 *       itself inside one of the fast saves 2 to 6 (for an odd SEED inside
 *       its close, where the other nodes' leaders commit before rank 0);
 *       then
 *   test_ckpt_sharded check-nodes DIR TAG LAYOUT SAVED   checks DIR/TAG (the
 *       churn's DIR/nodes or a copy) with the ranks on the nodes of LAYOUT
 *       (SAVED: the churn's): every rank resumes the newest checkpoint whose
 *       files it finds on its node (found here from the files; rank 0's
 *       newest fast one must be whole when LAYOUT is SAVED) with the
 *       uninterrupted run's state, and both tiers save again
 *       (ckpt_kill_nodes.sh runs the trials).
 *
 * DIR is shared by the save (a ctest fixture) and the loads; each load works
 * on its own copies, so loads may run side by side. Threads: one per rank. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "ckpt_fixture.h"
#include "dp_run.h"
#include "file_limit.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/dist_ckpt.h"
#include "train/dist_fast_tier.h"
#include "train/trainer_internal.h"

/* The element sizes of the state sections (exp_avg, exp_avg_sq, master). */
static void section_sizes(const run *r, size_t es[3])
{
    es[0] = es[1] = llmt_dtype_size(r->opt->state_dt);
    es[2] = sizeof(float);
}

/* A malloc'ed copy of the raw bytes of this rank's range of state section
 * k (exp_avg, exp_avg_sq, master): its host segment [first, split), then
 * its device segment [split, end) (the CPU backend's memory is host
 * memory), whatever the optimizer's placement. */
static char *own_section(const run *r, int k)
{
    const llmt_optimizer *o = r->opt;
    const llmt_buf *host[3] = {&o->hm, &o->hv, &o->hmaster}, *dev[3] = {&o->m, &o->v, &o->master};
    char *out = malloc(host[k]->bytes + dev[k]->bytes + 1);
    if (host[k]->bytes)
        memcpy(out, host[k]->ptr, host[k]->bytes);
    if (dev[k]->bytes)
        memcpy(out + host[k]->bytes, dev[k]->ptr, dev[k]->bytes);
    return out;
}

/* The raw bytes of the weights, then of each state section over the whole
 * flat buffer (gathered from the ranks' ranges), written by rank 0 to path. */
static void dump(const char *path, const run *r)
{
    const llmt_model *m = r->model;
    const llmt_optimizer *o = r->opt;
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
        char *mine = own_section(r, k);
        MPI_Gatherv(mine, counts[rank], MPI_BYTE, out + at, counts, displs, MPI_BYTE, 0,
                    MPI_COMM_WORLD);
        free(mine);
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
        char *mine = own_section(r, k);
        EXPECT(n == 0 || memcmp(want + at + (size_t)o->first * es[k], mine, n) == 0,
               "%s on %d ranks: state section %d of [%lld, %lld) differs from %s", what, size, k,
               (long long)o->first, (long long)o->end, path);
        free(mine);
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

/* A save that fails on one rank (its file size limit, `limit` bytes)
 * fails on every rank, naming that rank elsewhere and its optimizer file
 * there, and leaves neither the step nor a temporary directory: step 10
 * stays the newest. On rank 0 the limit lets the weights file through
 * while its optimizer file, written at the same time on a thread of its
 * own, fails. */
static void test_failed_save(const char *ckpt, run *r, int victim, rlim_t limit)
{
    struct rlimit old;
    if (rank == victim)
        file_limit_set(limit, &old);
    int rc = llmt_trainer_save(r->tr, LLMT_CKPT_DURABLE);
    if (rank == victim)
        file_limit_restore(&old);
    char who[32], file[64];
    snprintf(who, sizeof who, "rank %d", victim);
    snprintf(file, sizeof file, "optimizer-%05d-of-%05d", victim + 1, size);
    EXPECT(rc != LLMT_OK, "a save failing on rank %d succeeded here", victim);
    EXPECT(rank == victim || strstr(llmt_error_last(), who),
           "the message does not name rank %d: %s", victim, llmt_error_last());
    EXPECT(rank != victim || strstr(llmt_error_last(), file),
           "rank %d's message does not name its file: %s", victim, llmt_error_last());
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

/* The offload placements of the 4 ranks' optimizers (layers of 2; -1: all)
 * in the offloaded save and in the resume, and where each rank's range
 * then lies against the offloaded prefix: I inside, S straddling, P past
 * (the ranges are [0, 4096), [4096, 12288), [12288, 16384), [16384,
 * 20640); checked, so the cases cannot silently go). Every rank's split
 * differs between the two. do_save runs on 4 ranks (rank % 4: no overrun
 * on others, where it fails). */
static const int32_t save_layers[4] = {LLMT_OFFLOAD_ALL_LAYERS, 2, 1, 2};
static const char save_where[] = "IIPS";
static const int32_t resume_layers[4] = {0, 1, LLMT_OFFLOAD_ALL_LAYERS, 1};
static const char resume_where[] = "PSIP";

/* Whether r's range lies where `where` says against its optimizer's split. */
static void expect_where(const run *r, char where, const char *what)
{
    const llmt_optimizer *o = r->opt;
    char is = o->split == o->first ? 'P' : o->split == o->end ? 'I' : 'S';
    EXPECT(is == where, "%s: rank %d's range [%lld, %lld) split at %lld lies %c, not %c", what,
           rank, (long long)o->first, (long long)o->end, (long long)o->split, is, where);
}

/* r at step HALF (its state in saved.bin): each rank's optimizer offloaded
 * as save_layers says, a synchronous save into DIR/ckpt-offload writes the
 * very files of the save without offload in ckpt, MANIFEST included (it
 * records no placement); then r's placement is none again. */
static void test_offloaded_save(const char *dir, const char *ckpt, run *r)
{
    char other[900];
    snprintf(other, sizeof other, "%s/ckpt-offload", dir);
    must(llmt_optimizer_set_offload(r->opt, LLMT_OFFLOAD_OPTIMIZER, save_layers[rank % 4]),
         "offload");
    expect_where(r, save_where[rank % 4], "the offloaded save");
    llmt_ckpt_store *mine = r->store, *store = NULL;
    if (rank == 0)
        must(llmt_ckpt_store_open(&store, r->ctx, other, NULL), "offloaded store");
    r->tr->parts.store = store;
    must(llmt_trainer_save(r->tr, LLMT_CKPT_DURABLE), "offloaded save");
    r->tr->parts.store = mine;
    llmt_ckpt_store_free(store);
    if (rank == 0) {
        char cmd[2400];
        snprintf(cmd, sizeof cmd, "diff -rq '%s/step-%08d' '%s/step-%08d'", ckpt, HALF, other,
                 HALF);
        EXPECT(system(cmd) == 0, "the offloaded save of step %d differs from the one without "
               "offload", HALF);
    }
    must(llmt_optimizer_set_offload(r->opt, LLMT_OFFLOAD_NONE, 0), "no offload");
}

/* The offloaded save resumed (another seed) by ranks placed as
 * resume_layers says: the state of saved.bin, and after 10 more steps that
 * of final.bin, bit for bit. */
static void test_offloaded_resume(const char *dir, llmt_comm *comm)
{
    char ckpt[900], path[1000];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-offload", dir);
    offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    offload_layers = resume_layers[rank % 4];
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    offload_parts = LLMT_OFFLOAD_NONE;
    offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    EXPECT(rc == LLMT_OK && step == HALF, "offloaded resume: status %d, step %lld: %s", rc,
           (long long)step, llmt_error_last());
    expect_where(&r, resume_where[rank % 4], "the offloaded resume");
    snprintf(path, sizeof path, "%s/saved.bin", dir);
    expect_state(path, &r, "the state resumed into offloaded optimizers");
    train(&r, STEPS - HALF, NULL);
    snprintf(path, sizeof path, "%s/final.bin", dir);
    expect_state(path, &r, "10 steps after the offloaded resume");
    run_close(&r);
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
    test_offloaded_save(dir, ckpt, &r);
    train(&r, STEPS - HALF, NULL);
    snprintf(path, sizeof path, "%s/final.bin", dir);
    dump(path, &r);
    test_failed_save(ckpt, &r, 2, 1024);
    /* Rank 0: a limit between its two files' sizes at step 10 (the bf16
     * weights are the smaller): the weights fit, its optimizer range not. */
    struct stat weights, range;
    snprintf(path, sizeof path, "%s/step-%08d/model.safetensors", ckpt, HALF);
    EXPECT(stat(path, &weights) == 0, "no %s", path);
    snprintf(path, sizeof path, "%s/step-%08d/optimizer-00001-of-%05d.safetensors", ckpt, HALF,
             size);
    EXPECT(stat(path, &range) == 0 && weights.st_size + 1024 < range.st_size,
           "%s is not larger than the weights file", path);
    test_failed_save(ckpt, &r, 0, (rlim_t)(weights.st_size + range.st_size) / 2);
    run_close(&r);
    test_offloaded_resume(dir, comm);
}

/* ---- load */

/* A damaged optimizer file of step 10 (flipped byte, truncated, deleted):
 * refused naming the file (by rank 0's cheap checks, or by a rank that
 * reads it), and every rank resumes from step 5. */
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
    EXPECT(rank != 0 || strstr(log_text, "optimizer-00002-of-00004"), "%s: the refusal is not "
           "logged with the file: %s", how, log_text);
    if (rank == 0) {
        rc = llmt_ckpt_verify(r.store, HALF, LLMT_CKPT_DURABLE);
        EXPECT(rc == LLMT_ECORRUPT && strstr(llmt_error_last(), "optimizer-00002-of-00004"),
               "%s: verify gave status %d: %s", how, rc, llmt_error_last());
    }
    run_close(&r);
}

/* Chunks of 4 KiB: the state loads whole; a chunk recorded wrong (the
 * file's whole checksum still right) is found by the rank that reads it,
 * and every rank falls back to step FIRST, rank 0's log naming the file and
 * the chunk. */
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
    EXPECT(rc == LLMT_OK && step == FIRST, "a chunk found damaged by the reader: status %d, "
           "step %lld: %s", rc, (long long)step, llmt_error_last());
    EXPECT(rank != 0 || (strstr(log_text, "optimizer-00004-of-00004") &&
                         strstr(log_text, "chunk 5")),
           "the refusal of step %d is not logged with the file and the chunk: %s", HALF,
           log_text);
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

/* One process whose optimizer keeps layer 0's state (and then all of it)
 * in host memory resumes the sharded checkpoint: every state tensor, read
 * back through llmt_optimizer_get_state, equals the saved bytes. */
static void test_offloaded_load(const char *dir)
{
    char ckpt[900], path[1000];
    copy_ckpt(dir, "offload", ckpt, sizeof ckpt);
    snprintf(path, sizeof path, "%s/saved.bin", dir);
    const int32_t placements[2] = {1, LLMT_OFFLOAD_ALL_LAYERS};
    for (int k = 0; k < 2; k++) {
        run r;
        run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, NULL, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 5);
        must(llmt_optimizer_set_offload(r.opt, LLMT_OFFLOAD_OPTIMIZER, placements[k]), "offload");
        int64_t step = -1;
        must(llmt_trainer_resume_latest(r.tr, &step), "resume offloaded");
        EXPECT(step == HALF, "offloaded: resumed from %lld", (long long)step);
        const llmt_model *m = r.model;
        size_t total = m->weights.bytes + (size_t)m->num_params * 3 * sizeof(float);
        char *want = malloc(total);
        FILE *f = fopen(path, "rb");
        if (!f || fread(want, 1, total, f) != total)
            must(LLMT_EIO, path);
        fclose(f);
        for (int kind = 0; kind < 3; kind++) /* bf16_mixed: fp32 m, v and master */
            for (int32_t i = 0; i < m->n_params; i++) {
                const llmt_param *p = &m->params[i];
                float *got = malloc((size_t)p->numel * sizeof *got);
                must(llmt_optimizer_get_state(r.opt, kind, p->name, got, (size_t)p->numel),
                     "get_state");
                const char *at = want + m->weights.bytes +
                                 ((size_t)kind * (size_t)m->num_params + (size_t)p->offset) * 4;
                EXPECT(memcmp(got, at, (size_t)p->numel * 4) == 0, "offloaded (layers %d): "
                       "state %d of %s differs from the saved one", placements[k], kind, p->name);
                free(got);
            }
        free(want);
        run_close(&r);
    }
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
    if (size == 1) {
        test_consolidate(dir);
        test_offloaded_load(dir);
    }
}

/* ---- async saves */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The library's calls of llmt_dist_save_write (an async save's writer) go
 * through this wrapper (-Wl,--wrap): while `hold` is set, a call on a
 * writer thread waits for it to clear (`held` says one does), and a call on
 * the main thread sets `in_place`; `writes_done` counts finished calls. The
 * async save's close (its commit) is wrapped too. Both keep the phase in
 * phase_fd's first byte when a churn's victim set it (a write lands in the
 * page cache: a SIGKILL does not lose it). */
static pthread_t main_thread;
static atomic_int hold, held, in_place, writes_done;
static int phase_fd = -1;

/* The kill of an async churn's victim, armed by the wrappers as its write
 * (or close) number kill_at starts, kill_fraction of the shortest one so
 * far later: it lands inside that phase (or just after, when this one is
 * quicker). The writes run one at a time (each joined before the next). */
static int kill_at, kill_in_close, writes_seen, closes_seen;
static double kill_fraction, shortest_write = 1e9, shortest_close = 1e9;

static double now(void);
static void arm_kill(double seconds);

static void set_phase(char c)
{
    if (phase_fd >= 0 && pwrite(phase_fd, &c, 1, 0) != 1)
        must(LLMT_EIO, "the phase file");
}

int __real_llmt_dist_save_close(llmt_trainer *tr, llmt_dist_save *sv, int rc);
int __wrap_llmt_dist_save_close(llmt_trainer *tr, llmt_dist_save *sv, int rc);

int __wrap_llmt_dist_save_close(llmt_trainer *tr, llmt_dist_save *sv, int rc)
{
    if (phase_fd >= 0 && kill_in_close && ++closes_seen == kill_at)
        arm_kill(kill_fraction * shortest_close);
    double t0 = now();
    set_phase('C');
    rc = __real_llmt_dist_save_close(tr, sv, rc);
    set_phase('-');
    shortest_close = now() - t0 < shortest_close ? now() - t0 : shortest_close;
    return rc;
}

int __real_llmt_dist_save_write(llmt_dist_save *sv, const llmt_optimizer *o, int32_t rank,
                                int32_t size);
int __wrap_llmt_dist_save_write(llmt_dist_save *sv, const llmt_optimizer *o, int32_t rank,
                                int32_t size);

int __wrap_llmt_dist_save_write(llmt_dist_save *sv, const llmt_optimizer *o, int32_t rank,
                                int32_t size)
{
    if (atomic_load(&hold) && pthread_equal(pthread_self(), main_thread)) {
        atomic_store(&in_place, 1);
    } else if (atomic_load(&hold)) {
        atomic_store(&held, 1);
        while (atomic_load(&hold))
            usleep(1000);
    }
    if (phase_fd >= 0 && !kill_in_close && ++writes_seen == kill_at)
        arm_kill(kill_fraction * shortest_write);
    double t0 = now();
    set_phase('W');
    int rc = __real_llmt_dist_save_write(sv, o, rank, size);
    set_phase('-');
    shortest_write = now() - t0 < shortest_write ? now() - t0 : shortest_write;
    atomic_fetch_add(&writes_done, 1);
    return rc;
}

/* Waits (at most 10 s) until *flag reaches at least `least`. */
static int wait_for(atomic_int *flag, int least)
{
    for (double t0 = now(); atomic_load(flag) < least; usleep(1000))
        if (now() - t0 > 10.0)
            return 0;
    return 1;
}

/* A run over DIR's data that saves every 2 steps into ckpt, asynchronously
 * or not (set in the trainer's configuration: run_open has no such knob). */
static void open_saving_run(run *r, const char *dir, llmt_comm *comm, const char *ckpt, int async)
{
    if (rank == 0)
        sh("rm -rf '%s'%s", ckpt, "");
    MPI_Barrier(MPI_COMM_WORLD);
    run_open(r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 2, 77);
    r->tr->cfg.checkpoint_async = async;
    log_text[0] = '\0';
    must(llmt_trainer_set_log(r->tr, keep_log, NULL), "log");
}

static int committed(const char *ckpt, int step)
{
    char path[1000];
    snprintf(path, sizeof path, "%s/step-%08d", ckpt, step);
    return access(path, F_OK) == 0;
}

/* Offloads r's optimizer state up to the first layer boundary strictly
 * inside this rank's range, which then straddles the offloaded prefix's
 * end, or all of it where no boundary is inside (the range lies inside).
 * Returns whether some rank's range straddles (collective). */
static int offload_straddling(run *r)
{
    const llmt_optimizer *o = r->opt;
    int straddles = 0, any = 0;
    for (int32_t k = 1; k <= layers && !straddles; k++) {
        must(llmt_optimizer_set_offload(r->opt, LLMT_OFFLOAD_OPTIMIZER, k), "offload");
        straddles = o->first < o->split && o->split < o->end;
    }
    if (!straddles)
        must(llmt_optimizer_set_offload(r->opt, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS),
             "offload");
    MPI_Allreduce(&straddles, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any;
}

/* Async saves of steps 2, 4 and 6 (the last committed by the explicit wait,
 * llmt_trainer_save) write the very files of synchronous saves of the same
 * steps, also from offloaded optimizers (every range straddling its
 * prefix's end where a layer boundary is inside it: staged in both
 * segments); step 2 returns while its writer is held (on a thread, not run
 * in place), and nothing is committed until the writer is let go. */
static void test_async_same_bytes(const char *dir, llmt_comm *comm)
{
    char sync_ckpt[900], async_ckpt[900];
    snprintf(sync_ckpt, sizeof sync_ckpt, "%s/sync", dir);
    snprintf(async_ckpt, sizeof async_ckpt, "%s/async", dir);
    run r;
    open_saving_run(&r, dir, comm, sync_ckpt, 0);
    train(&r, 6, NULL);
    run_close(&r);
    open_saving_run(&r, dir, comm, async_ckpt, 1);
    atomic_store(&hold, 1);
    train(&r, 2, NULL);
    EXPECT(wait_for(&held, 1) && !atomic_load(&in_place), "step 2 returned without its "
           "writer held on a thread (in place: %d)", atomic_load(&in_place));
    EXPECT(rank != 0 || !committed(async_ckpt, 2), "step 2 was committed while its writer "
           "was held");
    atomic_store(&hold, 0);
    train(&r, 4, NULL);
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "the wait for step 6");
    EXPECT(!strstr(log_text, "abandoned"), "a save was abandoned: %s", log_text);
    run_close(&r);
    EXPECT(!strstr(log_text, "does not fit"), "an async save fell back: %s", log_text);
    snprintf(async_ckpt, sizeof async_ckpt, "%s/async-offload", dir);
    open_saving_run(&r, dir, comm, async_ckpt, 1);
    EXPECT(offload_straddling(&r), "no range on %d ranks straddles a layer boundary", size);
    train(&r, 6, NULL);
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "the wait for step 6 (offloaded)");
    run_close(&r);
    EXPECT(!strstr(log_text, "does not fit") && !strstr(log_text, "abandoned"),
           "an offloaded async save fell back or was abandoned: %s", log_text);
    for (int step = 2; rank == 0 && step <= 6; step += 2) {
        char cmd[2400];
        snprintf(cmd, sizeof cmd, "diff -r '%s/step-%08d' '%s/async/step-%08d'", sync_ckpt, step,
                 dir, step);
        EXPECT(system(cmd) == 0, "the async save of step %d differs from the sync one", step);
        snprintf(cmd, sizeof cmd, "diff -rq '%s/step-%08d' '%s/step-%08d'", sync_ckpt, step,
                 async_ckpt, step);
        EXPECT(system(cmd) == 0, "the offloaded async save of step %d differs from the sync "
               "one", step);
    }
}

/* Staging that does not fit on the last rank: every rank saves step 2
 * synchronously and says so (and keeps no staging). Then the last rank's
 * writer fails (its file size limit) in the async save of step 4: once
 * every writer is done, step 5 (its poll) fails on every rank naming that
 * rank's file, step 2 stays the newest and nothing else is left; the next
 * save writes step 5. */
static void test_async_failure(const char *dir, llmt_comm *comm)
{
    char ckpt[900];
    snprintf(ckpt, sizeof ckpt, "%s/failing", dir);
    const int victim = size - 1;
    run r;
    open_saving_run(&r, dir, comm, ckpt, 1);
    train(&r, 1, NULL);
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r.ctx, &ms), "memory stats");
    if (rank == victim)
        must(llmt_context_set_budget(r.ctx, ms.total_current + 1), "budget");
    train(&r, 1, NULL);
    if (rank == victim)
        must(llmt_context_set_budget(r.ctx, 0), "budget");
    EXPECT(strstr(log_text, "step 2: async save does not fit") &&
               strstr(log_text, "saving synchronously"),
           "no fallback to a sync save logged: %s", log_text);
    must(llmt_context_memory_stats(r.ctx, &ms), "memory stats");
    EXPECT(ms.current[LLMT_MEM_STAGING] == 0, "%llu bytes of staging kept after the sync "
           "fallback", (unsigned long long)ms.current[LLMT_MEM_STAGING]);
    EXPECT(rank != 0 || committed(ckpt, 2), "the sync save of step 2 was not committed");

    train(&r, 1, NULL);
    struct rlimit old;
    if (rank == victim)
        file_limit_set(1024, &old);
    const int done = atomic_load(&writes_done);
    train(&r, 1, NULL); /* step 4: its save starts; the victim's writer fails */
    EXPECT(wait_for(&writes_done, done + 1), "step 4's writer did not finish");
    if (rank == victim)
        file_limit_restore(&old);
    usleep(200000); /* the writer marks itself done just after the write returns */
    MPI_Barrier(MPI_COMM_WORLD);
    llmt_step_report rep;
    memset(&rep, 0, sizeof rep);
    rep.version = LLMT_STEP_REPORT_VERSION;
    int rc = llmt_trainer_step(r.tr, &rep); /* step 5: its poll finds every writer done */
    char file[64], who[32];
    llmt_manifest_shard_name(file, sizeof file, victim, size);
    snprintf(who, sizeof who, "rank %d failed", victim);
    const char *msg = llmt_error_last();
    EXPECT(rc != LLMT_OK && strstr(msg, "the async save of step 4 failed") && strstr(msg, file) &&
               (rank == victim || strstr(msg, who)),
           "a failed async write: status %d: %s", rc, msg);
    if (rank == 0) {
        int64_t step = -1;
        int32_t tier = -1;
        must(llmt_ckpt_latest(r.store, &step, &tier, NULL, 0), "latest");
        EXPECT(step == 2, "latest after the failed async save: %lld", (long long)step);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "test \"$(ls '%s' | grep -c -v -e '^step-00000002$' -e "
                 "'^llmt.lock$')\" = 0", ckpt);
        EXPECT(system(cmd) == 0, "the failed save left something in %s", ckpt);
    }
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "the save after the failure");
    EXPECT(rank != 0 || llmt_ckpt_verify(r.store, 5, LLMT_CKPT_DURABLE) == LLMT_OK,
           "step 5 saved: %s", llmt_error_last());
    run_close(&r);
}

/* The save in flight commits where every rank is: at the end of
 * llmt_trainer_run (step 2's), and in the step that reaches total_steps
 * (step 4's), so the free that follows abandons nothing. */
static void test_async_run_end(const char *dir, llmt_comm *comm)
{
    char ckpt[900];
    snprintf(ckpt, sizeof ckpt, "%s/ended", dir);
    run r;
    open_saving_run(&r, dir, comm, ckpt, 1);
    r.tr->cfg.total_steps = 4;
    must(llmt_trainer_run(r.tr, 2), "run");
    EXPECT(rank != 0 || committed(ckpt, 2), "step 2 not committed when llmt_trainer_run "
           "returned");
    train(&r, 2, NULL);
    EXPECT(rank != 0 || committed(ckpt, 4), "step 4 (total_steps) not committed when it "
           "returned");
    run_close(&r);
    EXPECT(!strstr(log_text, "abandoned"), "a save was abandoned: %s", log_text);
}

/* llmt_trainer_free runs no collective: with step 2's async save in flight,
 * the other ranks free while rank 0 runs none (it waits up to FREE_WAIT_S
 * for their word; a free that ran a collective would wait for rank 0 as
 * long), each free returning within FREE_MOST_S (it waits for its own
 * writer, whose fsync a slow disk may stretch); then rank 0's free removes
 * the temporary directory and commits nothing. Every rank logs why. */
static void test_async_free_local(const char *dir, llmt_comm *comm)
{
    const double FREE_WAIT_S = 20.0, FREE_MOST_S = 10.0;
    char ckpt[900];
    snprintf(ckpt, sizeof ckpt, "%s/freed", dir);
    run r;
    open_saving_run(&r, dir, comm, ckpt, 1);
    train(&r, 2, NULL);
    int word = 0, told = 0, flag = 0;
    double t0 = now();
    if (rank != 0) {
        llmt_trainer_free(r.tr);
        EXPECT(now() - t0 < FREE_MOST_S, "llmt_trainer_free on rank %d alone took %.1f s", rank,
               now() - t0);
        MPI_Send(&word, 1, MPI_INT, 0, 35, MPI_COMM_WORLD);
    } else {
        while (told < size - 1 && now() - t0 < FREE_WAIT_S) {
            MPI_Iprobe(MPI_ANY_SOURCE, 35, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
            if (flag)
                MPI_Recv(&word, 1, MPI_INT, MPI_ANY_SOURCE, 35, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            told += flag;
            usleep(flag ? 0 : 1000);
        }
        EXPECT(told == size - 1, "only %d of %d ranks returned from llmt_trainer_free while "
               "rank 0 ran no collective", told, size - 1);
        t0 = now();
        llmt_trainer_free(r.tr);
        EXPECT(now() - t0 < FREE_MOST_S, "llmt_trainer_free on rank 0 took %.1f s", now() - t0);
        for (; told < size - 1; told++) /* what a collective free sent late */
            MPI_Recv(&word, 1, MPI_INT, MPI_ANY_SOURCE, 35, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "test \"$(ls '%s')\" = llmt.lock", ckpt);
        EXPECT(system(cmd) == 0, "the abandoned save left something in %s", ckpt);
    }
    r.tr = NULL;
    EXPECT(strstr(log_text, "async save of step 2 abandoned: call llmt_trainer_save "
                  "(collective) before free"), "no abandoned save logged: %s", log_text);
    run_close(&r);
}

static void do_async(const char *dir, llmt_comm *comm)
{
    if (rank == 0) {
        sh("rm -rf '%s' && mkdir -p '%s'", dir, dir);
        write_shard(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    main_thread = pthread_self();
    test_async_same_bytes(dir, comm);
    test_async_failure(dir, comm);
    test_async_run_end(dir, comm);
    test_async_free_local(dir, comm);
}

/* ---- SIGKILL trials (driven by ckpt_kill.sh) */

enum { KEEP = 2,          /* the churn store rotates at every save from the third */
       KILL_FIRST = 4,    /* the kill comes in save KILL_FIRST.. */
       KILL_SAVES = 4 };  /* ..KILL_FIRST + KILL_SAVES - 1 (1-based) */

/* Arms a timer that sends this process SIGKILL after `seconds`. */
static void arm_kill(double seconds)
{
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGKILL;
    timer_t t;
    struct itimerspec when;
    memset(&when, 0, sizeof when);
    const long long ns = (long long)(seconds * 1e9) + 1; /* never 0: that disarms */
    when.it_value.tv_sec = (time_t)(ns / 1000000000);
    when.it_value.tv_nsec = (long)(ns % 1000000000); /* < 1e9, as timer_settime needs */
    if (timer_create(CLOCK_MONOTONIC, &ev, &t) != 0 || timer_settime(t, 0, &when, NULL) != 0)
        must(LLMT_EIO, "the kill timer");
}

/* Trains DIR's run and saves after every step into a store that keeps
 * KEEP checkpoints, synchronously (llmt_trainer_save) for an even SEED, for
 * an odd one asynchronously (the trainer's own saves: each rank's writer
 * runs while the next step trains, the commit comes at a later step's save
 * point). Rank `victim` (chosen by SEED) times its saves and, as save number
 * `at` (among the later ones) starts, arms a SIGKILL a random fraction of
 * its shortest save so far later: the kill lands inside that save (or just
 * after it, when this one is quicker). Async, "save" is its writer, or for
 * every other odd SEED its close (the agreement and commit): the wrappers
 * time them and arm the kill. The victim keeps its phase in DIR/phase:
 * sync, S inside llmt_trainer_save; async, W in its writer, C in the
 * close. */
static void do_churn(const char *dir, llmt_comm *comm, unsigned seed)
{
    srand(seed);
    const int async = seed % 2;
    int victim = rand() % size;
    int at = KILL_FIRST + rand() % KILL_SAVES;
    double fraction = (double)rand() / ((double)RAND_MAX + 1.0);
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
    run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    if (rank == 0) { /* rank 0's store, keeping KEEP */
        llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
        sc.keep = KEEP;
        must(llmt_ckpt_store_open(&r.store, r.ctx, ckpt, &sc), "store");
        r.tr->parts.store = r.store;
    }
    r.tr->cfg.checkpoint_every = async; /* set after creation: ranks but 0 have no store */
    r.tr->cfg.checkpoint_async = async;
    char phase[1000];
    snprintf(phase, sizeof phase, "%s/phase", dir);
    if (rank == victim && (phase_fd = open(phase, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
        must(LLMT_EIO, phase);
    set_phase('-');
    if (async && phase_fd >= 0) {
        kill_at = at;
        kill_in_close = seed / 2 % 2;
        kill_fraction = fraction;
    }
    double shortest = 1e9;
    for (int s = 1; s <= STEPS; s++) {
        train(&r, 1, NULL);
        if (async)
            continue; /* the wrappers arm the victim's kill */
        set_phase('S');
        if (rank == victim && s == at)
            arm_kill(fraction * shortest);
        double t0 = now();
        must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "save");
        set_phase('-');
        shortest = now() - t0 < shortest ? now() - t0 : shortest;
    }
    run_close(&r); /* not killed in time: the trial is a plain run */
    if (phase_fd >= 0)
        close(phase_fd);
}

/* Rank 0: every durable checkpoint of r's store verifies (counted as
 * failures otherwise); returns the newest's step, -1 for none. */
static int64_t newest_durable_verified(const run *r)
{
    int64_t steps[64];
    size_t n = 0;
    must(llmt_ckpt_list(r->store, LLMT_CKPT_DURABLE, steps, 64, &n), "list");
    for (size_t i = 0; i < n; i++)
        EXPECT(llmt_ckpt_verify(r->store, steps[i], LLMT_CKPT_DURABLE) == LLMT_OK,
               "durable step %lld does not verify: %s", (long long)steps[i], llmt_error_last());
    return n ? steps[n - 1] : -1;
}

/* After a trial: every checkpoint in the store verifies (no partial one is
 * ever a step-N directory), the newest loads, its state equals that of an
 * uninterrupted run to its step, and the run saves again. */
static void do_check(const char *dir, llmt_comm *comm)
{
    char ckpt[900];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    EXPECT(rc == LLMT_OK, "resume after a kill: status %d: %s", rc, llmt_error_last());
    if (rank == 0) {
        int64_t newest = newest_durable_verified(&r);
        EXPECT(newest < 0 || newest == step, "resumed from %lld, the newest is %lld",
               (long long)step, (long long)newest);
    }
    EXPECT(step <= 0 || same_as_uninterrupted(&r, dir, step),
           "the state resumed from step %lld is not the uninterrupted run's", (long long)step);
    train(&r, 1, NULL);
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "save after the resume");
    run_close(&r);
    if (rank == 0)
        printf("resumed from step %lld\n", (long long)step);
}

/* ---- SIGKILL trials on a fast tier local to each node (ckpt_kill_nodes.sh)
 *
 * Two simulated nodes (enter_node): ranks in DIR/nodes/A or B, the fast
 * tier the relative "fast", the durable one DIR/nodes/ckpt, shared. */

enum { DURABLE_EVERY = 3,     /* the node churn's durable saves (its fast ones: every step) */
       NODE_KILL_FIRST = 2,   /* the kill comes in fast save NODE_KILL_FIRST.. (in 2 or 3, */
       NODE_KILL_SAVES = 5 }; /* no durable one yet) ..NODE_KILL_FIRST + NODE_KILL_SAVES - 1 */

/* A node churn's victim aiming at the commits: its call of
 * llmt_dist_fast_commit_nodes (in llmt_dist_save_close: the other nodes'
 * leaders commit there, rank 0 right after it) in fast save number
 * commit_kill_at arms the kill, kill_fraction of the shortest span so far
 * from that call to the save's return later. commit_started: when the fast
 * save in progress made that call (-1: not yet). */
static int commit_kill_at, fast_commits_seen;
static double commit_started = -1.0, shortest_commits = 1e9;

int __real_llmt_dist_fast_commit_nodes(llmt_trainer *tr, llmt_dist_save *sv, char **text,
                                       size_t *len);
int __wrap_llmt_dist_fast_commit_nodes(llmt_trainer *tr, llmt_dist_save *sv, char **text,
                                       size_t *len);

int __wrap_llmt_dist_fast_commit_nodes(llmt_trainer *tr, llmt_dist_save *sv, char **text,
                                       size_t *len)
{
    if (phase_fd >= 0 && sv->tier == LLMT_CKPT_FAST) {
        if (++fast_commits_seen == commit_kill_at)
            arm_kill(kill_fraction * shortest_commits);
        commit_started = now();
        set_phase('C');
    }
    return __real_llmt_dist_fast_commit_nodes(tr, sv, text, len);
}

/* Trains DIR's run with the ranks on the nodes of layout ("AABB"), saving
 * into the per-node fast tier after every step and into the durable one
 * every DURABLE_EVERY (both keeping KEEP). Rank `victim` (chosen by SEED)
 * keeps in DIR/nodes/phase where it is (W: in a fast save before its
 * commits, C: in them, D: in a durable save, - elsewhere) and, in fast save
 * number `at`, kills itself: for an even SEED a random fraction of its
 * shortest fast save after the save starts, for an odd one a random fraction
 * of its shortest commits after they start. */
static void do_churn_nodes(const char *dir, llmt_comm *comm, unsigned seed, const char *layout)
{
    srand(seed);
    int victim = rand() % size;
    int at = NODE_KILL_FIRST + rand() % NODE_KILL_SAVES;
    kill_fraction = (double)rand() / ((double)RAND_MAX + 1.0);
    char base[900], ckpt[1000], data[1000], phase[1000];
    snprintf(base, sizeof base, "%s/nodes", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", base);
    snprintf(data, sizeof data, "%s/train_000000.bin", dir);
    snprintf(phase, sizeof phase, "%s/phase", base);
    if (rank == 0 && access(data, F_OK) != 0) {
        sh("mkdir -p '%s'%s", dir, "");
        write_shard(dir);
    }
    enter_node(base, layout);
    run r;
    run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    if (rank == 0) {
        llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
        sc.keep = sc.fast_keep = KEEP;
        sc.fast_dir = "fast";
        must(llmt_ckpt_store_open(&r.store, r.ctx, ckpt, &sc), "store");
        r.tr->parts.store = r.store;
    }
    if (rank == victim && (phase_fd = open(phase, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
        must(LLMT_EIO, phase);
    set_phase('-');
    if (phase_fd >= 0 && seed % 2)
        commit_kill_at = at;
    double shortest = 1e9;
    for (int s = 1; s <= STEPS; s++) {
        train(&r, 1, NULL);
        if (phase_fd >= 0 && s == at && !commit_kill_at)
            arm_kill(kill_fraction * shortest);
        set_phase('W');
        double t0 = now();
        must(llmt_trainer_save(r.tr, LLMT_CKPT_FAST), "fast save");
        shortest = now() - t0 < shortest ? now() - t0 : shortest;
        if (commit_started >= 0 && now() - commit_started < shortest_commits)
            shortest_commits = now() - commit_started;
        commit_started = -1.0;
        set_phase('D');
        if (s % DURABLE_EVERY == 0)
            must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "durable save");
        set_phase('-');
    }
    run_close(&r); /* not killed in time: the trial is a plain run */
    if (phase_fd >= 0)
        close(phase_fd);
}

/* The committed checkpoints (step-N, not step-N.tmp-*) in dir, ascending,
 * at most cap of them; their count. */
static size_t committed_steps(const char *dir, int64_t *steps, size_t cap)
{
    size_t n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) && n < cap;) {
        char *end = NULL;
        if (strlen(e->d_name) == 13 && !strncmp(e->d_name, "step-", 5))
            steps[n] = strtoll(e->d_name + 5, &end, 10);
        if (end && !*end)
            n++;
    }
    if (d)
        closedir(d);
    for (size_t i = 1; i < n; i++) /* insertion sort */
        for (size_t j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

/* Whether path is a file of `bytes` bytes. */
static int has_file(const char *path, uint64_t bytes)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == bytes;
}

/* Whether this rank's node holds fast step `step` with rank 0's MANIFEST
 * (text, len) and, at their sizes, the files of it that this rank reads:
 * the optimizer files overlapping its range of the state and, on rank 0,
 * the common files. */
static int node_holds(const run *r, int64_t step, const char *text, size_t len)
{
    char path[1200];
    snprintf(path, sizeof path, "fast/step-%08lld/MANIFEST", (long long)step);
    FILE *f = fopen(path, "rb");
    char *mine = malloc(len + 1);
    int same = f && mine && fread(mine, 1, len + 1, f) == len && !memcmp(mine, text, len);
    if (f)
        fclose(f);
    free(mine);
    llmt_manifest m;
    if (!same || llmt_manifest_parse(text, len, &m) != LLMT_OK)
        return 0;
    for (int i = 0; rank == 0 && i < m.n_files; i++) {
        snprintf(path, sizeof path, "fast/step-%08lld/%s", (long long)step, m.files[i].name);
        same &= has_file(path, m.files[i].bytes);
    }
    for (int32_t k = 0; k < m.world_size; k++) {
        const llmt_manifest_shard *s = &m.shards[k];
        snprintf(path, sizeof path, "fast/step-%08lld/%s", (long long)step, s->file.name);
        if (s->first < r->opt->end && r->opt->first < s->end)
            same &= has_file(path, s->file.bytes);
    }
    llmt_manifest_clear(&m);
    return same;
}

/* Whether every rank's node holds fast step `step` of rank 0's node as
 * node_holds says (collective). */
static int whole_everywhere(const run *r, int64_t step)
{
    static char text[1 << 16];
    char path[1100];
    int64_t len = 0;
    snprintf(path, sizeof path, "fast/step-%08lld/MANIFEST", (long long)step);
    FILE *f = rank == 0 ? fopen(path, "rb") : NULL;
    if (f) {
        len = (int64_t)fread(text, 1, sizeof text, f);
        fclose(f);
    }
    MPI_Bcast(&len, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Bcast(text, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
    int mine = len > 0 && node_holds(r, step, text, (size_t)len), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

/* The step a resume over ckpt (durable) and the nodes' fast tiers must
 * load, found from the files (collective): the newer of rank 0's newest
 * durable checkpoint and the newest fast one in rank 0's node that is
 * whole_everywhere (-1: none, a fresh start). With the ranks where the
 * churn had them (same), rank 0's newest fast checkpoint must be whole: the
 * other nodes' leaders commit before rank 0. */
static int64_t expected_step(const run *r, const char *ckpt, int same)
{
    int64_t durable[64], fast[64], found = -1;
    int64_t n[2] = {0, 0};
    if (rank == 0) {
        n[0] = (int64_t)committed_steps(ckpt, durable, 64);
        n[1] = (int64_t)committed_steps("fast", fast, 64);
    }
    MPI_Bcast(n, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Bcast(fast, (int)n[1], MPI_INT64_T, 0, MPI_COMM_WORLD);
    for (int64_t i = n[1] - 1; i >= 0 && found < 0; i--) {
        int whole = whole_everywhere(r, fast[i]);
        EXPECT(!same || whole || i < n[1] - 1, "rank 0's newest fast checkpoint, step %lld, "
               "is not whole on every node (a partial checkpoint listed as committed)",
               (long long)fast[i]);
        found = whole ? fast[i] : -1;
    }
    if (rank == 0 && n[0] > 0 && durable[n[0] - 1] > found)
        found = durable[n[0] - 1];
    MPI_Bcast(&found, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    return found;
}

/* After a node trial, with the ranks on the nodes of layout (saved: the
 * churn's layout) over DIR/tag (a copy of DIR/nodes, or itself): every rank
 * resumes expected_step's step (with none, every rank starts fresh, or
 * fails alike naming the per-node tier, and starts fresh in new objects),
 * with the uninterrupted run's state; then one more step saves to the fast
 * tier (per node when the layout has both nodes), whole on every node, and
 * to the durable one, whose checkpoints all verify, that step the newest. */
static void do_check_nodes(const char *dir, const char *tag, const char *layout,
                           const char *saved, llmt_comm *comm)
{
    char base[900], ckpt[1000];
    snprintf(base, sizeof base, "%s/%s", dir, tag);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", base);
    enter_node(base, layout);
    fast_dir = "fast";
    fast_every = 1;
    run r;
    int rc = LLMT_OK, lo = 0, hi = 0;
    int64_t step = resume(&r, dir, comm, ckpt, &rc);
    MPI_Allreduce(&rc, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&rc, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    int64_t want = expected_step(&r, ckpt, !strcmp(layout, saved));
    EXPECT(lo == hi, "the ranks' resumes returned %d..%d", lo, hi);
    EXPECT(rc == LLMT_OK || (want < 0 && strstr(llmt_error_last(), "local to each node")),
           "resume after a kill: status %d: %s", rc, llmt_error_last());
    EXPECT(step == want, "resumed from step %lld, wanted %lld", (long long)step, (long long)want);
    const char *tier = step < 0 ? "a fresh start" : strstr(log_text, "(fast tier)") ? "fast"
                                                                                   : "durable";
    if (rc != LLMT_OK) { /* none loads (and the objects may be partly overwritten): new ones */
        run_close(&r);
        run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0,
                 77);
        tier = "none, in new objects";
    }
    EXPECT(step <= 0 || same_as_uninterrupted(&r, dir, step),
           "the state resumed from step %lld is not the uninterrupted run's", (long long)step);
    train(&r, 1, NULL); /* saves to the fast tier */
    must(llmt_trainer_save(r.tr, LLMT_CKPT_DURABLE), "durable save after the resume");
    int64_t next = (step > 0 ? step : 0) + 1;
    EXPECT(whole_everywhere(&r, next), "after the resume, the fast save of step %lld is not "
           "whole on every node", (long long)next);
    EXPECT(rank != 0 || newest_durable_verified(&r) == next, "after the resume, the newest "
           "durable checkpoint is not step %lld", (long long)next);
    run_close(&r);
    if (rank == 0)
        printf("resumed from step %lld (%s)\n", (long long)step, tier);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc >= 3 ? argv[1] : "";
    const char *layout = argc == 5 && !strcmp(mode, "churn-nodes") ? argv[4]
                         : argc == 6 && !strcmp(mode, "check-nodes") ? argv[4] : NULL;
    int nodes_ok = layout && argv[2][0] == '/' && (int)strlen(layout) == size &&
                   strspn(layout, "AB") == strlen(layout) &&
                   (argc == 5 || strlen(argv[5]) == strspn(argv[5], "AB"));
    if (!(argc == 3 && (!strcmp(mode, "save") || !strcmp(mode, "load") || !strcmp(mode, "check") ||
                        !strcmp(mode, "async"))) &&
        !(argc == 4 && !strcmp(mode, "churn")) && !nodes_ok) {
        if (rank == 0)
            fprintf(stderr, "usage: %s save|load|check|async DIR, churn DIR SEED, churn-nodes "
                    "DIR SEED LAYOUT or check-nodes DIR TAG LAYOUT SAVED (DIR absolute, "
                    "LAYOUT one A or B per rank)\n", argv[0]);
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
    else if (!strcmp(mode, "async"))
        do_async(argv[2], m->comm);
    else if (!strcmp(mode, "churn-nodes"))
        do_churn_nodes(argv[2], m->comm, (unsigned)strtoul(argv[3], NULL, 10), layout);
    else if (!strcmp(mode, "check-nodes"))
        do_check_nodes(argv[2], argv[3], layout, argv[5], m->comm);
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
