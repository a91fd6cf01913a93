/* llmt-train under a launcher: which rank of how many this process is, as
 * the environment of mpirun/mpiexec, Slurm or a torchrun-style launcher
 * says; MPI started and checked against it; the library's communicator
 * over MPI (llmt/comm_mpi.h), also for one process (--data-parallel); every
 * stderr line tagged with the rank; the ranks' agreements (a bounded one
 * where a rank may never arrive) and rank 0's broadcast (the NCCL id).
 * Built without MPI (LLMT_TRAIN_HAVE_MPI undefined), a multi-rank launch is
 * refused. docs/distributed.md describes the launches. */
#define _GNU_SOURCE /* fopencookie */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef LLMT_TRAIN_HAVE_MPI
#include <llmt/comm_mpi.h>
#endif

#include "train_cli.h"

/* The variables of one kind of launcher: size, rank, node-local rank (NULL
 * when it has none; the local rank then comes from MPI). */
typedef struct env_source {
    const char *name, *size, *rank, *local_rank;
} env_source;

/* In order of precedence: a launcher's own variables first, so mpirun inside
 * a Slurm allocation is read as mpirun. Slurm's step size comes first: in a
 * batch script outside srun, SLURM_NTASKS is the allocation's. */
static const env_source sources[] = {
    {"Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"MPICH/PMI", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"},
    {"Slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"},
    {"torchrun-style", "WORLD_SIZE", "RANK", "LOCAL_RANK"},
};

/* Reads variable var, which must be set because size_var is, as an
 * integer in [lo, hi] into *out; 0, or -1 with a message naming it. */
static int env_int(const char *var, const char *size_var, long lo, long hi, int *out)
{
    const char *s = getenv(var);
    if (!s) {
        fprintf(stderr, PROG ": %s is set but %s is not: a launch names both "
                "(docs/distributed.md)\n", size_var, var);
        return -1;
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s=%s is not an integer in [%ld, %ld] (docs/distributed.md)\n",
                var, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int launch_detect(launch *l)
{
    memset(l, 0, sizeof *l);
    l->world = 1;
    l->local_rank = -1;
    l->how = "a single process";
    l->fail_wait_s = LAUNCH_FAIL_WAIT_S;
    for (size_t i = 0; i < sizeof sources / sizeof *sources; i++) {
        const env_source *s = &sources[i];
        if (!getenv(s->size))
            continue;
        if (env_int(s->size, s->size, 1, INT_MAX, &l->world) ||
            env_int(s->rank, s->size, 0, l->world - 1, &l->rank))
            return 2;
        if (getenv(s->local_rank) &&
            env_int(s->local_rank, s->size, 0, l->world - 1, &l->local_rank))
            return 2;
        snprintf(l->vars, sizeof l->vars, "%s %s=%s, %s=%d", s->name, s->size, getenv(s->size),
                 s->rank, l->rank);
        l->how = l->vars;
        return 0;
    }
    return 0;
}

#ifdef LLMT_TRAIN_HAVE_MPI

/* ---- stderr lines tagged "rank N: " */

static int tag_rank;
static int at_line_start = 1;

static int write_all(const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Writes buf with "rank N: " before each line, tag and line in one write
 * where they fit PIPE_BUF: a launcher that merges the ranks' stderr pipes
 * then cannot cut a line of one rank into another's. */
static ssize_t tagged_write(void *cookie, const char *buf, size_t n)
{
    (void)cookie;
    char out[PIPE_BUF];
    for (size_t done = 0; done < n;) {
        size_t used = at_line_start ? (size_t)snprintf(out, sizeof out, "rank %d: ", tag_rank) : 0;
        const char *nl = memchr(buf + done, '\n', n - done);
        size_t len = nl ? (size_t)(nl - (buf + done)) + 1 : n - done;
        if (len > sizeof out - used)
            len = sizeof out - used; /* a longer line goes in pieces */
        memcpy(out + used, buf + done, len);
        if (write_all(out, used + len))
            return -1;
        done += len;
        at_line_start = buf[done - 1] == '\n';
    }
    return (ssize_t)n;
}

/* From here on, each line written to stderr starts with "rank N: ". */
static int tag_stderr(int rank)
{
    tag_rank = rank;
    cookie_io_functions_t io = {NULL, tagged_write, NULL, NULL};
    FILE *f = fopencookie(NULL, "w", io);
    if (!f || setvbuf(f, NULL, _IOLBF, 0) != 0) {
        fprintf(stderr, PROG ": rank %d: cannot tag stderr with the rank\n", rank);
        return -1;
    }
    fflush(stderr);
    stderr = f;
    return 0;
}

/* The rank among the processes of this node (those sharing memory). */
static int node_local_rank(void)
{
    MPI_Comm node;
    int r = -1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(node, &r);
        MPI_Comm_free(&node);
    }
    return r;
}

/* 1 when flag is set on any rank of MPI_COMM_WORLD, else 0. */
static int world_any(int flag)
{
    int any = flag;
    MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any;
}

/* After MPI_Init of a rank (provided: the thread level MPI gives): the
 * node-local rank, the library's communicator over MPI, stderr tagged and,
 * off rank 0, stdout discarded. 0, or 1 agreed by the ranks (reported). */
static int join_ranks(launch *l, int rank, int provided)
{
    if (provided < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, PROG ": rank %d: the MPI library gives thread level %d, below "
                "MPI_THREAD_SERIALIZED (%d) which llmt-train asks for\n", rank, provided,
                MPI_THREAD_SERIALIZED);
        return 1;
    }
    if (l->local_rank < 0)
        l->local_rank = node_local_rank();
    if (l->local_rank < 0)
        fprintf(stderr, PROG ": rank %d: MPI cannot tell this process's rank on its node\n", rank);
    llmt_comm_mpi *m = NULL;
    int rc = llmt_comm_mpi_create(&m, MPI_COMM_WORLD);
    if (rc)
        fprintf(stderr, PROG ": rank %d: the communicator over MPI: %s%s%s\n", rank,
                llmt_status_string(rc), llmt_error_last()[0] ? ": " : "", llmt_error_last());
    if (world_any(rc != LLMT_OK || l->local_rank < 0)) {
        llmt_comm_mpi_free(m);
        return 1;
    }
    l->adapter = m;
    l->comm = m->comm;
    if (tag_stderr(rank))
        return 1;
    /* Rank 0 alone writes the progress: the other ranks' stdout goes nowhere. */
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, PROG ": cannot send stdout to /dev/null: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

int launch_start(launch *l, int *argc, char ***argv)
{
    if (l->world == 1)
        return 0;
    int provided = 0, size = 0, rank = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, PROG ": rank %d: MPI_Init failed (%s)\n", l->rank, l->how);
        return 1;
    }
    l->mpi_started = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size == 1) { /* alone: no other rank to agree with */
        fprintf(stderr, PROG ": the environment (%s) says %d ranks, but MPI started this "
                "process alone: llmt-train joins its ranks through MPI, so start them with "
                "`mpirun -n %d " PROG " ...` or `srun --mpi=pmix -n %d " PROG " ...`; torchrun "
                "cannot start it (docs/distributed.md)\n", l->how, l->world, l->world, l->world);
        return 2;
    }
    int bad = size != l->world || rank != l->rank;
    if (bad)
        fprintf(stderr, PROG ": rank %d: MPI says rank %d of %d, but the environment (%s) says "
                "rank %d of %d: launch with one launcher\n", rank, rank, size, l->how, l->rank,
                l->world);
    if (world_any(bad))
        return 2;
    return join_ranks(l, rank, provided);
}

int launch_start_alone(launch *l)
{
    if (l->comm)
        return 0;
    int provided = 0, size = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, PROG ": --data-parallel: MPI_Init failed (%s)\n", l->how);
        return 1;
    }
    l->mpi_started = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 1) { /* a launcher whose variables launch_detect does not know */
        fprintf(stderr, PROG ": --data-parallel: MPI says %d ranks, but the environment names "
                "no launch of them (docs/distributed.md)\n", size);
        return 2;
    }
    return join_ranks(l, 0, provided);
}

int launch_max(const launch *l, int value)
{
    if (!l->adapter)
        return value;
    llmt_comm_mpi *m = l->adapter;
    int64_t v = value;
    /* Through the adapter's own table: the library's byte counts stay its own. */
    if (m->ops.allreduce_i64(m->ops.user, &v, 1, LLMT_COMM_MAX) != MPI_SUCCESS) {
        fprintf(stderr, PROG ": cannot agree with the other ranks (the MPI all-reduce failed)\n");
        return value ? value : -1;
    }
    return (int)v;
}

int launch_broadcast(const launch *l, void *buf, size_t bytes)
{
    if (!l->adapter)
        return 0;
    llmt_comm_mpi *m = l->adapter;
    if (m->ops.broadcast(m->ops.user, buf, bytes, 0) != MPI_SUCCESS) {
        fprintf(stderr, PROG ": cannot receive rank 0's data (the MPI broadcast failed)\n");
        return -1;
    }
    return 0;
}

/* Waits for req; when this rank failed, for at most wait_s seconds. 0
 * when it completed. */
static int wait_bounded(MPI_Request *req, int failed, int wait_s)
{
    if (!failed)
        return MPI_Wait(req, MPI_STATUS_IGNORE) == MPI_SUCCESS ? 0 : -1;
    const double deadline = MPI_Wtime() + wait_s;
    for (int done = 0; MPI_Wtime() < deadline;) {
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return -1;
        if (done)
            return 0;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    return -1;
}

int launch_max_bounded(const launch *l, int value, int exit_status)
{
    if (!l->mpi_started)
        return value;
    int worst = value;
    MPI_Request req;
    if (MPI_Iallreduce(&value, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req) != MPI_SUCCESS ||
        wait_bounded(&req, value != 0, l->fail_wait_s)) {
        fprintf(stderr, PROG ": the other ranks did not answer within %d s of this rank's failure: "
                "ending the job\n", l->fail_wait_s);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, exit_status);
    }
    return worst;
}

int launch_end(launch *l, int status)
{
    if (l->adapter)
        llmt_comm_mpi_free(l->adapter);
    l->adapter = NULL;
    l->comm = NULL;
    if (!l->mpi_started)
        return status;
    launch_max_bounded(l, status, status ? status : 1);
    MPI_Finalize();
    l->mpi_started = 0;
    return status;
}

#else /* built without MPI */

int launch_start(launch *l, int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (l->world == 1)
        return 0;
    fprintf(stderr, PROG ": the environment (%s) says %d ranks, but this " PROG " was built "
            "without MPI, which it needs to join them: rebuild with MPI found (Debian: "
            "openmpi-bin libopenmpi-dev; see docs/distributed.md), or run it as one process "
            "without these variables\n", l->how, l->world);
    return 2;
}

int launch_start_alone(launch *l)
{
    (void)l;
    fprintf(stderr, PROG ": --data-parallel on the cpu backend trains over MPI, but this " PROG
            " was built without it: rebuild with MPI found (Debian: openmpi-bin "
            "libopenmpi-dev; see docs/distributed.md)\n");
    return 2;
}

int launch_max(const launch *l, int value)
{
    (void)l;
    return value;
}

int launch_max_bounded(const launch *l, int value, int exit_status)
{
    (void)l, (void)exit_status;
    return value;
}

int launch_broadcast(const launch *l, void *buf, size_t bytes)
{
    (void)l;
    (void)buf;
    (void)bytes;
    return 0;
}

int launch_end(launch *l, int status)
{
    (void)l;
    return status;
}

#endif
