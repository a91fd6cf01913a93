/* llmt_comm: the host's collectives behind checked wrappers, and the
 * agreement checks every rank runs before it trusts the others. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dist/comm_internal.h"

/* Room for the failing rank's message that llmt_comm_agree passes on. */
#define AGREE_MESSAGE_BYTES 1024

static int engine_failed(const llmt_comm *c, const char *what, int status)
{
    if (c->engine_free) /* the library's own engine said what failed */
        return llmt_fail_prefix(LLMT_ECOMM, "rank %d: %s", c->ops.rank, what);
    return llmt_fail(LLMT_ECOMM, "rank %d: %s: the communication engine failed (status %d)",
                     c->ops.rank, what, status);
}

/* LLMT_EINVAL when any of n counts or offsets reaches LLMT_COMM_CALL_MAX. */
static int check_counts(const llmt_comm *c, const char *what, const size_t *a, const size_t *b,
                        size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] >= LLMT_COMM_CALL_MAX || (b && b[i] >= LLMT_COMM_CALL_MAX))
            return llmt_fail(LLMT_EINVAL, "rank %d: %s: a count or offset of %zu bytes is over "
                             "the per-call limit", c->ops.rank, what,
                             a[i] > (b ? b[i] : 0) ? a[i] : b[i]);
    return LLMT_OK;
}

/* The checks of an all-to-all's counts and offsets (check_counts). */
static int check_alltoallv(const llmt_comm *c, const char *what, const size_t *send_bytes,
                           const size_t *send_offsets, const size_t *recv_bytes,
                           const size_t *recv_offsets)
{
    size_t n = (size_t)c->ops.size;
    LLMT_TRY(check_counts(c, what, send_bytes, send_offsets, n));
    return check_counts(c, what, recv_bytes, recv_offsets, n);
}

/* Adds an all-to-all's bytes to the other ranks to bytes_sent. */
static void count_alltoallv(llmt_comm *c, const size_t *send_bytes)
{
    for (int32_t i = 0; i < c->ops.size; i++)
        c->bytes_sent += i == c->ops.rank ? 0 : (int64_t)send_bytes[i];
}

int llmt_comm_alltoallv(llmt_comm *c, const char *what, const void *send, const size_t *send_bytes,
                        const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                        const size_t *recv_offsets)
{
    LLMT_TRY(check_alltoallv(c, what, send_bytes, send_offsets, recv_bytes, recv_offsets));
    int st = c->ops.alltoallv(c->ops.user, send, send_bytes, send_offsets, recv, recv_bytes,
                              recv_offsets);
    if (st)
        return engine_failed(c, what, st);
    count_alltoallv(c, send_bytes);
    return LLMT_OK;
}

int llmt_comm_alltoallv_add(llmt_comm *c, const char *what, const void *send,
                            const size_t *send_bytes, const size_t *send_offsets, void *recv,
                            const size_t *recv_bytes, const size_t *recv_offsets, float *sum,
                            int64_t n, int dt)
{
    LLMT_TRY(check_alltoallv(c, what, send_bytes, send_offsets, recv_bytes, recv_offsets));
    int st = c->alltoallv_add(c->ops.user, send, send_bytes, send_offsets, recv, recv_bytes,
                              recv_offsets, sum, n, dt);
    if (st)
        return engine_failed(c, what, st);
    count_alltoallv(c, send_bytes);
    return LLMT_OK;
}

int llmt_comm_join(llmt_comm *c, const char *what)
{
    int st = c->join(c->ops.user);
    return st ? engine_failed(c, what, st) : LLMT_OK;
}

int llmt_comm_allgatherv(llmt_comm *c, const char *what, const void *send, void *recv,
                         const size_t *bytes, const size_t *offsets)
{
    size_t n = (size_t)c->ops.size;
    LLMT_TRY(check_counts(c, what, bytes, offsets, n));
    int st = c->ops.allgatherv(c->ops.user, send, recv, bytes, offsets);
    if (st)
        return engine_failed(c, what, st);
    c->bytes_sent += (int64_t)bytes[c->ops.rank] * (c->ops.size - 1);
    return LLMT_OK;
}

int llmt_comm_broadcast(llmt_comm *c, const char *what, void *buf, size_t bytes, int32_t root)
{
    LLMT_TRY(check_counts(c, what, &bytes, NULL, 1));
    int st = c->ops.broadcast(c->ops.user, buf, bytes, root);
    if (st)
        return engine_failed(c, what, st);
    if (root == c->ops.rank)
        c->bytes_sent += (int64_t)bytes * (c->ops.size - 1);
    return LLMT_OK;
}

int llmt_comm_broadcast_all(llmt_comm *c, const char *what, void *buf, size_t bytes, int32_t root)
{
    const size_t window = LLMT_COMM_CALL_MAX - 1;
    for (size_t done = 0; done < bytes; done += window)
        LLMT_TRY(llmt_comm_broadcast(c, what, (char *)buf + done,
                                     bytes - done < window ? bytes - done : window, root));
    return LLMT_OK;
}

int llmt_comm_allreduce_i64(llmt_comm *c, const char *what, int64_t *values, size_t count, int op)
{
    size_t bytes = count * sizeof *values;
    LLMT_TRY(check_counts(c, what, &bytes, NULL, 1));
    int st = c->ops.allreduce_i64(c->ops.user, values, count, op);
    if (st)
        return engine_failed(c, what, st);
    c->bytes_sent += c->ops.size > 1 ? (int64_t)bytes : 0; /* the values, counted once */
    return LLMT_OK;
}

int llmt_comm_allgather_items(llmt_comm *c, const char *what, void *buf, size_t item_bytes)
{
    const int32_t n = c->ops.size;
    size_t *bytes = c->counts; /* sizes, then offsets */
    for (int32_t i = 0; i < n; i++) {
        bytes[i] = item_bytes;
        bytes[n + i] = (size_t)i * item_bytes;
    }
    return llmt_comm_allgatherv(c, what, (char *)buf + bytes[n + c->ops.rank], buf, bytes,
                                bytes + n);
}

int llmt_comm_allgather_ranges(llmt_comm *c, const char *what, void *buf, size_t elem_size,
                               const int64_t *bounds)
{
    const int32_t n = c->ops.size;
    size_t *bytes = c->counts, *offsets = c->counts + n;
    const int64_t window = (int64_t)((LLMT_COMM_CALL_MAX - 1) / elem_size);
    int rc = LLMT_OK;
    for (int64_t w0 = bounds[0]; w0 < bounds[n] && !rc; w0 += window) {
        int64_t w1 = w0 + window < bounds[n] ? w0 + window : bounds[n];
        for (int32_t i = 0; i < n; i++) {
            int64_t a = bounds[i] > w0 ? bounds[i] : w0;
            int64_t b = bounds[i + 1] < w1 ? bounds[i + 1] : w1;
            bytes[i] = b > a ? (size_t)(b - a) * elem_size : 0;
            offsets[i] = b > a ? (size_t)(a - w0) * elem_size : 0;
        }
        char *recv = (char *)buf + (size_t)w0 * elem_size;
        rc = llmt_comm_allgatherv(c, what, recv + offsets[c->ops.rank], recv, bytes, offsets);
    }
    return rc;
}

/* Checks that the ranks agree on the size and each holds a distinct rank. */
static int check_membership(llmt_comm *c)
{
    const char *fn = "llmt_comm_create";
    int64_t sizes[2] = {c->ops.size, -(int64_t)c->ops.size};
    LLMT_TRY(llmt_comm_allreduce_i64(c, fn, sizes, 2, LLMT_COMM_MAX));
    if (sizes[0] != -sizes[1])
        return llmt_fail(LLMT_ECOMM, "%s: rank %d: the ranks disagree on the size (from %lld to "
                         "%lld; this rank says %d)", fn, c->ops.rank, (long long)-sizes[1],
                         (long long)sizes[0], c->ops.size);
    int64_t *seen = (int64_t *)c->values;
    memset(seen, 0, (size_t)c->ops.size * sizeof *seen);
    seen[c->ops.rank] = 1;
    int rc = llmt_comm_allreduce_i64(c, fn, seen, (size_t)c->ops.size, LLMT_COMM_SUM);
    for (int32_t r = 0; !rc && r < c->ops.size; r++)
        if (seen[r] != 1)
            rc = llmt_fail(LLMT_ECOMM, "%s: rank %d is held by %lld processes (each rank must "
                           "be held by exactly one)", fn, r, (long long)seen[r]);
    return rc;
}

void llmt_comm_ops_init(llmt_comm_ops *ops)
{
    if (ops) {
        const llmt_comm_ops defaults = LLMT_COMM_OPS_INIT;
        *ops = defaults;
    }
}

int llmt_comm_create(llmt_comm **out, const llmt_comm_ops *ops)
{
    const char *fn = "llmt_comm_create";
    if (!out || !ops)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, out ? "ops" : "out");
    *out = NULL;
    if (ops->version != LLMT_COMM_OPS_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: ops->version = %u, this library knows %u", fn,
                         ops->version, LLMT_COMM_OPS_VERSION);
    if (ops->size < 1 || ops->rank < 0 || ops->rank >= ops->size)
        return llmt_fail(LLMT_EINVAL, "%s: ops->rank = %d, ops->size = %d (need 0 <= rank < "
                         "size)", fn, ops->rank, ops->size);
    const char *missing = !ops->alltoallv ? "alltoallv" : !ops->allgatherv ? "allgatherv"
                        : !ops->broadcast ? "broadcast" : !ops->allreduce_i64 ? "allreduce_i64"
                        : !ops->barrier ? "barrier" : NULL;
    if (missing)
        return llmt_fail(LLMT_EINVAL, "%s: ops->%s is NULL", fn, missing);
    return llmt_comm_adopt(out, ops, NULL, NULL);
}

int llmt_comm_adopt(llmt_comm **out, const llmt_comm_ops *ops, void (*engine_free)(void *user),
                    const struct llmt_device *device)
{
    llmt_comm *c = calloc(1, sizeof *c);
    if (!c) {
        if (engine_free)
            engine_free(ops->user);
        return llmt_fail(LLMT_ENOMEM, "llmt_comm_create: out of host memory");
    }
    c->ops = *ops;
    c->engine_free = engine_free;
    c->device = device;
    c->counts = calloc((size_t)ops->size * 4, sizeof *c->counts);
    c->values = calloc((size_t)ops->size, sizeof *c->values);
    int rc = !c->counts || !c->values
                 ? llmt_fail(LLMT_ENOMEM, "llmt_comm_create: out of host memory")
                 : check_membership(c);
    if (rc) {
        llmt_comm_free(c);
        return rc;
    }
    *out = c;
    return LLMT_OK;
}

void llmt_comm_free(llmt_comm *c)
{
    if (!c)
        return;
    if (c->engine_free)
        c->engine_free(c->ops.user);
    free(c->counts);
    free(c->values);
    free(c);
}

int32_t llmt_comm_rank(const llmt_comm *c)
{
    return c ? c->ops.rank : -1;
}

int32_t llmt_comm_size(const llmt_comm *c)
{
    return c ? c->ops.size : -1;
}

int64_t llmt_comm_bytes_sent(const llmt_comm *c)
{
    return c ? c->bytes_sent : -1;
}

int llmt_comm_check_same(llmt_comm *c, const char *what, uint64_t value)
{
    const char *fn = "llmt_comm_check_same";
    if (!c || !what)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, c ? "what" : "comm");
    const int32_t n = c->ops.size;
    uint64_t *all = c->values;
    all[c->ops.rank] = value;
    int rc = llmt_comm_allgather_items(c, what, all, sizeof *all);
    for (int32_t i = 1; !rc && i < n; i++)
        if (all[i] != all[0])
            rc = llmt_fail(LLMT_ECOMM, "rank %d: %s differs between rank 0 and rank %d",
                           c->ops.rank, what, i);
    return rc;
}

/* A rank that failed (its message own) and could not tell the others: the
 * agreement's failure (status rc, a communication error), with this rank's
 * own failure after it, which it would otherwise lose. */
static int own_failure(int rc, const char *own)
{
    char agreement[AGREE_MESSAGE_BYTES];
    snprintf(agreement, sizeof agreement, "%s", llmt_error_last());
    return llmt_fail(rc, "%s (this rank had failed before: %s)", agreement, own);
}

int llmt_comm_agree_code(llmt_comm *c, int status, int *failed_status)
{
    const char *what = "llmt_comm_agree";
    const int32_t n = c->ops.size;
    *failed_status = LLMT_OK;
    /* The failed rank's status, then its message (kept here: a failing
     * collective below replaces llmt_error_last()). */
    struct {
        int32_t status;
        char text[AGREE_MESSAGE_BYTES];
    } failure = {status, {0}};
    if (status)
        snprintf(failure.text, sizeof failure.text, "%s", llmt_error_last());
    /* The lowest failed rank r contributes n - r, the largest value. */
    int64_t flag = status ? n - c->ops.rank : 0;
    int rc = llmt_comm_allreduce_i64(c, what, &flag, 1, LLMT_COMM_MAX);
    if (rc)
        return status ? own_failure(rc, failure.text) : rc;
    if (!flag)
        return LLMT_OK;
    int32_t failed = n - (int32_t)flag;
    rc = llmt_comm_broadcast(c, what, &failure, sizeof failure, failed);
    if (rc)
        return status ? own_failure(rc, failure.text) : rc;
    *failed_status = failure.status;
    /* A rank that failed itself keeps its own status; its message gains its rank. */
    if (status) {
        char mine[24];
        snprintf(mine, sizeof mine, "rank %d:", c->ops.rank);
        return strncmp(llmt_error_last(), mine, strlen(mine)) == 0
                   ? status : llmt_fail_prefix(status, "rank %d", c->ops.rank);
    }
    failure.text[sizeof failure.text - 1] = '\0';
    return llmt_fail(LLMT_ECOMM, "rank %d: rank %d failed: %s", c->ops.rank, failed, failure.text);
}

int llmt_comm_agree(llmt_comm *c, int status)
{
    if (!c)
        return llmt_fail(LLMT_EINVAL, "llmt_comm_agree: comm is NULL");
    int failed_status = LLMT_OK;
    return llmt_comm_agree_code(c, status, &failed_status);
}
