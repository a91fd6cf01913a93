/* NCCL on one GPU, world size 1 (CTest's gpu_nccl_world1, run by
 * tests/gpu/run.sh's nccl-world1 stage): a unique id, a communicator of one
 * rank on the CUDA context's device, and every collective on device
 * buffers against what the host computes for one rank (each piece lands at
 * its offset, the rest of the buffer untouched; a reduction over one rank
 * is the rank's values), then host buffers through the engine's staging
 * (llmt_comm_check_same, llmt_comm_agree), and last an engine error
 * passed on with its message, which aborts the communicator (the sharded
 * optimizer over it: test_nccl_sharded.c). tests/gpu/emulate.sh runs it on
 * the emulated plugin.
 * Without a CUDA device it exits 77 (skipped), or fails under
 * LLMT_REQUIRE_CUDA=1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/context_internal.h"
#include "core/cuda_plugin_info.h"
#include "cuda_required.h"
#include "dist/comm_internal.h"
#include "llmt/llmt.h"

static llmt_context *g_ctx;
static llmt_comm *g_comm;
static char g_why[512];

enum { BUF = 1 << 20 };

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (llmt_ops(g_ctx)->mem_alloc(g_ctx->backend, bytes, &p))
        fail_msg("device allocation of %zu bytes: %s", bytes, llmt_error_last());
    return p;
}

static void to_dev(void *dst, const void *src, size_t bytes)
{
    if (llmt_ops(g_ctx)->copy_to_device(g_ctx->backend, dst, src, bytes))
        fail_msg("copy to device: %s", llmt_error_last());
}

static void to_host(void *dst, const void *src, size_t bytes)
{
    if (llmt_ops(g_ctx)->copy_to_host(g_ctx->backend, dst, src, bytes))
        fail_msg("copy to host: %s", llmt_error_last());
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131u + seed * 17u + (i >> 8));
}

static void check_ok(int rc, const char *what)
{
    if (rc)
        fail_msg("%s: %s", what, llmt_error_last());
}

static void need_comm(void)
{
    if (!g_comm)
        cuda_unavailable(g_why);
}

static void test_alltoallv(void **state)
{
    (void)state;
    need_comm();
    uint8_t *send = malloc(BUF), *recv = malloc(BUF), *want = malloc(BUF);
    fill(send, BUF, 1);
    fill(recv, BUF, 2);
    const size_t sb = 300001, so = 77, ro = 4099;
    memcpy(want, recv, BUF);
    memcpy(want + ro, send + so, sb);
    void *ds = dev_alloc(BUF), *dr = dev_alloc(BUF);
    to_dev(ds, send, BUF);
    to_dev(dr, recv, BUF);
    check_ok(llmt_comm_alltoallv(g_comm, "alltoallv", ds, &sb, &so, dr, &sb, &ro), "alltoallv");
    to_host(recv, dr, BUF);
    assert_memory_equal(recv, want, BUF);
    llmt_ops(g_ctx)->mem_free(g_ctx->backend, ds);
    llmt_ops(g_ctx)->mem_free(g_ctx->backend, dr);
    free(send), free(recv), free(want);
}

/* From a separate send buffer, then in place (send == recv + offset). */
static void test_allgatherv(void **state)
{
    (void)state;
    need_comm();
    uint8_t *send = malloc(BUF), *recv = malloc(BUF), *want = malloc(BUF);
    fill(send, BUF, 3);
    fill(recv, BUF, 4);
    const size_t bytes = 123457, off = 999;
    memcpy(want, recv, BUF);
    memcpy(want + off, send, bytes);
    void *ds = dev_alloc(BUF), *dr = dev_alloc(BUF);
    to_dev(ds, send, BUF);
    to_dev(dr, recv, BUF);
    check_ok(llmt_comm_allgatherv(g_comm, "allgatherv", ds, dr, &bytes, &off), "allgatherv");
    to_host(recv, dr, BUF);
    assert_memory_equal(recv, want, BUF);
    check_ok(llmt_comm_allgatherv(g_comm, "allgatherv in place", (char *)dr + off, dr, &bytes,
                                  &off), "allgatherv in place");
    to_host(recv, dr, BUF);
    assert_memory_equal(recv, want, BUF);
    llmt_ops(g_ctx)->mem_free(g_ctx->backend, ds);
    llmt_ops(g_ctx)->mem_free(g_ctx->backend, dr);
    free(send), free(recv), free(want);
}

static void test_broadcast(void **state)
{
    (void)state;
    need_comm();
    uint8_t *buf = malloc(BUF), *got = malloc(BUF);
    fill(buf, BUF, 5);
    void *d = dev_alloc(BUF);
    to_dev(d, buf, BUF);
    check_ok(llmt_comm_broadcast(g_comm, "broadcast", (char *)d + 5, BUF - 5, 0), "broadcast");
    to_host(got, d, BUF);
    assert_memory_equal(got, buf, BUF);
    llmt_ops(g_ctx)->mem_free(g_ctx->backend, d);
    free(buf), free(got);
}

static void test_allreduce_and_barrier(void **state)
{
    (void)state;
    need_comm();
    enum { N = 1001 };
    int64_t v[N], got[N];
    for (int i = 0; i < N; i++)
        v[i] = (i % 2 ? -1 : 1) * ((int64_t)i << 33) + i;
    void *d = dev_alloc(sizeof v);
    for (int op = LLMT_COMM_SUM; op <= LLMT_COMM_MAX; op++) {
        to_dev(d, v, sizeof v);
        check_ok(llmt_comm_allreduce_i64(g_comm, "allreduce", d, N, op), "allreduce_i64");
        to_host(got, d, sizeof got);
        assert_memory_equal(got, v, sizeof v); /* over one rank, sum and max are the values */
    }
    check_ok(g_comm->ops.barrier(g_comm->ops.user), "barrier");
    llmt_ops(g_ctx)->mem_free(g_ctx->backend, d);
}

/* Host buffers go through the engine's staging. */
static void test_host_buffers(void **state)
{
    (void)state;
    need_comm();
    check_ok(llmt_comm_check_same(g_comm, "a value", 0x1234567890abcdefull), "check_same");
    check_ok(llmt_comm_agree(g_comm, LLMT_OK), "agree");
    int64_t v[3] = {5, -7, 1LL << 40};
    check_ok(llmt_comm_allreduce_i64(g_comm, "host allreduce", v, 3, LLMT_COMM_MAX), "host");
    assert_true(v[0] == 5 && v[1] == -7 && v[2] == 1LL << 40);
    assert_int_equal(llmt_comm_bytes_sent(g_comm) >= 0, 1);
}

/* An engine error reaches the caller with the engine's words, and aborts
 * the communicator (this rank's calls would no longer match the others'):
 * the next collective fails naming the earlier failure. Last: the
 * communicator is of no use after it. */
static void test_engine_error_aborts(void **state)
{
    (void)state;
    need_comm();
    int64_t v[2] = {1, 2};
    assert_int_equal(llmt_comm_allreduce_i64(g_comm, "bad op", v, 2, 7), LLMT_ECOMM);
    assert_contains(llmt_error_last(), "rank 0: bad op: NCCL allreduce_i64: op = 7");
    assert_int_equal(llmt_comm_allreduce_i64(g_comm, "after", v, 2, LLMT_COMM_SUM), LLMT_ECOMM);
    assert_contains(llmt_error_last(), "rank 0: after: NCCL allreduce_i64: the communicator was "
                                       "aborted by an earlier failure");
}

int main(void)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES];
    if (llmt_context_create(&g_ctx, &cfg)) {
        snprintf(g_why, sizeof g_why, "%s", llmt_error_last());
    } else if (llmt_comm_nccl_unique_id(g_ctx, id) ||
               llmt_comm_create_nccl(&g_comm, g_ctx, id, 0, 1)) {
        /* A CUDA device without a usable NCCL is a failure, not a skip. */
        fprintf(stderr, "NCCL on CUDA: %s\n", llmt_error_last());
        llmt_context_free(g_ctx);
        return 1;
    } else {
        char line[512];
        llmt_cuda_plugin_describe(g_ctx->plugin_handle, line, sizeof line);
        printf("CUDA backend: %s\n", line);
        printf("NCCL communicator: rank %d of %d\n", llmt_comm_rank(g_comm),
               llmt_comm_size(g_comm));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alltoallv),
        cmocka_unit_test(test_allgatherv),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_allreduce_and_barrier),
        cmocka_unit_test(test_host_buffers),
        cmocka_unit_test(test_engine_error_aborts),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int have = g_comm != NULL;
    llmt_comm_free(g_comm);
    llmt_context_free(g_ctx);
    return failed ? failed : have ? 0 : 77;
}
