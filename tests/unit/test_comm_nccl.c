/* The NCCL communicator without a GPU: llmt_comm_nccl_unique_id and
 * llmt_comm_create_nccl check their arguments and refuse a CPU context
 * naming the backend; a CUDA context where no GPU exists fails with
 * LLMT_ECUDA and the reason (the rest then skips, or fails under
 * LLMT_REQUIRE_CUDA=1: cuda_required.h); the CUDA plugin's NCCL table
 * loads libnccl.so.2 and makes unique ids, which needs no GPU; a
 * communicator over a library-owned engine keeps the engine's own message
 * and releases the engine once, also when the membership check fails; and
 * the sharded optimizer refuses a device-memory communicator. The
 * collectives on a GPU: tests/gpu/test_nccl_world1.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/context_internal.h"
#include "core/error.h"
#include "cuda_required.h"
#include "dist/comm_internal.h"
#include "dist/comm_nccl_plugin.h"
#include "llmt/llmt.h"
#include "test_context.h"

static void test_cpu_context_refused(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 1);
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES] = {0};
    assert_int_equal(llmt_comm_nccl_unique_id(ctx, id), LLMT_EUNSUPPORTED);
    assert_contains(llmt_error_last(), "llmt_comm_nccl_unique_id: ctx is on the cpu backend");
    llmt_comm *c = (llmt_comm *)&id; /* anything but NULL */
    assert_int_equal(llmt_comm_create_nccl(&c, ctx, id, 0, 1), LLMT_EUNSUPPORTED);
    assert_contains(llmt_error_last(), "llmt_comm_create_nccl: ctx is on the cpu backend");
    assert_null(c);
    llmt_context_free(ctx);
}

static void expect(int rc, int code, const char *words)
{
    assert_int_equal(rc, code);
    assert_contains(llmt_error_last(), words);
}

static void test_arguments(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 1);
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES] = {0};
    llmt_comm *c = NULL;
    expect(llmt_comm_nccl_unique_id(NULL, id), LLMT_EINVAL,
           "llmt_comm_nccl_unique_id: ctx is NULL");
    expect(llmt_comm_nccl_unique_id(ctx, NULL), LLMT_EINVAL,
           "llmt_comm_nccl_unique_id: id is NULL");
    expect(llmt_comm_create_nccl(NULL, ctx, id, 0, 1), LLMT_EINVAL,
           "llmt_comm_create_nccl: out is NULL");
    expect(llmt_comm_create_nccl(&c, NULL, id, 0, 1), LLMT_EINVAL,
           "llmt_comm_create_nccl: ctx is NULL");
    expect(llmt_comm_create_nccl(&c, ctx, NULL, 0, 1), LLMT_EINVAL,
           "llmt_comm_create_nccl: id is NULL");
    expect(llmt_comm_create_nccl(&c, ctx, id, 0, 0), LLMT_EINVAL, "rank = 0, size = 0");
    expect(llmt_comm_create_nccl(&c, ctx, id, -1, 2), LLMT_EINVAL, "rank = -1, size = 2");
    expect(llmt_comm_create_nccl(&c, ctx, id, 2, 2), LLMT_EINVAL, "rank = 2, size = 2");
    assert_null(c);
    llmt_context_free(ctx);
}

/* A CUDA context: without a GPU its creation fails with LLMT_ECUDA naming
 * the reason (LLMT_EUNSUPPORTED in a build without the plugin), and the
 * test skips; with one, a unique id comes back. */
static void test_cuda_context(void **state)
{
    (void)state;
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    llmt_context *ctx = NULL;
    int rc = llmt_context_create(&ctx, &cfg);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", llmt_error_last());
#ifdef LLMT_TEST_HAVE_CUDA_PLUGIN
        assert_int_equal(rc, LLMT_ECUDA);
        assert_contains(why, "no usable device");
#else
        assert_int_equal(rc, LLMT_EUNSUPPORTED);
#endif
        cuda_unavailable(why);
        return;
    }
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES] = {0}, zero[LLMT_COMM_NCCL_ID_BYTES] = {0};
    rc = llmt_comm_nccl_unique_id(ctx, id);
    if (rc)
        fail_msg("llmt_comm_nccl_unique_id on CUDA: %s", llmt_error_last());
    assert_memory_not_equal(id, zero, sizeof id);
    llmt_context_free(ctx);
}

/* The plugin's NCCL table, reached as lib/dist/comm_nccl.c does but
 * without a context: libnccl.so.2 loads through the plugin's RUNPATH, and
 * two unique ids (NCCL's socket address and a random magic) differ. */
#ifdef LLMT_TEST_HAVE_CUDA_PLUGIN
static void test_plugin_unique_id(void **state)
{
    (void)state;
    const char *path = getenv("LLMT_CUDA_PLUGIN");
    assert_non_null(path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE); /* as libllmt opens it */
    if (!h)
        fail_msg("dlopen %s: %s", path, dlerror());
    llmt_plugin_nccl_fn entry = (llmt_plugin_nccl_fn)dlsym(h, LLMT_CUDA_PLUGIN_NCCL);
    assert_non_null(entry);
    const llmt_plugin_host host = {LLMT_BACKEND_ABI, llmt_fail};
    const llmt_nccl_api *api = NULL;
    assert_int_equal(entry(&host, LLMT_NCCL_API_VERSION + 1, &api), LLMT_EVERSION);
    int rc = entry(&host, LLMT_NCCL_API_VERSION, &api);
#ifdef LLMT_TEST_HAVE_NCCL
    if (rc)
        fail_msg("the plugin's NCCL table: %s", llmt_error_last());
    uint8_t a[LLMT_NCCL_ID_BYTES] = {0}, b[LLMT_NCCL_ID_BYTES] = {0};
    if (api->unique_id(&host, a) || api->unique_id(&host, b))
        fail_msg("unique id: %s", llmt_error_last());
    assert_memory_not_equal(a, b, sizeof a);
#else
    assert_int_equal(rc, LLMT_EUNSUPPORTED);
    assert_contains(llmt_error_last(), "built without NCCL");
#endif
    dlclose(h);
}
#endif

/* ---- a library-owned engine of one rank, with a failure on demand */

typedef struct fake_engine {
    int fail_reduce; /* allreduce fails with its own message */
    int freed;
} fake_engine;

static int fake_alltoallv(void *user, const void *send, const size_t *send_bytes,
                          const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                          const size_t *recv_offsets)
{
    (void)user;
    (void)send_bytes;
    memcpy((char *)recv + recv_offsets[0], (const char *)send + send_offsets[0], recv_bytes[0]);
    return 0;
}

static int fake_allgatherv(void *user, const void *send, void *recv, const size_t *bytes,
                           const size_t *offsets)
{
    (void)user;
    memmove((char *)recv + offsets[0], send, bytes[0]);
    return 0;
}

static int fake_broadcast(void *user, void *buf, size_t bytes, int32_t root)
{
    (void)user, (void)buf, (void)bytes, (void)root;
    return 0;
}

static int fake_allreduce(void *user, int64_t *values, size_t count, int32_t op)
{
    (void)values, (void)count, (void)op;
    fake_engine *e = user;
    return e->fail_reduce ? llmt_fail(LLMT_ECOMM, "NCCL allreduce_i64: fake failure") : 0;
}

static int fake_barrier(void *user)
{
    (void)user;
    return 0;
}

static void fake_free(void *user)
{
    ((fake_engine *)user)->freed++;
}

static llmt_comm_ops fake_ops(fake_engine *e)
{
    llmt_comm_ops ops = LLMT_COMM_OPS_INIT;
    ops.user = e;
    ops.alltoallv = fake_alltoallv;
    ops.allgatherv = fake_allgatherv;
    ops.broadcast = fake_broadcast;
    ops.allreduce_i64 = fake_allreduce;
    ops.barrier = fake_barrier;
    return ops;
}

static void test_owned_engine(void **state)
{
    (void)state;
    fake_engine e = {0, 0};
    llmt_comm_ops ops = fake_ops(&e);
    llmt_comm *c = NULL;
    llmt_context *ctx = test_context(1, 1);
    assert_int_equal(llmt_comm_adopt(&c, &ops, fake_free, ctx->backend), LLMT_OK);
    assert_int_equal(llmt_comm_size(c), 1);
    /* The engine's own message survives, with the rank and the operation. */
    e.fail_reduce = 1;
    expect(llmt_comm_agree(c, LLMT_OK), LLMT_ECOMM,
           "rank 0: llmt_comm_agree: NCCL allreduce_i64: fake failure");
    assert_int_equal(e.freed, 0);
    llmt_comm_free(c);
    assert_int_equal(e.freed, 1);
    /* A failed membership check releases the engine too. */
    c = (llmt_comm *)&e;
    expect(llmt_comm_adopt(&c, &ops, fake_free, ctx->backend), LLMT_ECOMM, "fake failure");
    assert_int_equal(e.freed, 2);
    /* A host's table gets the library's message, and stays the host's. */
    fake_engine host_engine = {1, 0};
    llmt_comm_ops host_ops = fake_ops(&host_engine);
    expect(llmt_comm_create(&c, &host_ops), LLMT_ECOMM, "the communication engine failed");
    assert_int_equal(host_engine.freed, 0);
    llmt_context_free(ctx);
}

/* On the CPU backend the sharded optimizer refuses a device-memory
 * communicator before anything is exchanged, saying what to use. */
static void test_sharded_refuses_device_memory(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 1);
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = 16;
    mc.hidden_size = 16;
    mc.num_layers = 1;
    mc.num_heads = 2;
    mc.num_kv_heads = 2;
    mc.ffn_size = 32;
    mc.max_seq_len = 8;
    llmt_model *m = NULL;
    if (llmt_model_create(&m, ctx, &mc))
        fail_msg("model: %s", llmt_error_last());
    fake_engine e = {0, 0};
    llmt_comm_ops ops = fake_ops(&e);
    llmt_comm *c = NULL;
    assert_int_equal(llmt_comm_adopt(&c, &ops, fake_free, ctx->backend), LLMT_OK);
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_optimizer *o = NULL;
    expect(llmt_optimizer_create_sharded(&o, m, &oc, c, LLMT_REDUCE_DETERMINISTIC),
           LLMT_EUNSUPPORTED, "llmt_optimizer_create_sharded: comm is an NCCL communicator, "
           "which moves CUDA device memory, but the model is on the cpu backend, whose buffers "
           "are host memory: use a host communicator (llmt_comm_mpi_create or llmt_comm_create)");
    assert_null(o);
    /* The same engine as a host-memory communicator is accepted. */
    llmt_comm_free(c);
    assert_int_equal(llmt_comm_adopt(&c, &ops, fake_free, NULL), LLMT_OK);
    if (llmt_optimizer_create_sharded(&o, m, &oc, c, LLMT_REDUCE_DETERMINISTIC))
        fail_msg("sharded over host memory: %s", llmt_error_last());
    llmt_optimizer_free(o);
    llmt_comm_free(c);
    assert_int_equal(e.freed, 2);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_context_refused),
        cmocka_unit_test(test_arguments),
#ifdef LLMT_TEST_HAVE_CUDA_PLUGIN
        cmocka_unit_test(test_plugin_unique_id),
#endif
        cmocka_unit_test(test_owned_engine),
        cmocka_unit_test(test_sharded_refuses_device_memory),
        cmocka_unit_test(test_cuda_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
