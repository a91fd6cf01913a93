/* A test double of NCCL for the CUDA emulator, NOT NCCL: tests/gpu/emulate.sh
 * builds it as the libnccl.so.2 that the emulated plugin's NCCL engine
 * (cuda/comm_nccl.cu) dlopens, so that the engine's code runs without a GPU.
 * It implements tests/gpu/emu/nccl/nccl.h over MPI, NCCL rank i being MPI
 * rank i of MPI_COMM_WORLD. The emulator runs work at launch and its device
 * memory is host memory, so every call does its work before it returns
 * (streams are ignored) and no error is ever asynchronous. Where MPI is not
 * initialised (llmt-train --data-parallel as one process) it makes
 * communicators of one rank only. A call not done within GROUP_TIMEOUT_S
 * seconds (ranks whose calls are out of step) fails and breaks the communicator,
 * instead of hanging. As NCCL's, ncclCommDestroy waits for every other rank
 * to release the communicator (destroy or abort) and ncclCommAbort does not
 * wait; ncclGetErrorString names the result only, and ncclGetLastError
 * gives the text of the last failure. One thread at a time calls it. */
#define _GNU_SOURCE
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "nccl.h"

struct ncclComm {
    MPI_Comm mpi; /* a duplicate of MPI_COMM_WORLD; MPI_COMM_NULL: one rank without MPI */
    int rank, nranks;
    int broken; /* a call timed out: its messages may still arrive, so every later one fails */
};

/* Seconds a group's sends and recvs, or a collective, may take before the
 * call fails (a mismatched order of calls between ranks would otherwise
 * hang); LLMT_FAKE_NCCL_TIMEOUT_S (seconds, > 0) replaces it, for tests of
 * failures. */
#define GROUP_TIMEOUT_S 120

static double timeout_s(void)
{
    const char *v = getenv("LLMT_FAKE_NCCL_TIMEOUT_S");
    double t = v ? atof(v) : 0.0;
    return t > 0.0 ? t : GROUP_TIMEOUT_S;
}

/* An ncclSend or ncclRecv waiting for the end of its group. */
typedef struct p2p {
    int is_send;
    void *buf;
    size_t bytes;
    int peer;
    ncclComm_t comm;
} p2p;

static int group_depth;
static p2p *pending;
static size_t n_pending, cap_pending;

/* The text of the last failure, which ncclGetLastError gives. */
static char last_text[512];

static const char *result_name(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

/* Records the formatted text (prefixed "fake NCCL over MPI: ", as NCCL's
 * last error is its last warning) and returns r. */
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    int n = snprintf(last_text, sizeof last_text, "fake NCCL over MPI: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_text + n, sizeof last_text - (size_t)n, fmt, ap);
    va_end(ap);
    return r;
}

/* ncclRemoteError naming the MPI call and MPI's reason, for a failed call. */
static ncclResult_t mpi_failed(const char *call, int err)
{
    char why[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, why, &len);
    return fail(ncclRemoteError, "%s: %s", call, why);
}

/* Bytes of one element of dt in *bytes; ncclInvalidArgument for a type
 * the engine does not use. */
static ncclResult_t type_bytes(ncclDataType_t dt, size_t *bytes)
{
    if (dt == ncclUint8)
        *bytes = 1;
    else if (dt == ncclInt64)
        *bytes = 8;
    else
        return fail(ncclInvalidArgument, "data type %d is not one this stand-in has", (int)dt);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    return result_name(result);
}

/* As NCCL's: the process's last failure, whatever the communicator; "" before any. */
const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_text;
}

/* 128 random bytes: ranks given different ids are told apart. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    if (getrandom(uniqueId->internal, sizeof uniqueId->internal, 0) !=
        (ssize_t)sizeof uniqueId->internal)
        return fail(ncclSystemError, "ncclGetUniqueId: getrandom failed");
    return ncclSuccess;
}

/* What each rank tells the others when it joins. */
typedef struct joiner {
    int rank, nranks;
    char id[NCCL_UNIQUE_ID_BYTES];
} joiner;

/* Joins c (rank and nranks set) with every MPI rank: all exchange their
 * (rank, nranks, id) over a duplicate of MPI_COMM_WORLD and, seeing the
 * same table, all succeed or all fail naming the same rank (no hang). */
static ncclResult_t join(ncclComm_t c, const ncclUniqueId *id)
{
    int err = MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
    if (err != MPI_SUCCESS)
        return mpi_failed("MPI_Comm_dup", err);
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    int world = 0;
    MPI_Comm_size(c->mpi, &world);
    joiner mine = {c->rank, c->nranks, {0}};
    memcpy(mine.id, id->internal, sizeof mine.id);
    joiner *all = calloc((size_t)world, sizeof *all);
    if (!all)
        return fail(ncclSystemError, "ncclCommInitRank: out of host memory");
    ncclResult_t r = ncclSuccess;
    err = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, c->mpi);
    if (err != MPI_SUCCESS)
        r = mpi_failed("MPI_Allgather", err);
    for (int i = 0; i < world && r == ncclSuccess; i++) {
        if (all[i].rank != i || all[i].nranks != world)
            r = fail(ncclInvalidUsage, "MPI rank %d joined as rank %d of %d, but NCCL rank i must "
                     "be MPI rank i of MPI_COMM_WORLD's %d", i, all[i].rank, all[i].nranks, world);
        else if (memcmp(all[i].id, all[0].id, sizeof all[i].id) != 0)
            r = fail(ncclInvalidUsage, "rank %d was given another unique id than rank 0", i);
    }
    free(all);
    return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    int mpi_on = 0, mpi_done = 0;
    MPI_Initialized(&mpi_on);
    MPI_Finalized(&mpi_done);
    if ((!mpi_on || mpi_done) && nranks > 1)
        return fail(ncclInvalidUsage, "ncclCommInitRank: %d ranks, but MPI is not running: "
                    "without it this stand-in makes communicators of one rank only", nranks);
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c)
        return fail(ncclSystemError, "ncclCommInitRank: out of host memory");
    c->mpi = MPI_COMM_NULL;
    c->rank = rank;
    c->nranks = nranks;
    ncclResult_t r = mpi_on && !mpi_done ? join(c, &commId) : ncclSuccess;
    if (r != ncclSuccess) {
        if (c->mpi != MPI_COMM_NULL)
            MPI_Comm_free(&c->mpi);
        free(c);
        return r;
    }
    *comm = c;
    return ncclSuccess;
}

/* The tag of the empty message each rank's release (destroy or abort)
 * sends every other rank; the sends and recvs of groups use tag 0. */
enum { RELEASE_TAG = 1 };

/* Seconds ncclCommDestroy waits for the other ranks' releases. NCCL's waits
 * without a bound; this stand-in gives up after GROUP_TIMEOUT_S, whatever
 * LLMT_FAKE_NCCL_TIMEOUT_S says, so that a release that is not bounded
 * fails a test (which measures it) instead of hanging it. */
#define DESTROY_TIMEOUT_S GROUP_TIMEOUT_S

/* Tells every other rank that this one released comm: an empty message,
 * sent without waiting (MPI delivers it on its own). */
static void announce_release(ncclComm_t comm)
{
    for (int i = 0; i < comm->nranks; i++) {
        MPI_Request req = MPI_REQUEST_NULL;
        if (i != comm->rank &&
            MPI_Isend(NULL, 0, MPI_BYTE, i, RELEASE_TAG, comm->mpi, &req) == MPI_SUCCESS)
            MPI_Request_free(&req);
    }
}

/* Waits for every other rank's release of comm, at most DESTROY_TIMEOUT_S
 * seconds: as NCCL's proxy thread waits for the node's other ranks to
 * close their connections. */
static ncclResult_t await_releases(ncclComm_t comm)
{
    MPI_Request *req = malloc((size_t)comm->nranks * sizeof *req);
    if (!req)
        return fail(ncclSystemError, "ncclCommDestroy: out of host memory");
    int n = 0, err = MPI_SUCCESS;
    for (int i = 0; i < comm->nranks && err == MPI_SUCCESS; i++)
        if (i != comm->rank)
            err = MPI_Irecv(NULL, 0, MPI_BYTE, i, RELEASE_TAG, comm->mpi, &req[n++]);
    int done = 0;
    const double start = MPI_Wtime();
    while (err == MPI_SUCCESS && !done && MPI_Wtime() - start < DESTROY_TIMEOUT_S)
        err = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    free(req); /* the requests of a failure are left to MPI, as a broken call's */
    if (err != MPI_SUCCESS)
        return mpi_failed("ncclCommDestroy: MPI_Irecv/MPI_Testall", err);
    if (!done)
        return fail(ncclRemoteError, "ncclCommDestroy: rank %d: the other ranks did not release "
                    "the communicator within %d s", comm->rank, DESTROY_TIMEOUT_S);
    return ncclSuccess;
}

/* Waits for the other ranks' releases, then frees comm. */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    int mpi_done = 0;
    MPI_Finalized(&mpi_done);
    ncclResult_t r = ncclSuccess;
    if (comm->mpi != MPI_COMM_NULL && !mpi_done) {
        announce_release(comm);
        r = await_releases(comm);
        if (r == ncclSuccess)
            MPI_Comm_free(&comm->mpi);
    }
    free(comm);
    return r;
}

/* Tells the other ranks and frees comm without waiting, and without
 * MPI_Comm_free, whose collective nature could wait for ranks that
 * failed. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess; /* as NCCL's */
    int mpi_done = 0;
    MPI_Finalized(&mpi_done);
    if (comm->mpi != MPI_COMM_NULL && !mpi_done)
        announce_release(comm);
    free(comm);
    return ncclSuccess;
}

/* Work finishes before each call returns: never an asynchronous error. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: %s is NULL",
                    comm ? "asyncError" : "comm");
    *asyncError = ncclSuccess;
    return ncclSuccess;
}

/* Without MPI (one rank): the k-th send to itself goes to the k-th recv. */
static ncclResult_t run_alone(void)
{
    size_t s = 0, r = 0;
    for (;;) {
        while (s < n_pending && !pending[s].is_send)
            s++;
        while (r < n_pending && pending[r].is_send)
            r++;
        if (s == n_pending && r == n_pending)
            return ncclSuccess;
        if (s == n_pending || r == n_pending || pending[s].bytes != pending[r].bytes)
            return fail(ncclInvalidUsage, "ncclGroupEnd: a send to itself without a recv of "
                        "its size, or the reverse");
        memmove(pending[r].buf, pending[s].buf, pending[s].bytes);
        s++;
        r++;
    }
}

/* Waits for the posted requests for at most timeout_s() seconds;
 * *done says whether they finished (their statuses filled). */
static int wait_bounded(int n, MPI_Request *req, MPI_Status *st, int *done)
{
    const double start = MPI_Wtime();
    int err = MPI_SUCCESS;
    *done = 0;
    const double limit = timeout_s();
    while (err == MPI_SUCCESS && !*done && MPI_Wtime() - start < limit)
        err = MPI_Testall(n, req, done, st);
    return err;
}

/* Over MPI: every recv and send posted at once and waited for, with one tag:
 * MPI matches the messages between two ranks in the order they were posted,
 * which is NCCL's rule for sends and recvs (groups are not numbered: a rank
 * with nothing to exchange makes no call). A recv of another size than its
 * send, or a group not done within GROUP_TIMEOUT_S (calls out of step
 * between ranks), fails instead of hanging. */
static ncclResult_t run_mpi(ncclComm_t c)
{
    enum { TAG = 0 };
    MPI_Request *req = malloc(n_pending * sizeof *req);
    MPI_Status *st = malloc(n_pending * sizeof *st);
    if (!req || !st) {
        free(req);
        free(st);
        return fail(ncclSystemError, "ncclGroupEnd: out of host memory");
    }
    int err = MPI_SUCCESS, done = 0;
    size_t posted = 0;
    for (size_t i = 0; i < n_pending && err == MPI_SUCCESS; i++) {
        const p2p *p = &pending[i];
        const int n = (int)p->bytes;
        err = p->is_send ? MPI_Isend(p->buf, n, MPI_BYTE, p->peer, TAG, c->mpi, &req[i])
                         : MPI_Irecv(p->buf, n, MPI_BYTE, p->peer, TAG, c->mpi, &req[i]);
        posted += err == MPI_SUCCESS;
    }
    if (err == MPI_SUCCESS)
        err = wait_bounded((int)posted, req, st, &done);
    ncclResult_t r = ncclSuccess;
    if (err != MPI_SUCCESS || !done) {
        c->broken = 1;
        for (size_t i = 0; i < posted; i++)
            if (req[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&req[i]);
                MPI_Request_free(&req[i]);
            }
    }
    if (err != MPI_SUCCESS)
        r = mpi_failed("MPI_Isend/MPI_Irecv/MPI_Testall", err);
    else if (!done)
        r = fail(ncclRemoteError, "ncclGroupEnd: rank %d's %zu sends and recvs not done after "
                 "%g s (the ranks' calls out of step?)", c->rank, posted, timeout_s());
    for (size_t i = 0; i < posted && r == ncclSuccess; i++) {
        int got = 0;
        if (pending[i].is_send || MPI_Get_count(&st[i], MPI_BYTE, &got) != MPI_SUCCESS ||
            (size_t)got == pending[i].bytes)
            continue;
        r = fail(ncclInvalidUsage, "ncclGroupEnd: rank %d received %d bytes from rank %d, "
                 "%zu expected (sends and recvs out of step)", c->rank, got, pending[i].peer,
                 pending[i].bytes);
    }
    free(req);
    free(st);
    return r;
}

/* Runs the group's sends and recvs (all on one communicator) and empties it. */
static ncclResult_t run_group(void)
{
    ncclResult_t r = ncclSuccess;
    for (size_t i = 1; i < n_pending && r == ncclSuccess; i++)
        if (pending[i].comm != pending[0].comm)
            r = fail(ncclInvalidUsage, "ncclGroupEnd: sends and recvs of two communicators in "
                     "one group (this stand-in takes one)");
    if (r == ncclSuccess && n_pending)
        r = pending[0].comm->mpi == MPI_COMM_NULL ? run_alone() : run_mpi(pending[0].comm);
    n_pending = 0;
    return r;
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    return --group_depth ? ncclSuccess : run_group();
}

/* Queues a send or recv; outside a group it runs at once, as a group of one. */
static ncclResult_t enqueue(const char *call, int is_send, void *buf, size_t count,
                            ncclDataType_t datatype, int peer, ncclComm_t comm)
{
    size_t es = 0;
    ncclResult_t r = type_bytes(datatype, &es);
    if (r != ncclSuccess)
        return r;
    if (!comm || (count && !buf))
        return fail(ncclInvalidArgument, "%s: %s is NULL", call, comm ? "the buffer" : "comm");
    if (comm->broken)
        return fail(ncclRemoteError, "%s: an earlier call timed out on this communicator", call);
    if (peer < 0 || peer >= comm->nranks)
        return fail(ncclInvalidArgument, "%s: peer %d of %d ranks", call, peer, comm->nranks);
    if (count > (size_t)INT_MAX / es)
        return fail(ncclInvalidArgument, "%s: %zu elements pass MPI's int count", call, count);
    if (n_pending == cap_pending) {
        size_t cap = cap_pending ? 2 * cap_pending : 16;
        p2p *grown = realloc(pending, cap * sizeof *grown);
        if (!grown)
            return fail(ncclSystemError, "%s: out of host memory", call);
        pending = grown;
        cap_pending = cap;
    }
    pending[n_pending++] = (p2p){is_send, buf, count * es, peer, comm};
    return group_depth ? ncclSuccess : run_group();
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return enqueue("ncclSend", 1, (void *)sendbuff, count, datatype, peer, comm);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return enqueue("ncclRecv", 0, recvbuff, count, datatype, peer, comm);
}

/* A copy of bytes bytes of buf (malloc'ed; NULL when out of memory) that
 * a collective runs on: see collective_done. */
static void *work_copy(const void *buf, size_t bytes)
{
    void *copy = malloc(bytes ? bytes : 1);
    if (copy && bytes)
        memcpy(copy, buf, bytes);
    return copy;
}

/* Waits (bounded, as a group) for a collective started with status err on
 * work (a work_copy), then copies its bytes bytes to recvbuff and frees
 * it. One not done in time breaks the communicator; as it cannot be
 * cancelled, MPI may still write work, which is left to it, so that the
 * caller may free recvbuff after ncclCommAbort, as NCCL's allows. */
static ncclResult_t collective_done(ncclComm_t comm, const char *call, int err, MPI_Request *req,
                                    void *work, void *recvbuff, size_t bytes)
{
    int done = 0;
    MPI_Status st;
    const int started = err == MPI_SUCCESS;
    if (started)
        err = wait_bounded(1, req, &st, &done);
    if (err != MPI_SUCCESS || !done) {
        comm->broken = 1;
        if (!started)
            free(work);
        if (err != MPI_SUCCESS)
            return mpi_failed(call, err);
        return fail(ncclRemoteError, "%s: rank %d not done after %g s (the ranks' calls out of "
                    "step?)", call, comm->rank, timeout_s());
    }
    if (bytes)
        memcpy(recvbuff, work, bytes);
    free(work);
    return ncclSuccess;
}

/* The checks of a collective: comm, the buffers, the count, and no open
 * group (this stand-in runs collectives at once). Bytes in *bytes. */
static ncclResult_t collective_args(const char *call, const void *sendbuff, const void *recvbuff,
                                    size_t count, ncclDataType_t datatype, ncclComm_t comm,
                                    size_t *bytes)
{
    size_t es = 0;
    ncclResult_t r = type_bytes(datatype, &es);
    if (r != ncclSuccess)
        return r;
    if (!comm || (count && (!sendbuff || !recvbuff)))
        return fail(ncclInvalidArgument, "%s: %s is NULL", call, comm ? "a buffer" : "comm");
    if (comm->broken)
        return fail(ncclRemoteError, "%s: an earlier call timed out on this communicator", call);
    if (count > (size_t)INT_MAX / es)
        return fail(ncclInvalidArgument, "%s: %zu elements pass MPI's int count", call, count);
    if (group_depth)
        return fail(ncclInvalidUsage, "%s inside a group (this stand-in runs collectives at once)",
                    call);
    *bytes = count * es;
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    size_t bytes = 0;
    ncclResult_t r = collective_args("ncclBroadcast", sendbuff, recvbuff, count, datatype, comm,
                                     &bytes);
    if (r != ncclSuccess)
        return r;
    if (root < 0 || root >= comm->nranks)
        return fail(ncclInvalidArgument, "ncclBroadcast: root %d of %d ranks", root, comm->nranks);
    if (comm->rank == root && sendbuff != recvbuff)
        memmove(recvbuff, sendbuff, bytes);
    if (comm->mpi == MPI_COMM_NULL)
        return ncclSuccess;
    void *work = work_copy(recvbuff, bytes);
    if (!work)
        return fail(ncclSystemError, "ncclBroadcast: out of host memory");
    MPI_Request req = MPI_REQUEST_NULL;
    int err = MPI_Ibcast(work, (int)bytes, MPI_BYTE, root, comm->mpi, &req);
    return collective_done(comm, "ncclBroadcast", err, &req, work, recvbuff, bytes);
}

/* int64 sums and maxima: what the engine reduces. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    (void)stream;
    size_t bytes = 0;
    ncclResult_t r = collective_args("ncclAllReduce", sendbuff, recvbuff, count, datatype, comm,
                                     &bytes);
    if (r != ncclSuccess)
        return r;
    if (datatype != ncclInt64 || (op != ncclSum && op != ncclMax))
        return fail(ncclInvalidArgument, "ncclAllReduce: type %d, op %d (this stand-in reduces "
                    "ncclInt64 with ncclSum or ncclMax)", (int)datatype, (int)op);
    if (comm->mpi == MPI_COMM_NULL) {
        if (sendbuff != recvbuff)
            memmove(recvbuff, sendbuff, bytes);
        return ncclSuccess;
    }
    void *work = work_copy(sendbuff, bytes);
    if (!work)
        return fail(ncclSystemError, "ncclAllReduce: out of host memory");
    MPI_Request req = MPI_REQUEST_NULL;
    int err = MPI_Iallreduce(MPI_IN_PLACE, work, (int)count, MPI_INT64_T,
                             op == ncclSum ? MPI_SUM : MPI_MAX, comm->mpi, &req);
    return collective_done(comm, "ncclAllReduce", err, &req, work, recvbuff, bytes);
}
