/* llmt_comm over MPI (include/llmt/comm_mpi.h), run by CTest under mpiexec
 * with 1, 2 and 4 ranks: every collective through the adapter and the
 * library's wrappers against values worked out by hand, the checks of
 * llmt_comm_create, llmt_comm_check_same and llmt_comm_agree, and the byte
 * counts. Every rank checks what it sees; the job fails when any check on
 * any rank fails, and each failure is printed with its rank and line. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm_internal.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"

static int rank, size, failures;

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            failures++;                                                                       \
            fprintf(stderr, "test_comm: rank %d of %d: %s:%d: failed: %s (llmt_error_last: "   \
                    "\"%s\")\n", rank, size, __FILE__, __LINE__, #cond, llmt_error_last());     \
        }                                                                                     \
    } while (0)

/* The status rc and a message containing want (NULL: any message). */
#define CHECK_FAIL(rc, status, want)                                                          \
    do {                                                                                      \
        CHECK((rc) == (status));                                                              \
        CHECK((want) == NULL || strstr(llmt_error_last(), (want)) != NULL);                   \
    } while (0)

/* What this process has sent, by hand, since the communicator was made. */
static int64_t expected_sent;

/* An all-reduce of b bytes counts them once, and alone a rank sends nothing. */
static int64_t reduced(int64_t b)
{
    return size > 1 ? b : 0;
}

/* Bytes rank `from` sends to rank `to` in the all-to-all: zero for some pairs. */
static size_t a2a_len(int from, int to)
{
    return (size_t)((from + 2 * to) % 3);
}

static unsigned char a2a_byte(int from, int to, size_t k)
{
    return (unsigned char)(from * 16 + to * 4 + (int)k);
}

/* Pieces laid out in reverse rank order, each followed by a guard byte, so
 * offsets are neither zero nor in rank order. */
static size_t layout(const size_t *len, size_t *off)
{
    size_t at = 0;
    for (int i = size - 1; i >= 0; i--) {
        off[i] = at;
        at += len[i] + 1;
    }
    return at;
}

static void test_alltoallv(llmt_comm_mpi *m)
{
    size_t sl[64] = {0}, so[64] = {0}, rl[64] = {0}, ro[64] = {0};
    for (int i = 0; i < size; i++) {
        sl[i] = a2a_len(rank, i);
        rl[i] = a2a_len(i, rank);
    }
    size_t sn = layout(sl, so), rn = layout(rl, ro);
    unsigned char *send = malloc(sn + 1), *recv = malloc(rn + 1);
    memset(recv, 0xEE, rn + 1);
    for (int i = 0; i < size; i++)
        for (size_t k = 0; k < sl[i]; k++)
            send[so[i] + k] = a2a_byte(rank, i, k);
    CHECK(llmt_comm_alltoallv(m->comm, "test alltoallv", send, sl, so, recv, rl, ro) == LLMT_OK);
    int wrong = 0;
    for (int i = 0; i < size; i++) {
        for (size_t k = 0; k < rl[i]; k++)
            wrong += recv[ro[i] + k] != a2a_byte(i, rank, k);
        wrong += recv[ro[i] + rl[i]] != 0xEE; /* the guard stays */
    }
    CHECK(wrong == 0);
    for (int i = 0; i < size; i++)
        expected_sent += i == rank ? 0 : (int64_t)sl[i];
    free(send);
    free(recv);
}

/* Rank i contributes (3 i + 2) mod 5 bytes (rank 1 none) of value 100 + i + k. */
static void test_allgatherv(llmt_comm_mpi *m, int in_place)
{
    size_t len[64], off[64];
    for (int i = 0; i < size; i++)
        len[i] = (size_t)((3 * i + 2) % 5);
    size_t n = layout(len, off);
    unsigned char mine[8], *recv = malloc(n);
    memset(recv, 0xEE, n);
    unsigned char *dst = in_place ? recv + off[rank] : mine;
    for (size_t k = 0; k < len[rank]; k++)
        dst[k] = (unsigned char)(100 + rank + (int)k);
    CHECK(llmt_comm_allgatherv(m->comm, "test allgatherv", dst, recv, len, off) == LLMT_OK);
    int wrong = 0;
    for (int i = 0; i < size; i++) {
        for (size_t k = 0; k < len[i]; k++)
            wrong += recv[off[i] + k] != (unsigned char)(100 + i + (int)k);
        wrong += recv[off[i] + len[i]] != 0xEE;
    }
    CHECK(wrong == 0);
    expected_sent += (int64_t)len[rank] * (size - 1);
    free(recv);
}

static void test_broadcast(llmt_comm_mpi *m)
{
    unsigned char buf[38];
    const int root = size - 1;
    for (int k = 0; k < 38; k++)
        buf[k] = rank == root ? (unsigned char)(7 * k + 1) : 0;
    CHECK(llmt_comm_broadcast(m->comm, "test broadcast", buf, 37, root) == LLMT_OK);
    int wrong = buf[37] != (rank == root ? (unsigned char)(7 * 37 + 1) : 0); /* untouched */
    for (int k = 0; k < 37; k++)
        wrong += buf[k] != (unsigned char)(7 * k + 1);
    CHECK(wrong == 0);
    expected_sent += rank == root ? 37 * (int64_t)(size - 1) : 0;
    CHECK(llmt_comm_broadcast(m->comm, "test broadcast", buf, 0, 0) == LLMT_OK);
}

static void test_allreduce(llmt_comm_mpi *m)
{
    const int64_t n = size, big = (int64_t)1 << 40;
    int64_t v[4] = {rank + 1, -rank, 1000 * rank, big + rank};
    CHECK(llmt_comm_allreduce_i64(m->comm, "test sum", v, 4, LLMT_COMM_SUM) == LLMT_OK);
    CHECK(v[0] == n * (n + 1) / 2 && v[1] == -n * (n - 1) / 2 && v[2] == 1000 * n * (n - 1) / 2 &&
          v[3] == n * big + n * (n - 1) / 2);
    int64_t w[4] = {rank + 1, -rank, 1000 * rank, big + rank};
    CHECK(llmt_comm_allreduce_i64(m->comm, "test max", w, 4, LLMT_COMM_MAX) == LLMT_OK);
    CHECK(w[0] == n && w[1] == 0 && w[2] == 1000 * (n - 1) && w[3] == big + n - 1);
    expected_sent += reduced(2 * 4 * 8);
}

/* Rank 0 creates a file 0.2 s late and then enters the barrier; the others
 * look for the file as soon as the barrier lets them out. */
static void test_barrier(llmt_comm_mpi *m)
{
    char path[64] = {0};
    if (rank == 0) {
        snprintf(path, sizeof path, "/tmp/llmt-test-comm-XXXXXX");
        int fd = mkstemp(path);
        CHECK(fd >= 0);
        close(fd);
        unlink(path);
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        nanosleep(&(struct timespec){0, 200000000}, NULL);
        int fd = open(path, O_CREAT | O_WRONLY, 0600);
        CHECK(fd >= 0);
        close(fd);
    }
    CHECK(m->ops.barrier(m->ops.user) == MPI_SUCCESS);
    CHECK(access(path, F_OK) == 0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        unlink(path);
}

/* MPI_ERRORS_RETURN on the adapter's communicator: a bad root is an error
 * status on every rank, not an abort, and MPI_COMM_WORLD keeps its handler. */
static void test_engine_error(llmt_comm_mpi *m)
{
    char buf[4] = {0};
    char want[64];
    snprintf(want, sizeof want, "rank %d: test bad root: the communication engine failed", rank);
    CHECK_FAIL(llmt_comm_broadcast(m->comm, "test bad root", buf, sizeof buf, size), LLMT_ECOMM,
               want);
    MPI_Errhandler h;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h);
    CHECK(h == MPI_ERRORS_ARE_FATAL);
    MPI_Errhandler_free(&h);
    int same = 0;
    MPI_Comm_compare(m->mpi, MPI_COMM_WORLD, &same);
    CHECK(same == MPI_CONGRUENT); /* a duplicate, not the world itself */
}

static void test_adapter_arguments(void)
{
    llmt_comm_mpi *m = (llmt_comm_mpi *)&m; /* not NULL: must be cleared */
    CHECK_FAIL(llmt_comm_mpi_create(NULL, MPI_COMM_WORLD), LLMT_EINVAL, "out is NULL");
    CHECK_FAIL(llmt_comm_mpi_create(&m, MPI_COMM_NULL), LLMT_EINVAL, "MPI_COMM_NULL");
    CHECK(m == NULL);
    llmt_comm_mpi_free(NULL);
    CHECK(llmt_comm_rank(NULL) == -1 && llmt_comm_size(NULL) == -1 &&
          llmt_comm_bytes_sent(NULL) == -1);
}

/* Tables llmt_comm_create refuses on its own, before any collective. */
static void test_create_refuses(const llmt_comm_mpi *m)
{
    llmt_comm *c = (llmt_comm *)&c;
    llmt_comm_ops o = m->ops;
    o.version = LLMT_COMM_OPS_VERSION + 1;
    CHECK_FAIL(llmt_comm_create(&c, &o), LLMT_EVERSION, "ops->version");
    CHECK(c == NULL);
    const char *names[] = {"ops->alltoallv", "ops->allgatherv", "ops->broadcast",
                           "ops->allreduce_i64", "ops->barrier"};
    for (int f = 0; f < 5; f++) {
        o = m->ops;
        if (f == 0) o.alltoallv = NULL;
        if (f == 1) o.allgatherv = NULL;
        if (f == 2) o.broadcast = NULL;
        if (f == 3) o.allreduce_i64 = NULL;
        if (f == 4) o.barrier = NULL;
        CHECK_FAIL(llmt_comm_create(&c, &o), LLMT_EINVAL, names[f]);
    }
    const int32_t bad[3][2] = {{-1, size}, {size, size}, {0, 0}}; /* rank, size */
    for (int b = 0; b < 3; b++) {
        o = m->ops;
        o.rank = bad[b][0];
        o.size = bad[b][1];
        CHECK_FAIL(llmt_comm_create(&c, &o), LLMT_EINVAL, "ops->rank");
    }
    CHECK_FAIL(llmt_comm_create(NULL, &m->ops), LLMT_EINVAL, "out");
    CHECK_FAIL(llmt_comm_create(&c, NULL), LLMT_EINVAL, "ops");
}

/* Tables that lie on one rank: every rank learns of it. */
static void test_create_disagrees(const llmt_comm_mpi *m)
{
    llmt_comm *c = NULL;
    llmt_comm_ops o = m->ops;
    if (rank == size - 1)
        o.size = size + 1; /* the last rank counts one rank too many */
    CHECK_FAIL(llmt_comm_create(&c, &o), LLMT_ECOMM,
               size > 1 ? "the ranks disagree on the size" : "rank 1 is held by 0 processes");
    CHECK(c == NULL);
    o = m->ops;
    if (size == 1) { /* alone, claiming to be rank 1 of 2 */
        o.size = 2;
        o.rank = 1;
    } else if (rank == 1) {
        o.rank = 0; /* two processes claim rank 0 */
    }
    CHECK_FAIL(llmt_comm_create(&c, &o), LLMT_ECOMM,
               size > 1 ? "rank 0 is held by 2 processes" : "rank 0 is held by 0 processes");
    CHECK(c == NULL);
}

static void test_check_same(llmt_comm_mpi *m)
{
    CHECK(llmt_comm_check_same(m->comm, "test hash", 42) == LLMT_OK);
    /* From rank 2 on (rank 1 on two ranks) the value differs: rank 0 and
     * the first differing rank are named. */
    int first = size >= 3 ? 2 : 1;
    char want[64];
    snprintf(want, sizeof want, "test hash differs between rank 0 and rank %d", first);
    int rc = llmt_comm_check_same(m->comm, "test hash", rank >= first ? 43 : 42);
    if (size == 1)
        CHECK(rc == LLMT_OK);
    else
        CHECK_FAIL(rc, LLMT_ECOMM, want);
    expected_sent += 2 * 8 * (int64_t)(size - 1);
    CHECK_FAIL(llmt_comm_check_same(m->comm, NULL, 1), LLMT_EINVAL, "what");
    CHECK_FAIL(llmt_comm_check_same(NULL, "x", 1), LLMT_EINVAL, "comm");
}

static void check_bytes_sent(const llmt_comm_mpi *m)
{
    CHECK(llmt_comm_bytes_sent(m->comm) == expected_sent);
    if (llmt_comm_bytes_sent(m->comm) != expected_sent)
        fprintf(stderr, "test_comm: rank %d: bytes_sent %lld, by hand %lld\n", rank,
                (long long)llmt_comm_bytes_sent(m->comm), (long long)expected_sent);
}

/* A genuine library failure, with its message, on this rank. */
static int fail_here(void)
{
    llmt_train_config cfg;
    llmt_train_config_init(&cfg);
    return llmt_train_config_set(&cfg, "no_such.key_from_test", "1");
}

static void test_agree(llmt_comm_mpi *m)
{
    CHECK(llmt_comm_agree(m->comm, LLMT_OK) == LLMT_OK);
    expected_sent += reduced(8);
    /* Rank 1 fails (rank 0 when alone); with four ranks rank 3 fails too,
     * and the lowest failed rank is the one named. */
    const int failed = size > 1 ? 1 : 0;
    int mine = rank == failed || (size == 4 && rank == 3) ? fail_here() : LLMT_OK;
    CHECK(mine == LLMT_OK || mine == LLMT_EINVAL);
    int rc = llmt_comm_agree(m->comm, mine);
    char want[80];
    if (mine) { /* keeps its own status and message, with its rank */
        snprintf(want, sizeof want, "rank %d", rank);
        CHECK_FAIL(rc, LLMT_EINVAL, want);
        CHECK(strstr(llmt_error_last(), "no_such.key_from_test") != NULL);
    } else {
        snprintf(want, sizeof want, "rank %d failed: no_such.key_from_test", failed);
        CHECK_FAIL(rc, LLMT_ECOMM, want);
    }
    /* The failed rank broadcasts its status and message, in a record whose
     * size is the library's business: at least the message, to each peer. */
    int64_t sent = llmt_comm_bytes_sent(m->comm) - expected_sent - reduced(8);
    expected_sent += reduced(8);
    if (rank == failed && size > 1) {
        CHECK(sent % (size - 1) == 0 && sent / (size - 1) > (int64_t)strlen(llmt_error_last()));
        expected_sent += sent;
    }
    CHECK_FAIL(llmt_comm_agree(NULL, LLMT_OK), LLMT_EINVAL, "comm");
}

/* Before MPI_Init and after MPI_Finalize the adapter refuses, saying why. */
static void test_adapter_outside_mpi(const char *why)
{
    llmt_comm_mpi *m = (llmt_comm_mpi *)&m;
    CHECK_FAIL(llmt_comm_mpi_create(&m, MPI_COMM_WORLD), LLMT_ESTATE, why);
    CHECK(m == NULL);
}

int main(int argc, char **argv)
{
    test_adapter_outside_mpi("not initialised");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 64) {
        fprintf(stderr, "test_comm: at most 64 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    test_adapter_arguments();
    llmt_comm_mpi *m = NULL;
    CHECK(llmt_comm_mpi_create(&m, MPI_COMM_WORLD) == LLMT_OK);
    if (m) {
        CHECK(llmt_comm_rank(m->comm) == rank && llmt_comm_size(m->comm) == size);
        /* llmt_comm_create's own checks: two all-reduces, 2 and size values. */
        expected_sent = reduced((2 + size) * 8);
        CHECK(llmt_comm_bytes_sent(m->comm) == expected_sent);
        test_alltoallv(m);
        test_allgatherv(m, 0);
        test_allgatherv(m, 1);
        test_broadcast(m);
        test_allreduce(m);
        test_barrier(m);
        test_engine_error(m);
        test_create_refuses(m);
        test_create_disagrees(m);
        test_check_same(m);
        check_bytes_sent(m);
        test_agree(m);
        check_bytes_sent(m);
    }
    llmt_comm_mpi_free(m);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_comm: %d ranks: %s (%d failed checks)\n", size, all ? "FAILED" : "passed", all);
    MPI_Finalize();
    int before = failures;
    test_adapter_outside_mpi("finalised");
    return all || failures > before ? 1 : 0;
}
