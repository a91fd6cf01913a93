/* The NCCL engine (lib/dist/comm_nccl_plugin.h): the collectives of
 * llmt_comm_ops on the device memory of a CUDA backend, through
 * libnccl.so.2, which is dlopened on first use (the plugin's RUNPATH holds
 * the directory of the NCCL found when it was configured), so the plugin
 * loads and runs without NCCL until one is asked for.
 *
 * Every collective is enqueued on the engine's own stream, after an event
 * recorded on the backend's stream (so it is ordered after the kernels
 * queued before it), and then waited for by polling, for at most
 * LLMT_NCCL_TIMEOUT_S seconds; a collective that does not finish, or that
 * NCCL reports an asynchronous error for, aborts the communicator
 * (ncclCommAbort) and fails with LLMT_ECOMM naming it. Later calls on an
 * aborted engine fail at once.
 *
 * One exchange is not waited for: alltoallv_add (the gradient reduction
 * overlapped with backward) queues the exchange and the owner's sums on the
 * engine's stream and returns, and join makes the backend's stream wait for
 * them. Every NCCL call of the engine goes on its one stream, in the order
 * the host makes them, so the calls reach NCCL in the same order on every
 * rank; the next collective the host waits for first waits (bounded, as
 * above) for what was queued, and so does the release, so a queued exchange
 * that never finishes still ends in a bounded wait. A failure while
 * queuing aborts the communicator (this rank's calls are then out of step
 * with the others').
 *
 * Any failure of a collective aborts the communicator too: this rank's
 * calls are then out of step with the other ranks', whose waits then fail
 * in bounded time and abort theirs. So after a failure every rank ends in
 * ncclCommAbort, and none calls ncclCommDestroy.
 *
 * The release is collective (include/llmt/comm.h): it runs the engine's
 * barrier, waited for at most LLMT_NCCL_RELEASE_TIMEOUT_S, before
 * ncclCommDestroy. ncclCommDestroy waits, without a bound, for the other
 * ranks on the node to release theirs (NCCL's proxy thread waits for their
 * connections to close); so it is called only once every rank has reached
 * the release. A barrier that fails, does not finish (a rank died, or
 * never releases) or sums to another value than every rank's release
 * (a peer's unrelated collective paired with it) aborts the communicator
 * instead. How far that bounds the release depends on NCCL (its source):
 * a dead peer's connections close, so no version waits for it; a peer that
 * is alive and never releases is not waited for by an abort in NCCL 2.12
 * to 2.15, 2.19.1 to 2.19.3, and from 2.23 where NCCL keeps its host
 * buffers in cuMem memory (its default from CUDA driver 12.6, unless
 * NCCL_CUMEM_ENABLE or NCCL_CUMEM_HOST_ENABLE is 0), but is in 2.18 to
 * 2.22 otherwise. (A non-blocking communicator, whose destroy and abort
 * return at once, would bound it everywhere; not built: no GPU has run
 * this engine yet.) The barrier's own connections are set up when the
 * communicator is made (its first barrier, in nccl_create): NCCL sets up
 * an algorithm's connections inside the first call that needs them,
 * waiting for the peers there, before any bounded wait could start.
 *
 * Messages of NCCL failures end with ncclGetLastError's text (NCCL 2.13
 * and later; an older libnccl.so.2 lacks it and the messages do without).
 *
 * Buffers in host memory (the library's small agreement messages:
 * llmt_comm_agree, llmt_comm_check_same) are staged through a device
 * buffer of the engine, grown as needed. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "dist/comm_nccl_plugin.h"

#ifdef LLMT_CUDA_HAVE_NCCL
#include <nccl.h>

static_assert(NCCL_UNIQUE_ID_BYTES == LLMT_NCCL_ID_BYTES, "an NCCL unique id is 128 bytes");

/* Seconds the release's barrier may take (see the top of the file). Shorter
 * than LLMT_NCCL_TIMEOUT_S: when it passes, the only cost is that the
 * communicator is aborted instead of destroyed (both free all of this
 * rank's resources), while every second of it delays the exit of a rank
 * whose peer died or never releases. */
#define LLMT_NCCL_RELEASE_TIMEOUT_S 60

/* The entry points of libnccl.so.2, typed by nccl.h. */
struct nccl_lib {
    decltype(&ncclGetUniqueId) get_unique_id;
    decltype(&ncclCommInitRank) init_rank;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclCommAbort) abort;
    decltype(&ncclCommGetAsyncError) async_error;
    decltype(&ncclGetErrorString) error_string;
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclBroadcast) broadcast;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclGetLastError) last_error; /* NULL: NCCL before 2.13 */
};

static nccl_lib g_nccl;
/* Why libnccl.so.2 is unusable; empty once it loaded. Written once. */
static char g_nccl_error[768];
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

static void load_nccl(void)
{
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        snprintf(g_nccl_error, sizeof g_nccl_error, "cannot load libnccl.so.2: %s", dlerror());
        return;
    }
    const char *missing = NULL;
#define LLMT_NCCL_RESOLVE(field, symbol)                                                    \
    if (!missing &&                                                                        \
        !(g_nccl.field = reinterpret_cast<decltype(g_nccl.field)>(dlsym(h, #symbol))))     \
        missing = #symbol;
    LLMT_NCCL_RESOLVE(get_unique_id, ncclGetUniqueId)
    LLMT_NCCL_RESOLVE(init_rank, ncclCommInitRank)
    LLMT_NCCL_RESOLVE(destroy, ncclCommDestroy)
    LLMT_NCCL_RESOLVE(abort, ncclCommAbort)
    LLMT_NCCL_RESOLVE(async_error, ncclCommGetAsyncError)
    LLMT_NCCL_RESOLVE(error_string, ncclGetErrorString)
    LLMT_NCCL_RESOLVE(group_start, ncclGroupStart)
    LLMT_NCCL_RESOLVE(group_end, ncclGroupEnd)
    LLMT_NCCL_RESOLVE(send, ncclSend)
    LLMT_NCCL_RESOLVE(recv, ncclRecv)
    LLMT_NCCL_RESOLVE(broadcast, ncclBroadcast)
    LLMT_NCCL_RESOLVE(all_reduce, ncclAllReduce)
#undef LLMT_NCCL_RESOLVE
    if (missing)
        snprintf(g_nccl_error, sizeof g_nccl_error, "libnccl.so.2 lacks %s (NCCL older than "
                 "2.7?)", missing);
    g_nccl.last_error =
        reinterpret_cast<decltype(g_nccl.last_error)>(dlsym(h, "ncclGetLastError"));
}

/* The end of a message about an NCCL failure: "; NCCL's last error: "
 * and ncclGetLastError's text (NCCL's last warning in the process, which
 * may be older than the failure), or "" where libnccl.so.2 lacks the call
 * or has no text. comm may be NULL (NCCL ignores it). */
static const char *last_error_note(ncclComm_t comm, char *note, size_t size)
{
    const char *text = g_nccl.last_error ? g_nccl.last_error(comm) : NULL;
    if (text && text[0])
        snprintf(note, size, "; NCCL's last error: %s", text);
    else
        note[0] = '\0';
    return note;
}

/* LLMT_ECUDA saying why when libnccl.so.2 is unusable. */
static int nccl_loaded(const llmt_plugin_host *host)
{
    pthread_once(&g_nccl_once, load_nccl);
    return g_nccl_error[0] ? host->fail(LLMT_ECUDA, "%s", g_nccl_error) : LLMT_OK;
}

typedef struct nccl_engine {
    llmt_cuda_backend *cb;
    cudaStream_t stream;          /* every NCCL call and staging copy of the engine */
    cudaEvent_t ops_queued, done; /* recorded on cb->stream; on stream (join) */
    int pending;                  /* work queued on stream not yet waited for */
    ncclComm_t comm;              /* NULL once aborted */
    int wait_s;                   /* wait_done's bound (LLMT_NCCL_RELEASE_TIMEOUT_S in release) */
    int32_t rank, size;
    char *bounce;           /* device staging of host buffers */
    size_t bounce_bytes;
} nccl_engine;

/* LLMT_ECOMM with "NCCL <coll>: " and the formatted text. */
static int engine_fail(const nccl_engine *e, const char *coll, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int engine_fail(const nccl_engine *e, const char *coll, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return e->cb->host->fail(LLMT_ECOMM, "NCCL %s: %s", coll, text);
}

static int cuda_call(const nccl_engine *e, const char *coll, const char *call, cudaError_t err)
{
    return err == cudaSuccess ? LLMT_OK
                              : e->cb->host->fail(LLMT_ECOMM, "NCCL %s: CUDA %s: %s", coll, call,
                                                  cudaGetErrorString(err));
}

#define LLMT_NCCL_TRY(call)    \
    do {                       \
        int rc_ = (call);      \
        if (rc_)               \
            return rc_;        \
    } while (0)

/* Aborts the communicator after a failure of coll (why), with NCCL's
 * asynchronous error and last error in the message. */
static int abort_comm(nccl_engine *e, const char *coll, const char *why)
{
    ncclResult_t async = ncclSuccess;
    if (g_nccl.async_error(e->comm, &async) != ncclSuccess)
        async = ncclSystemError;
    char note[600];
    last_error_note(e->comm, note, sizeof note); /* before the abort frees comm */
    g_nccl.abort(e->comm);
    e->comm = NULL;
    return e->cb->host->fail(LLMT_ECOMM, "NCCL %s: %s; the communicator is aborted (NCCL's "
                             "asynchronous error: %s%s)", coll, why,
                             g_nccl.error_string(async), note);
}

/* A call of NCCL that enqueues work: a failure aborts the communicator
 * (this rank's calls are out of step with the others'). */
static int nccl_call(nccl_engine *e, const char *coll, const char *call, ncclResult_t r)
{
    if (r == ncclSuccess)
        return LLMT_OK;
    char why[320];
    snprintf(why, sizeof why, "%s: %s", call, g_nccl.error_string(r));
    return abort_comm(e, coll, why);
}

/* A collective's status: a failure that has not aborted the communicator
 * yet aborts it, keeping the failure's own message (see the top of the
 * file). */
static int settle(nccl_engine *e, int rc)
{
    if (rc && e->comm) {
        g_nccl.abort(e->comm);
        e->comm = NULL;
    }
    return rc;
}

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Waits until the engine's stream has run what was enqueued, for at most
 * e->wait_s seconds. Polls without sleeping for the first
 * thousand checks (a collective of a few bytes), then every 50 us. */
static int wait_done(nccl_engine *e, const char *coll)
{
    const double start = seconds_now();
    for (unsigned polls = 0;; polls++) {
        cudaError_t q = cudaStreamQuery(e->stream);
        if (q == cudaSuccess) {
            e->pending = 0;
            return LLMT_OK;
        }
        if (q != cudaErrorNotReady) {
            char why[256];
            snprintf(why, sizeof why, "the stream failed: %s", cudaGetErrorString(q));
            return abort_comm(e, coll, why);
        }
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = g_nccl.async_error(e->comm, &async);
        if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress))
            return abort_comm(e, coll, "NCCL reported an error while it ran");
        if (seconds_now() - start > e->wait_s) {
            char why[128];
            snprintf(why, sizeof why, "did not finish within %d s", e->wait_s);
            return abort_comm(e, coll, why);
        }
        if (polls >= 1000) {
            struct timespec pause = {0, 50000};
            nanosleep(&pause, NULL);
        }
    }
}

/* Makes the engine's device current on this thread and orders the
 * engine's stream after every op queued on the backend's; fails on an
 * aborted engine. */
static int begin(nccl_engine *e, const char *coll)
{
    if (!e->comm)
        return engine_fail(e, coll, "the communicator was aborted by an earlier failure");
    LLMT_NCCL_TRY(cuda_call(e, coll, "cudaSetDevice", cudaSetDevice(e->cb->device)));
    LLMT_NCCL_TRY(cuda_call(e, coll, "cudaEventRecord", cudaEventRecord(e->ops_queued,
                                                                        e->cb->stream)));
    e->pending = 1; /* until a wait_done that succeeds */
    return cuda_call(e, coll, "cudaStreamWaitEvent",
                     cudaStreamWaitEvent(e->stream, e->ops_queued, 0));
}

/* begin for a collective the host waits for: first waits (bounded) for
 * what was queued and not waited for (alltoallv_add's work, or a failed
 * collective's), so that no staging copy from pageable host memory (which
 * may synchronize with the stream) can block outside the bounded wait. */
static int begin_sync(nccl_engine *e, const char *coll)
{
    if (e->comm && e->pending)
        LLMT_NCCL_TRY(wait_done(e, coll));
    return begin(e, coll); /* pending again: this collective's work */
}

/* Whether p (not NULL) is memory the device can use directly (device
 * memory of the engine's device, or managed memory): *direct = 1; host
 * memory: 0. Device memory of another device is an error. */
static int classify(const nccl_engine *e, const char *coll, const void *p, int *direct)
{
    cudaPointerAttributes a;
    cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        return cuda_call(e, coll, "cudaPointerGetAttributes", err);
    }
    if (a.type == cudaMemoryTypeDevice && a.device != e->cb->device)
        return engine_fail(e, coll, "a buffer is on CUDA device %d, the communicator's is %d",
                           a.device, e->cb->device);
    *direct = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    return LLMT_OK;
}

/* A collective's buffers as the device sees them: send (sb bytes) and recv
 * (rb bytes, the extent of what it receives). A host buffer gets a region
 * of the bounce buffer, its bytes copied in; a host send inside a host recv
 * (in place) maps into recv's region. */
typedef struct staging {
    const void *send;
    void *recv;
    size_t sb, rb;
    char *dsend, *drecv;
    int recv_staged;
} staging;

static size_t round_up(size_t bytes)
{
    return llmt_cuda_round_up(bytes);
}

static int grow_bounce(nccl_engine *e, const char *coll, size_t bytes)
{
    if (bytes <= e->bounce_bytes)
        return LLMT_OK;
    cudaFree(e->bounce);
    e->bounce = NULL;
    e->bounce_bytes = 0;
    LLMT_NCCL_TRY(cuda_call(e, coll, "cudaMalloc of the host-buffer staging",
                            cudaMalloc((void **)&e->bounce, bytes)));
    e->bounce_bytes = bytes;
    return LLMT_OK;
}

static int stage_in(nccl_engine *e, const char *coll, staging *s)
{
    int send_direct = 1, recv_direct = 1;
    if (s->sb)
        LLMT_NCCL_TRY(classify(e, coll, s->send, &send_direct));
    if (s->rb)
        LLMT_NCCL_TRY(classify(e, coll, s->recv, &recv_direct));
    const char *r0 = (const char *)s->recv, *sp = (const char *)s->send;
    const int in_recv = !send_direct && !recv_direct && sp >= r0 && sp + s->sb <= r0 + s->rb;
    const size_t recv_region = recv_direct ? 0 : round_up(s->rb);
    const size_t send_region = send_direct || in_recv ? 0 : round_up(s->sb);
    LLMT_NCCL_TRY(grow_bounce(e, coll, recv_region + send_region));
    s->drecv = recv_direct ? (char *)s->recv : e->bounce;
    s->dsend = send_direct ? (char *)s->send
             : in_recv     ? s->drecv + (sp - r0)
                           : e->bounce + recv_region;
    s->recv_staged = !recv_direct;
    cudaStream_t st = e->stream;
    /* All of a host recv goes in, so what the collective leaves alone comes back unchanged. */
    const cudaMemcpyKind in = cudaMemcpyHostToDevice;
    if (!recv_direct)
        LLMT_NCCL_TRY(cuda_call(e, coll, "cudaMemcpyAsync to the staging",
                                cudaMemcpyAsync(s->drecv, s->recv, s->rb, in, st)));
    if (send_region)
        LLMT_NCCL_TRY(cuda_call(e, coll, "cudaMemcpyAsync to the staging",
                                cudaMemcpyAsync(s->dsend, s->send, s->sb, in, st)));
    return LLMT_OK;
}

/* Waits for the collective, then copies a staged recv back to the host. */
static int finish(nccl_engine *e, const char *coll, const staging *s)
{
    LLMT_NCCL_TRY(wait_done(e, coll));
    if (!s->recv_staged)
        return LLMT_OK;
    LLMT_NCCL_TRY(cuda_call(e, coll, "cudaMemcpyAsync from the staging",
                            cudaMemcpyAsync(s->recv, s->drecv, s->rb, cudaMemcpyDeviceToHost,
                                            e->stream)));
    return wait_done(e, coll);
}

/* Bytes from the start of a buffer that n pieces (bytes[i] at offsets[i]) span. */
static size_t extent(const size_t *bytes, const size_t *offsets, int32_t n)
{
    size_t end = 0;
    for (int32_t i = 0; i < n; i++)
        if (bytes[i] && offsets[i] + bytes[i] > end)
            end = offsets[i] + bytes[i];
    return end;
}

/* This rank's own piece, bytes from src to dst + dst_offset: a copy on
 * the stream (NCCL is not asked to send to itself); none when in place. */
static int copy_self(nccl_engine *e, const char *coll, char *dst, size_t dst_offset,
                     const char *src, size_t bytes)
{
    if (!bytes || dst + dst_offset == src)
        return LLMT_OK;
    return cuda_call(e, coll, "cudaMemcpyAsync", cudaMemcpyAsync(dst + dst_offset, src, bytes,
                                                                 cudaMemcpyDeviceToDevice,
                                                                 e->stream));
}

/* Grouped send/recv with every other rank: to i, sb[i] bytes at send +
 * so[i]; from i, rb[i] bytes into recv + ro[i] (so == NULL: every send is
 * all of send). */
static int exchange(nccl_engine *e, const char *coll, const char *send, const size_t *sb,
                    const size_t *so, char *recv, const size_t *rb, const size_t *ro)
{
    ncclResult_t r = g_nccl.group_start();
    for (int32_t i = 0; i < e->size && r == ncclSuccess; i++) {
        if (i == e->rank)
            continue;
        if (sb[i])
            r = g_nccl.send(send + (so ? so[i] : 0), sb[i], ncclUint8, i, e->comm, e->stream);
        if (r == ncclSuccess && rb[i])
            r = g_nccl.recv(recv + ro[i], rb[i], ncclUint8, i, e->comm, e->stream);
    }
    ncclResult_t end = g_nccl.group_end();
    return nccl_call(e, coll, r != ncclSuccess ? "ncclSend/ncclRecv" : "ncclGroupEnd",
                     r != ncclSuccess ? r : end);
}

/* What alltoallv asks of this rank's own piece: that it send itself what
 * it receives. */
static int check_self(const nccl_engine *e, const char *coll, const size_t *sb, const size_t *rb)
{
    if (sb[e->rank] != rb[e->rank])
        return engine_fail(e, coll, "this rank sends itself %zu bytes but receives %zu",
                           sb[e->rank], rb[e->rank]);
    return LLMT_OK;
}

/* alltoallv's work on device buffers: this rank's own piece copied, the
 * others' sent and received (check_self passed). */
static int all_to_all(nccl_engine *e, const char *coll, const char *send, const size_t *sb,
                      const size_t *so, char *recv, const size_t *rb, const size_t *ro)
{
    const size_t own = rb[e->rank];
    LLMT_NCCL_TRY(copy_self(e, coll, recv, ro[e->rank], own ? send + so[e->rank] : NULL, own));
    return exchange(e, coll, send, sb, so, recv, rb, ro);
}

/* The work of the llmt_comm_ops alltoallv (nccl_alltoallv). */
static int alltoallv_on(nccl_engine *e, const void *send, const size_t *send_bytes,
                        const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                        const size_t *recv_offsets)
{
    const char *coll = "alltoallv";
    LLMT_NCCL_TRY(begin_sync(e, coll));
    LLMT_NCCL_TRY(check_self(e, coll, send_bytes, recv_bytes));
    staging s = {send, recv, extent(send_bytes, send_offsets, e->size),
                 extent(recv_bytes, recv_offsets, e->size), NULL, NULL, 0};
    LLMT_NCCL_TRY(stage_in(e, coll, &s));
    LLMT_NCCL_TRY(all_to_all(e, coll, s.dsend, send_bytes, send_offsets, s.drecv, recv_bytes,
                             recv_offsets));
    return finish(e, coll, &s);
}

static int nccl_alltoallv(void *user, const void *send, const size_t *send_bytes,
                          const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                          const size_t *recv_offsets)
{
    nccl_engine *e = (nccl_engine *)user;
    return settle(e, alltoallv_on(e, send, send_bytes, send_offsets, recv, recv_bytes,
                                  recv_offsets));
}

/* The queuing of alltoallv_add (after begin): the exchange, then each
 * rank's piece added to sum in rank order, on the engine's stream. */
static int queue_exchange_add(nccl_engine *e, const char *coll, const void *send,
                              const size_t *send_bytes, const size_t *send_offsets, void *recv,
                              const size_t *recv_bytes, const size_t *recv_offsets, float *sum,
                              int64_t n, int dt)
{
    LLMT_NCCL_TRY(check_self(e, coll, send_bytes, recv_bytes));
    const size_t piece = (size_t)n * llmt_cuda_dt_size(dt);
    for (int32_t i = 0; i < e->size; i++)
        if (recv_bytes[i] && recv_bytes[i] != piece)
            return engine_fail(e, coll, "rank %d's piece is %zu bytes, the sum takes %zu", i,
                               recv_bytes[i], piece);
    int direct = 1;
    if (extent(send_bytes, send_offsets, e->size))
        LLMT_NCCL_TRY(classify(e, coll, send, &direct));
    if (direct && extent(recv_bytes, recv_offsets, e->size))
        LLMT_NCCL_TRY(classify(e, coll, recv, &direct));
    if (!direct)
        return engine_fail(e, coll, "a buffer is host memory (the overlapped exchange moves "
                           "device memory only)");
    LLMT_NCCL_TRY(all_to_all(e, coll, (const char *)send, send_bytes, send_offsets,
                             (char *)recv, recv_bytes, recv_offsets));
    for (int32_t i = 0; i < e->size; i++)
        if (recv_bytes[i])
            LLMT_NCCL_TRY(llmt_cuda_accumulate_on(&e->cb->base, e->stream, sum,
                                                  (const char *)recv + recv_offsets[i], n, dt));
    return LLMT_OK;
}

/* The llmt_nccl_api's alltoallv_add: alltoallv on device buffers, then
 * each rank's received piece added to sum in rank order, all queued on the
 * engine's stream without waiting (see the top of the file). Any failure
 * aborts the communicator: the other ranks' calls could no longer be
 * matched by this rank's, and their next wait then fails in bounded time. */
static int nccl_alltoallv_add(void *user, const void *send, const size_t *send_bytes,
                              const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                              const size_t *recv_offsets, float *sum, int64_t n, int dt)
{
    nccl_engine *e = (nccl_engine *)user;
    const char *coll = "alltoallv_add";
    int rc = begin(e, coll);
    if (!rc)
        rc = queue_exchange_add(e, coll, send, send_bytes, send_offsets, recv, recv_bytes,
                                recv_offsets, sum, n, dt);
    return settle(e, rc);
}

/* The work of the llmt_nccl_api's join (nccl_join). */
static int join_on(nccl_engine *e, const char *coll)
{
    if (!e->comm)
        return engine_fail(e, coll, "the communicator was aborted by an earlier failure");
    LLMT_NCCL_TRY(cuda_call(e, coll, "cudaEventRecord", cudaEventRecord(e->done, e->stream)));
    return cuda_call(e, coll, "cudaStreamWaitEvent",
                     cudaStreamWaitEvent(e->cb->stream, e->done, 0));
}

/* The llmt_nccl_api's join: the backend's stream waits for what the engine
 * queued; the host does not. A failure aborts the communicator: the
 * device's later ops would not wait for the queued work, so the caller
 * uses none of it, and the other ranks' next wait fails in bounded time. */
static int nccl_join(void *user)
{
    nccl_engine *e = (nccl_engine *)user;
    return settle(e, join_on(e, "join"));
}

/* The work of the llmt_comm_ops allgatherv (nccl_allgatherv). */
static int allgatherv_on(nccl_engine *e, const void *send, void *recv, const size_t *bytes,
                         const size_t *offsets)
{
    const char *coll = "allgatherv";
    LLMT_NCCL_TRY(begin_sync(e, coll));
    const size_t mine = bytes[e->rank];
    staging s = {send, recv, mine, extent(bytes, offsets, e->size), NULL, NULL, 0};
    LLMT_NCCL_TRY(stage_in(e, coll, &s));
    /* In place (send == recv + offsets[rank]) leaves nothing to copy. */
    LLMT_NCCL_TRY(copy_self(e, coll, s.drecv, offsets[e->rank], s.dsend, mine));
    /* To every other rank this rank's piece; from each rank i its piece. */
    size_t *sb = (size_t *)calloc((size_t)e->size, sizeof *sb);
    if (!sb)
        return e->cb->host->fail(LLMT_ENOMEM, "NCCL %s: out of host memory", coll);
    for (int32_t i = 0; i < e->size; i++)
        sb[i] = mine;
    int rc = exchange(e, coll, s.dsend, sb, NULL, s.drecv, bytes, offsets);
    free(sb);
    return rc ? rc : finish(e, coll, &s);
}

static int nccl_allgatherv(void *user, const void *send, void *recv, const size_t *bytes,
                           const size_t *offsets)
{
    nccl_engine *e = (nccl_engine *)user;
    return settle(e, allgatherv_on(e, send, recv, bytes, offsets));
}

/* The work of the llmt_comm_ops broadcast (nccl_broadcast). */
static int broadcast_on(nccl_engine *e, void *buf, size_t bytes, int32_t root)
{
    const char *coll = "broadcast";
    LLMT_NCCL_TRY(begin_sync(e, coll));
    staging s = {NULL, buf, 0, bytes, NULL, NULL, 0};
    LLMT_NCCL_TRY(stage_in(e, coll, &s));
    LLMT_NCCL_TRY(nccl_call(e, coll, "ncclBroadcast",
                            g_nccl.broadcast(s.drecv, s.drecv, bytes, ncclUint8, root, e->comm,
                                             e->stream)));
    return finish(e, coll, &s);
}

static int nccl_broadcast(void *user, void *buf, size_t bytes, int32_t root)
{
    nccl_engine *e = (nccl_engine *)user;
    return settle(e, broadcast_on(e, buf, bytes, root));
}

/* An all-reduce of count device or host values, after begin_sync. */
static int reduce(nccl_engine *e, const char *coll, int64_t *values, size_t count, int32_t op)
{
    if (op != LLMT_COMM_SUM && op != LLMT_COMM_MAX)
        return engine_fail(e, coll, "op = %d is not an llmt_comm_op", (int)op);
    staging s = {NULL, values, 0, count * sizeof *values, NULL, NULL, 0};
    LLMT_NCCL_TRY(stage_in(e, coll, &s));
    LLMT_NCCL_TRY(nccl_call(e, coll, "ncclAllReduce",
                            g_nccl.all_reduce(s.drecv, s.drecv, count, ncclInt64,
                                              op == LLMT_COMM_SUM ? ncclSum : ncclMax, e->comm,
                                              e->stream)));
    return finish(e, coll, &s);
}

static int nccl_allreduce_i64(void *user, int64_t *values, size_t count, int32_t op)
{
    nccl_engine *e = (nccl_engine *)user;
    int rc = begin_sync(e, "allreduce_i64");
    return settle(e, rc ? rc : reduce(e, "allreduce_i64", values, count, op));
}

/* What each rank adds in a barrier: a sum other than size times it means
 * a peer's other collective was paired with this barrier ("llmt"). */
#define LLMT_NCCL_BARRIER_TAG INT64_C(0x6c6c6d74)

/* An all-reduce of one value, named coll: returns when every rank has
 * reached it, and checks that the sum is every rank's barrier tag (NCCL's
 * collectives carry no tag of their own); a failure aborts the
 * communicator. */
static int barrier_named(nccl_engine *e, const char *coll)
{
    int64_t sum = LLMT_NCCL_BARRIER_TAG;
    int rc = begin_sync(e, coll);
    if (!rc)
        rc = reduce(e, coll, &sum, 1, LLMT_COMM_SUM);
    if (!rc && sum != LLMT_NCCL_BARRIER_TAG * e->size)
        rc = engine_fail(e, coll, "the barrier's sum is %lld, not %d ranks' %lld: a rank's other "
                         "collective met it (the ranks' calls are out of step); the "
                         "communicator is aborted", (long long)sum, (int)e->size,
                         (long long)(LLMT_NCCL_BARRIER_TAG * e->size));
    return settle(e, rc);
}

static int nccl_barrier(void *user)
{
    return barrier_named((nccl_engine *)user, "barrier");
}

static int nccl_unique_id(const llmt_plugin_host *host, uint8_t *id)
{
    int rc = nccl_loaded(host);
    if (rc)
        return rc;
    ncclUniqueId uid;
    ncclResult_t r = g_nccl.get_unique_id(&uid);
    char note[600];
    if (r != ncclSuccess)
        return host->fail(LLMT_ECUDA, "ncclGetUniqueId: %s%s", g_nccl.error_string(r),
                          last_error_note(NULL, note, sizeof note));
    memcpy(id, uid.internal, sizeof uid.internal);
    return LLMT_OK;
}

static void nccl_destroy(void *user)
{
    nccl_engine *e = (nccl_engine *)user;
    if (!e)
        return;
    cudaSetDevice(e->cb->device);
    /* The release's barrier (see the top of the file), which first waits
     * for what was queued (it may still read the buffers freed below); a
     * failure aborts, its message left as the thread's last error. */
    if (e->comm) {
        e->wait_s = LLMT_NCCL_RELEASE_TIMEOUT_S;
        barrier_named(e, "release");
    }
    if (e->stream)
        cudaStreamSynchronize(e->stream);
    if (e->comm)
        g_nccl.destroy(e->comm);
    if (e->stream)
        cudaStreamDestroy(e->stream);
    if (e->ops_queued)
        cudaEventDestroy(e->ops_queued);
    if (e->done)
        cudaEventDestroy(e->done);
    cudaFree(e->bounce);
    free(e);
}

static int nccl_create(llmt_device *dev, const uint8_t *id, int32_t rank, int32_t size,
                       llmt_comm_ops *ops)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    int rc = nccl_loaded(cb->host);
    if (rc)
        return rc;
    cudaError_t err = cudaSetDevice(cb->device);
    if (err != cudaSuccess)
        return cb->host->fail(LLMT_ECUDA, "cudaSetDevice(%d): %s", cb->device,
                              cudaGetErrorString(err));
    nccl_engine *e = (nccl_engine *)calloc(1, sizeof *e);
    if (!e)
        return cb->host->fail(LLMT_ENOMEM, "out of host memory");
    e->cb = cb;
    e->wait_s = LLMT_NCCL_TIMEOUT_S;
    e->rank = rank;
    e->size = size;
    err = cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&e->ops_queued, cudaEventDisableTiming);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&e->done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        nccl_destroy(e);
        return cb->host->fail(LLMT_ECUDA, "the engine's stream or events: %s",
                              cudaGetErrorString(err));
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, sizeof uid.internal);
    ncclResult_t r = g_nccl.init_rank(&e->comm, size, uid, rank);
    if (r != ncclSuccess) {
        char note[600];
        last_error_note(NULL, note, sizeof note);
        e->comm = NULL;
        nccl_destroy(e);
        return cb->host->fail(LLMT_ECUDA, "ncclCommInitRank (rank %d of %d, CUDA device %d): "
                              "%s%s", rank, size, cb->device, g_nccl.error_string(r), note);
    }
    /* The release's barrier set up now, with every rank here (see the top
     * of the file). */
    rc = barrier_named(e, "the first barrier");
    if (rc) { /* aborted: the release below waits for no rank and keeps the message */
        nccl_destroy(e);
        return rc;
    }
    *ops = llmt_comm_ops{LLMT_COMM_OPS_VERSION, rank, size, e, nccl_alltoallv, nccl_allgatherv,
                         nccl_broadcast, nccl_allreduce_i64, nccl_barrier};
    return LLMT_OK;
}

#endif

extern "C" __attribute__((visibility("default"))) int llmt_plugin_cuda_nccl(
    const llmt_plugin_host *host, uint32_t version, const llmt_nccl_api **out)
{
    if (!host || host->abi != LLMT_BACKEND_ABI || version != LLMT_NCCL_API_VERSION)
        return LLMT_EVERSION;
#ifdef LLMT_CUDA_HAVE_NCCL
    static const llmt_nccl_api api = {nccl_unique_id, nccl_create, nccl_destroy,
                                      nccl_alltoallv_add, nccl_join};
    *out = &api;
    return LLMT_OK;
#else
    (void)out;
    return host->fail(LLMT_EUNSUPPORTED, "the CUDA plugin was built without NCCL (no nccl.h when "
                      "it was configured; give its directory as NCCL_INCLUDE_DIR)");
#endif
}
