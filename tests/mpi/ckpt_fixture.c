/* The sharded-checkpoint tests' shared fixture (ckpt_fixture.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>
#include <xxhash.h>

#include "ckpt_fixture.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"

void sh(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0)
        must(LLMT_EIO, cmd);
}

void copy_ckpt(const char *dir, const char *tag, char *out, size_t cap)
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

char log_text[8192];

void keep_log(void *user, const char *line)
{
    (void)user;
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", line);
}

int64_t resume(run *r, const char *dir, llmt_comm *comm, const char *ckpt, int *status)
{
    run_open(r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 5);
    log_text[0] = '\0';
    must(llmt_trainer_set_log(r->tr, keep_log, NULL), "log");
    int64_t step = -1, lo = 0, hi = 0;
    *status = llmt_trainer_resume_latest(r->tr, &step);
    MPI_Allreduce(&step, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&step, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT(lo == hi, "the ranks resumed from steps %lld..%lld", (long long)lo, (long long)hi);
    return step;
}

int same_as_uninterrupted(const run *r, const char *dir, int64_t steps)
{
    run ref;
    run_open(&ref, dir, LLMT_PRECISION_BF16_MIXED, NULL, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    train(&ref, (int)steps, NULL);
    const llmt_buf *a[3] = {&r->opt->m, &r->opt->v, &r->opt->master};
    const llmt_buf *b[3] = {&ref.opt->m, &ref.opt->v, &ref.opt->master};
    const size_t es[3] = {llmt_dtype_size(r->opt->state_dt), llmt_dtype_size(r->opt->state_dt),
                          sizeof(float)};
    int same = memcmp(r->model->weights.ptr, ref.model->weights.ptr, r->model->weights.bytes) == 0;
    for (int k = 0; k < 3; k++)
        same &= r->opt->end == r->opt->first ||
                memcmp(a[k]->ptr, (const char *)b[k]->ptr + (size_t)r->opt->first * es[k],
                       (size_t)(r->opt->end - r->opt->first) * es[k]) == 0;
    run_close(&ref);
    return same;
}

void enter_node(const char *base, const char *layout)
{
    if (rank == 0)
        sh("mkdir -p '%s/A' '%s/B'", base, base);
    MPI_Barrier(MPI_COMM_WORLD);
    char path[1000];
    snprintf(path, sizeof path, "%s/%c", base, layout[rank]);
    if (chdir(path) != 0)
        must(LLMT_EIO, path);
}

void read_manifest(const char *ckpt, int step, llmt_manifest *m)
{
    static char text[1 << 16];
    char path[1100];
    snprintf(path, sizeof path, "%s/step-%08d/MANIFEST", ckpt, step);
    FILE *f = fopen(path, "rb");
    size_t len = f ? fread(text, 1, sizeof text, f) : 0;
    if (f)
        fclose(f);
    must(llmt_manifest_parse(text, len, m), path);
}

void rechunk(const char *ckpt, int spoil)
{
    enum { CH = 4096 };
    static char data[1 << 18];
    char path[1100];
    llmt_manifest m;
    read_manifest(ckpt, HALF, &m);
    m.chunk_bytes = CH;
    for (int32_t r = 0; r < m.world_size; r++) {
        llmt_manifest_shard *s = &m.shards[r];
        snprintf(path, sizeof path, "%s/step-%08d/%s", ckpt, HALF, s->file.name);
        FILE *f = fopen(path, "rb");
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
    size_t len = 0;
    must(llmt_manifest_format(&m, &out, &len), "format the MANIFEST");
    snprintf(path, sizeof path, "%s/step-%08d/MANIFEST", ckpt, HALF);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(out, 1, len, f) != len || fclose(f) != 0)
        must(LLMT_EIO, path);
    free(out);
    llmt_manifest_clear(&m);
}
