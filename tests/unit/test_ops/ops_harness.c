/* The op tests' harness: see ops_harness.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/context_internal.h"
#include "core/cuda_plugin_info.h"
#include "core/half.h"
#include "cuda_required.h"
#include "test_context.h"
#include "test_rand.h"

/* ---- backends */

backend g_cpu, g_cuda;
int g_have_cuda;
char g_cuda_why[512];

void open_backends(void)
{
    g_cpu.name = "cpu";
    g_cpu.ctx = test_context(2, 1);
    g_cpu.dev = g_cpu.ctx->backend;
    g_cpu.ops = llmt_ops(g_cpu.ctx);
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    cfg.seed = 1;
    if (llmt_context_create(&g_cuda.ctx, &cfg) == LLMT_OK) {
        g_cuda.name = "cuda";
        g_cuda.dev = g_cuda.ctx->backend;
        g_cuda.ops = llmt_ops(g_cuda.ctx);
        g_have_cuda = 1;
        char line[1024];
        llmt_cuda_plugin_describe(g_cuda.ctx->plugin_handle, line, sizeof line);
        printf("CUDA backend: %s\n", line);
    } else {
        snprintf(g_cuda_why, sizeof g_cuda_why, "%s", llmt_error_last());
    }
}

void close_backends(void)
{
    llmt_context_free(g_cuda.ctx);
    llmt_context_free(g_cpu.ctx);
}

/* ---- host values in a storage dtype */

const int dtypes[3] = {LLMT_DTYPE_F32, LLMT_DTYPE_BF16, LLMT_DTYPE_F16};

float round_dt(float x, int dt)
{
    if (dt == LLMT_DTYPE_BF16)
        return llmt_bf16_to_f32(llmt_f32_to_bf16(x));
    if (dt == LLMT_DTYPE_F16)
        return llmt_f16_to_f32(llmt_f32_to_f16(x));
    return x;
}

/* n values of dt from fp32 (malloc'd). */
void *pack(const float *x, int64_t n, int dt)
{
    size_t e = llmt_dtype_size(dt);
    void *p = malloc((size_t)n * e + 1);
    for (int64_t i = 0; i < n; i++) {
        if (dt == LLMT_DTYPE_BF16)
            ((uint16_t *)p)[i] = llmt_f32_to_bf16(x[i]);
        else if (dt == LLMT_DTYPE_F16)
            ((uint16_t *)p)[i] = llmt_f32_to_f16(x[i]);
        else
            ((float *)p)[i] = x[i];
    }
    return p;
}

void unpack(float *out, const void *p, int64_t n, int dt)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = dt == LLMT_DTYPE_BF16 ? llmt_bf16_to_f32(((const uint16_t *)p)[i])
                 : dt == LLMT_DTYPE_F16 ? llmt_f16_to_f32(((const uint16_t *)p)[i])
                                        : ((const float *)p)[i];
}

/* n normal values times scale, rounded to dt. */
float *randn(uint64_t *s, int64_t n, double scale, int dt)
{
    float *x = malloc((size_t)n * sizeof *x + 1);
    for (int64_t i = 0; i < n; i++)
        x[i] = round_dt((float)(scale * trand_normal(s)), dt);
    return x;
}

double *dzeros(int64_t n)
{
    return calloc((size_t)n + 1, sizeof(double));
}

/* ---- device buffers (asserting success) */

void *dalloc(backend *b, size_t bytes)
{
    void *p = NULL;
    OK(b->ops->mem_alloc(b->dev, bytes ? bytes : 1, &p));
    if (bytes) { /* poison: all bytes 0xFF is NaN in F32, BF16 and F16 */
        void *h = malloc(bytes);
        memset(h, 0xFF, bytes);
        OK(b->ops->copy_to_device(b->dev, p, h, bytes));
        free(h);
    }
    return p;
}

void *dput_raw(backend *b, const void *host, size_t bytes)
{
    void *p = dalloc(b, bytes);
    if (bytes)
        OK(b->ops->copy_to_device(b->dev, p, host, bytes));
    return p;
}

void *dput(backend *b, const float *x, int64_t n, int dt)
{
    void *h = pack(x, n, dt);
    void *p = dput_raw(b, h, (size_t)n * llmt_dtype_size(dt));
    free(h);
    return p;
}

void dget(backend *b, float *out, const void *p, int64_t n, int dt)
{
    size_t bytes = (size_t)n * llmt_dtype_size(dt);
    void *h = malloc(bytes + 1);
    OK(b->ops->copy_to_host(b->dev, h, p, bytes));
    unpack(out, h, n, dt);
    free(h);
}

void dfree(backend *b, void *p)
{
    b->ops->mem_free(b->dev, p);
}

/* Scratch for ops of these dimensions: exactly what the backend asks for
 * (the CPU's 16-bit GEMM sizes its scratch from the model's linear layers,
 * so a test GEMM passes its own need as cpu_floor). */
void *scratch_alloc(backend *b, llmt_op_dims d, size_t cpu_floor)
{
    d.num_threads = b->dev->num_threads;
    size_t bytes = b->ops->scratch_bytes(&d);
    if (b == &g_cpu && bytes < cpu_floor)
        bytes = cpu_floor;
    return dalloc(b, bytes);
}

/* ---- results: named outputs as doubles */

void add_d(result *r, const char *name, const double *x, int64_t n)
{
    assert_true(r->count < MAX_OUT);
    int k = r->count++;
    snprintf(r->name[k], sizeof r->name[k], "%s", name);
    r->v[k] = malloc((size_t)n * sizeof(double) + 1);
    memcpy(r->v[k], x, (size_t)n * sizeof(double));
    r->n[k] = n;
}

void add_f(result *r, const char *name, const float *x, int64_t n)
{
    double *d = malloc((size_t)n * sizeof *d + 1);
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
    add_d(r, name, d, n);
    free(d);
}

/* Downloads n elements of dtype dt as an output. */
void add_dev(result *r, backend *b, const char *name, const void *p, int64_t n, int dt)
{
    float *h = malloc((size_t)n * sizeof *h + 1);
    dget(b, h, p, n, dt);
    add_f(r, name, h, n);
    free(h);
}

void add_scalar(result *r, const char *name, double v)
{
    add_d(r, name, &v, 1);
}

void result_free(result *r)
{
    for (int k = 0; k < r->count; k++)
        free(r->v[k]);
    memset(r, 0, sizeof *r);
}

/* Whether x and y are the same non-finite value class. */
static int same_special(double x, double y)
{
    if (isnan(x) || isnan(y))
        return isnan(x) && isnan(y);
    return x == y; /* infinities */
}

/* Fails unless every output of got is within tol (relative to the output's
 * largest finite |want|) of want; returns the largest relative error. */
double compare(const char *what, const result *got, const result *want, double tol)
{
    assert_int_equal(got->count, want->count);
    double worst = 0.0;
    for (int k = 0; k < want->count; k++) {
        assert_string_equal(got->name[k], want->name[k]);
        assert_int_equal(got->n[k], want->n[k]);
        double max_ref = 0.0, max_err = 0.0;
        int64_t at = -1;
        for (int64_t i = 0; i < want->n[k]; i++) {
            double w = want->v[k][i], g = got->v[k][i];
            if (!isfinite(w) || !isfinite(g)) {
                if (!same_special(w, g))
                    fail_msg("%s: output %s[%lld] = %g, want %g", what, want->name[k],
                             (long long)i, g, w);
                continue;
            }
            max_ref = fmax(max_ref, fabs(w));
            if (fabs(g - w) > max_err) {
                max_err = fabs(g - w);
                at = i;
            }
        }
        double rel = max_ref > 0 ? max_err / max_ref : max_err;
        if (rel > tol)
            fail_msg("%s: output %s: max |error| %.3g at [%lld] (got %.9g, want %.9g), max |want| "
                     "%.3g: relative %.3g > tolerance %.1g",
                     what, want->name[k], max_err, (long long)at, got->v[k][at], want->v[k][at],
                     max_ref, rel, tol);
        worst = fmax(worst, rel);
    }
    return worst;
}

/* ---- running an op test */

double tolerance(int dt)
{
    return dt == LLMT_DTYPE_BF16 ? 2e-2 : dt == LLMT_DTYPE_F16 ? 2e-3 : 1e-5;
}

const char *dt_name(int v)
{
    return llmt_dtype_name(dtypes[v]);
}

int dt_of(int v)
{
    return dtypes[v];
}

void check_cpu(const op_test *t)
{
    for (int v = 0; v < t->variants; v++) {
        void *in = t->make(v, 1000 + (uint64_t)v);
        result got = {0}, want = {0};
        t->run(&g_cpu, v, in, &got);
        t->ref(v, in, &want);
        char what[128];
        snprintf(what, sizeof what, "%s %s (cpu vs double reference)", t->name, t->variant_name(v));
        double tol = tolerance(t->variant_dt(v)) * t->tol_scale;
        double err = compare(what, &got, &want, tol);
        print_message("%-44s max relative error %.2e (tolerance %.0e)\n", what, err, tol);
        result_free(&got);
        result_free(&want);
        t->free_in(in);
    }
}

void check_cuda(const op_test *t)
{
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    for (int v = 0; v < t->variants; v++) {
        void *in = t->make(v, 2000 + (uint64_t)v);
        result cpu = {0}, gpu = {0}, again = {0};
        t->run(&g_cpu, v, in, &cpu);
        t->run(&g_cuda, v, in, &gpu);
        t->run(&g_cuda, v, in, &again);
        char what[128];
        snprintf(what, sizeof what, "%s %s (cuda vs cpu)", t->name, t->variant_name(v));
        double tol = tolerance(t->variant_dt(v)) * t->tol_scale;
        double err = compare(what, &gpu, &cpu, tol);
        print_message("%-44s max relative error %.2e (tolerance %.0e)\n", what, err, tol);
        /* Deterministic: a second run gives the same bits. */
        for (int k = 0; k < gpu.count; k++)
            if (memcmp(gpu.v[k], again.v[k], (size_t)gpu.n[k] * sizeof(double)) != 0)
                fail_msg("%s: output %s differs between two CUDA runs", what, gpu.name[k]);
        result_free(&cpu);
        result_free(&gpu);
        result_free(&again);
        t->free_in(in);
    }
}

