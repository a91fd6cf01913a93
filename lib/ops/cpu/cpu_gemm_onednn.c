/* CPU GEMM through oneDNN's matmul primitive (Debian libdnnl), which picks
 * its kernel for the CPU it runs on: AVX-512 BF16 dot products or AMX tiles
 * for bf16 operands (fp32 accumulation), AVX-512 or AVX2 FMAs for fp32.
 *
 * A primitive is specialised to one shape, layout, alpha, beta and thread
 * count; making one costs tens of microseconds (kernel generation the first
 * time), so each device keeps the latest few in a small cache. oneDNN runs a
 * primitive on the calling thread's OpenMP team: the thread count is set
 * around creation and execution. The primitive's kernel blocking, hence the
 * order of every sum, is a function of the key alone, so the same product
 * with the same thread count gives the same bits run to run. Signals are
 * held while a primitive runs (run_held, cpu_signals.h). */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_signals.h"

/* Distinct products a training step makes: 3 per linear layer kind (4), the
 * LM head's 3 (and a shorter last chunk); attention's per-thread state sees
 * 5 per block of query rows (8 blocks at T = 512). A lookup compares keys in
 * turn, microseconds against products of tens of microseconds or more. */
#define GEMM_CACHE_SIZE 128

typedef struct gemm_key {
    int trans_a, trans_b, dt, c_dt, threads;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    uint64_t last_use; /* 0: empty */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch;
} gemm_entry;

struct llmt_onednn {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    void *scratch; /* the primitives' scratchpad, shared: ops run one at a time */
    size_t scratch_bytes;
    uint64_t clock;
    gemm_entry cache[GEMM_CACHE_SIZE];
};

static int dnnl_fail(dnnl_status_t st, const char *what)
{
    int code = st == dnnl_out_of_memory ? LLMT_ENOMEM : LLMT_EUNSUPPORTED;
    return llmt_fail(code, "cpu gemm: oneDNN %s failed (dnnl_status %d)", what, (int)st);
}

int llmt_onednn_create(llmt_onednn **out)
{
    llmt_onednn *d = calloc(1, sizeof *d);
    if (!d)
        return llmt_fail(LLMT_ENOMEM, "cpu backend: out of host memory");
    dnnl_status_t st = dnnl_engine_create(&d->engine, dnnl_cpu, 0);
    if (st == dnnl_success)
        st = dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        llmt_onednn_free(d);
        return dnnl_fail(st, "engine creation");
    }
    *out = d;
    return LLMT_OK;
}

static void entry_clear(gemm_entry *e)
{
    dnnl_memory_destroy(e->a);
    dnnl_memory_destroy(e->b);
    dnnl_memory_destroy(e->c);
    dnnl_memory_destroy(e->scratch);
    dnnl_primitive_destroy(e->prim);
    memset(e, 0, sizeof *e);
}

void llmt_onednn_free(llmt_onednn *d)
{
    if (!d)
        return;
    for (int i = 0; i < GEMM_CACHE_SIZE; i++)
        if (d->cache[i].last_use)
            entry_clear(&d->cache[i]);
    dnnl_stream_destroy(d->stream);
    dnnl_engine_destroy(d->engine);
    free(d->scratch);
    free(d);
}

int llmt_onednn_native(int dt)
{
    /* Bit sets: each ISA value contains the bits of those it extends. AMX
     * (Sapphire Rapids) includes AVX512_CORE_BF16. Debian's oneDNN 2.6 has no
     * native fp16 matmul, so F16 always widens. */
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    switch (dt) {
    case LLMT_DTYPE_F32:
        return 1;
    case LLMT_DTYPE_BF16:
        return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    default:
        return 0;
    }
}

static dnnl_data_type_t dnnl_dt(int dt)
{
    return dt == LLMT_DTYPE_BF16 ? dnnl_bf16 : dt == LLMT_DTYPE_F16 ? dnnl_f16 : dnnl_f32;
}

/* A 2-D descriptor of rows x cols, stored transposed (column-major) or not. */
static dnnl_status_t md_2d(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld,
                           int trans, int dt)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_dt(dt), strides);
}

/* The attributes: alpha as an output scale, beta as a sum post-op (the
 * accumulator is scaled, then beta * C added), the scratchpad ours. */
static dnnl_status_t make_attr(dnnl_primitive_attr_t *attr, const gemm_key *k)
{
    dnnl_status_t st = dnnl_primitive_attr_create(attr);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success && k->alpha != 1.0f)
        st = dnnl_primitive_attr_set_output_scales(*attr, 1, 0, &k->alpha);
    if (st == dnnl_success && k->beta != 0.0f) {
        dnnl_post_ops_t po;
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success) {
            st = dnnl_post_ops_append_sum(po, k->beta);
            if (st == dnnl_success)
                st = dnnl_primitive_attr_set_post_ops(*attr, po);
            dnnl_post_ops_destroy(po);
        }
    }
    return st;
}

/* Fills e (empty) with the primitive of key k; on failure e stays empty. */
static int entry_make(llmt_onednn *d, gemm_entry *e, const gemm_key *k)
{
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_status_t st = md_2d(&a_md, k->m, k->k, k->lda, k->trans_a, k->dt);
    if (st == dnnl_success)
        st = md_2d(&b_md, k->k, k->n, k->ldb, k->trans_b, k->dt);
    if (st == dnnl_success)
        st = md_2d(&c_md, k->m, k->n, k->ldc, 0, k->c_dt);
    dnnl_matmul_desc_t desc;
    if (st == dnnl_success)
        st = dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md);
    if (st != dnnl_success)
        return dnnl_fail(st, "matmul description");
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    st = make_attr(&attr, k);
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&pd, &desc, attr, d->engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_success)
        st = dnnl_primitive_create(&e->prim, pd);
    const dnnl_memory_desc_t *s_md = NULL;
    if (st == dnnl_success) {
        s_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        size_t need = s_md ? dnnl_memory_desc_get_size(s_md) : 0;
        if (need == 0)
            s_md = NULL;
        if (need > d->scratch_bytes) {
            void *grown = NULL;
            if (posix_memalign(&grown, 64, need) != 0) {
                dnnl_primitive_desc_destroy(pd);
                entry_clear(e);
                return llmt_fail(LLMT_ENOMEM, "cpu gemm: %zu bytes of oneDNN scratchpad", need);
            }
            free(d->scratch);
            d->scratch = grown;
            d->scratch_bytes = need;
        }
    }
    if (st == dnnl_success)
        st = dnnl_memory_create(&e->a, &a_md, d->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success)
        st = dnnl_memory_create(&e->b, &b_md, d->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success)
        st = dnnl_memory_create(&e->c, &c_md, d->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && s_md)
        st = dnnl_memory_create(&e->scratch, s_md, d->engine, DNNL_MEMORY_NONE);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) {
        entry_clear(e);
        return dnnl_fail(st, "matmul primitive creation");
    }
    e->key = *k;
    return LLMT_OK;
}

/* The cached primitive of key k, made (replacing the least recently used)
 * when absent. */
static int entry_for(llmt_onednn *d, const gemm_key *k, gemm_entry **out)
{
    gemm_entry *victim = &d->cache[0];
    for (int i = 0; i < GEMM_CACHE_SIZE; i++) {
        gemm_entry *e = &d->cache[i];
        if (e->last_use && memcmp(&e->key, k, sizeof *k) == 0) {
            e->last_use = ++d->clock;
            *out = e;
            return LLMT_OK;
        }
        if (e->last_use < victim->last_use)
            victim = e;
    }
    if (victim->last_use)
        entry_clear(victim);
    LLMT_TRY(entry_make(d, victim, k));
    victim->last_use = ++d->clock;
    *out = victim;
    return LLMT_OK;
}

/* Runs e's primitive (operands bound) on `threads` threads and waits for it,
 * with asynchronous signals held on every thread that runs it
 * (cpu_signals.h: oneDNN 2.6's kernels may run on a heap stack). */
static dnnl_status_t run_held(llmt_onednn *d, gemm_entry *e, int threads,
                              const dnnl_exec_arg_t *args)
{
    llmt_cpu_signals_hold_workers(threads);
    llmt_cpu_signals_hold();
    dnnl_status_t st = dnnl_primitive_execute(e->prim, d->stream, e->scratch ? 4 : 3, args);
    if (st == dnnl_success)
        st = dnnl_stream_wait(d->stream);
    llmt_cpu_signals_release();
    return st;
}

int llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                     int64_t ldb, float beta, void *c, int64_t ldc, int dt, int c_dt)
{
    gemm_key key;
    memset(&key, 0, sizeof key); /* the padding too: keys are compared with memcmp */
    key.trans_a = trans_a;
    key.trans_b = trans_b;
    key.dt = dt;
    key.c_dt = c_dt;
    key.threads = threads;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.alpha = alpha;
    key.beta = beta;
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads);
    gemm_entry *e = NULL;
    int rc = entry_for(d, &key, &e);
    dnnl_status_t st = dnnl_success;
    const char *what = "operand binding";
    if (rc == LLMT_OK) {
        st = dnnl_memory_set_data_handle(e->a, (void *)a);
        if (st == dnnl_success)
            st = dnnl_memory_set_data_handle(e->b, (void *)b);
        if (st == dnnl_success)
            st = dnnl_memory_set_data_handle(e->c, c);
        if (st == dnnl_success && e->scratch)
            st = dnnl_memory_set_data_handle(e->scratch, d->scratch);
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a},
                                   {DNNL_ARG_WEIGHTS, e->b},
                                   {DNNL_ARG_DST, e->c},
                                   {DNNL_ARG_SCRATCHPAD, e->scratch}};
        if (st == dnnl_success) {
            what = "matmul execution";
            st = run_held(d, e, threads, args);
        }
    }
    omp_set_num_threads(saved_threads);
    if (rc != LLMT_OK)
        return rc;
    return st == dnnl_success ? LLMT_OK : dnnl_fail(st, what);
}
