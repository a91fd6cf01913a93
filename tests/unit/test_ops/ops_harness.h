/* The harness of the op tests (tests/unit/test_ops.c): backends, dtype
 * conversions, device buffers, results and their comparison, and the op
 * test descriptor each tests/unit/test_ops/ops_*.c file defines. */
#ifndef LLMT_TEST_OPS_HARNESS_H
#define LLMT_TEST_OPS_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "ops/ops.h"

/* A backend under test: its context, device and op table. */
typedef struct backend {
    const char *name;
    llmt_context *ctx;
    llmt_device *dev;
    const llmt_backend_ops *ops;
} backend;

/* Fails the test unless call returns LLMT_OK. */
#define OK(call)                                                                           \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ != LLMT_OK)                                                                \
            fail_msg("%s failed (%d): %s", #call, rc_, llmt_error_last());                 \
    } while (0)

#define MAX_OUT 16

/* Named outputs of an op run, as doubles. */
typedef struct result {
    int count;
    char name[MAX_OUT][40];
    double *v[MAX_OUT];
    int64_t n[MAX_OUT];
} result;

/* An op under test: inputs made from a seed, run on a backend, and a
 * double-precision reference. Most ops have one variant per dtype. */
typedef struct op_test {
    const char *name;
    int variants;
    const char *(*variant_name)(int v);
    int (*variant_dt)(int v); /* dtype whose tolerance applies */
    void *(*make)(int v, uint64_t seed);
    void (*run)(backend *b, int v, const void *in, result *out);
    void (*ref)(int v, const void *in, result *out);
    void (*free_in)(void *in);
    double tol_scale; /* multiplies the dtype tolerances */
} op_test;

extern backend g_cpu, g_cuda;
extern int g_have_cuda;
/* Why the CUDA backend did not open (its error message), when it did not. */
extern char g_cuda_why[512];
/* F32, BF16, F16: the dtype of variant v of most op tests is dtypes[v]. */
extern const int dtypes[3];

/* ---- backends: the CPU always, CUDA where a device opens (g_have_cuda) */
void open_backends(void);
void close_backends(void);

/* ---- host values in a storage dtype */
float round_dt(float x, int dt);
void *pack(const float *x, int64_t n, int dt);
void unpack(float *out, const void *p, int64_t n, int dt);
float *randn(uint64_t *s, int64_t n, double scale, int dt);
double *dzeros(int64_t n);

/* ---- device buffers (asserting success) */
void *dalloc(backend *b, size_t bytes);
void *dput_raw(backend *b, const void *host, size_t bytes);
void *dput(backend *b, const float *x, int64_t n, int dt);
void dget(backend *b, float *out, const void *p, int64_t n, int dt);
void dfree(backend *b, void *p);
void *scratch_alloc(backend *b, llmt_op_dims d, size_t cpu_floor);

/* ---- results: named outputs as doubles, and their comparison */
void add_d(result *r, const char *name, const double *x, int64_t n);
void add_f(result *r, const char *name, const float *x, int64_t n);
void add_dev(result *r, backend *b, const char *name, const void *p, int64_t n, int dt);
void add_scalar(result *r, const char *name, double v);
void result_free(result *r);
double compare(const char *what, const result *got, const result *want, double tol);

/* ---- running an op test: the CPU against the double reference, CUDA against the CPU */
double tolerance(int dt);
const char *dt_name(int v);
int dt_of(int v);
void check_cpu(const op_test *t);
void check_cuda(const op_test *t);

/* ---- the op tests (tests/unit/test_ops/ops_*.c) */
extern const op_test gemm_test, gemm_model_test, embed_test, rms_test, rope_test, attn_test, swiglu_test, add_test,
    ce_test, gs_test, adamw_test;
/* The CPU's AdamW equals, bit for bit, the formula of lib/ops/ops.h computed
 * one element at a time in fp32 (what the CUDA kernel and an offloaded
 * update must reproduce), for every variant, odd lengths and inf/NaN. */
void check_adamw_cpu_bits(void);
/* gemm_cd (tests/unit/test_ops/ops_gemm_residual.c): on the CPU the bits of
 * copying C into D and a gemm on D, in every dtype; _refusals: D == C with
 * another leading dimension, D overlapping C and a NULL C read by beta are
 * refused with a message, D adjacent to C and beta 0 without C accepted. */
extern const op_test gemm_cd_test;
void check_gemm_cd_cpu_bits(void);
void check_gemm_cd_refusals(backend *b);
/* lm_head_ce over 600 rows in one chunk: the count and the loss sum against
 * a double reference (tests/unit/test_ops/ops_cross_entropy.c). */
void check_ce_many_rows(backend *b);
/* BF16_PURE's stochastically rounded weights: CUDA equals the CPU bit for bit. */
void check_stochastic_bits(void);
/* grad_stats_blocks on b: each block's partial within tol (relative) of the
 * double reference, the non-finite count exactly, and a buffer's partials
 * equal bit for bit to those of two calls over its halves
 * (tests/unit/test_ops/ops_grad_blocks.c); _args: refused arguments. */
void check_grad_stats_blocks(backend *b, double tol);
void check_grad_stats_blocks_args(backend *b);
/* CPU ops whose oneDNN product fails return its status and message
 * (tests/unit/test_ops/ops_gemm_fault.c). */
void check_ce_gemm_failure(void);
void check_attention_gemm_failure(void);
/* The bf16 LM head's and attention's products are native bf16 ones exactly
 * when native (tests/unit/test_ops/ops_gemm_fault.c). */
void check_ce_native_products(int native);
void check_attention_native_products(int native);
/* Signals handled while the CPU's products run stay on the handling
 * thread's stack, and the products stay right
 * (tests/unit/test_ops/ops_gemm_signal.c). */
void check_gemm_signals(void);

#endif
