/* The CPU backend's kernels, one file per family, gathered into its op table
 * by cpu_backend.c. */
#ifndef LLMT_OPS_CPU_BACKEND_H
#define LLMT_OPS_CPU_BACKEND_H

#include "ops/ops.h"
#include "ops/cpu/cpu_kernels.h"

/* oneDNN state of a CPU device: engine, stream and its cached GEMM
 * primitives (cpu_gemm_onednn.c). */
typedef struct llmt_onednn llmt_onednn;

/* The CPU backend's device. */
typedef struct llmt_cpu_device {
    llmt_device base;
    llmt_onednn *onednn;
    /* One per OpenMP thread, for the single-threaded products attention
     * makes inside its parallel region (llmt_cpu_gemm_serial). */
    llmt_onednn **onednn_thread;
    /* Per storage dtype (indexed by LLMT_DTYPE_*), 1 where GEMMs run on the
     * CPU's own instructions for it, 0 where they widen to fp32; fixed at
     * creation (llmt_cpu_gemm_native). */
    int gemm_native[3];
} llmt_cpu_device;

int llmt_onednn_create(llmt_onednn **out);
void llmt_onednn_free(llmt_onednn *d);
/* 1 where oneDNN multiplies dtype dt with the CPU's own instructions (fp32:
 * always; BF16: AVX512_BF16 or AMX), within the ISA oneDNN may use
 * (ONEDNN_MAX_CPU_ISA, oneDNN's own setting, lowers it). */
int llmt_onednn_native(int dt);
/* C = alpha op(A) op(B) + beta C on `threads` threads, A and B in dtype dt,
 * C in dtype c_dt (dt, or F32 for 16-bit operands), accumulated in fp32;
 * row-major with leading dimensions lda, ldb, ldc. */
int llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                     int64_t ldb, float beta, void *c, int64_t ldc, int dt, int c_dt);

int llmt_cpu_mem_alloc(llmt_device *dev, size_t bytes, void **out);
void llmt_cpu_mem_free(llmt_device *dev, void *ptr);
int llmt_cpu_copy(llmt_device *dev, void *dst, const void *src, size_t bytes);
int llmt_cpu_mem_zero(llmt_device *dev, void *dst, size_t bytes);
int llmt_cpu_mem_info(llmt_device *dev, uint64_t *total, uint64_t *free_now);
int llmt_cpu_synchronize(llmt_device *dev);
void llmt_cpu_destroy(llmt_device *dev);

size_t llmt_cpu_gemm_scratch(const llmt_op_dims *dims);
/* 1 where dev's GEMMs in storage dtype dt run natively, 0 where they widen
 * to fp32 (docs/cpu.md). */
int llmt_cpu_gemm_native(const llmt_device *dev, int dt);
/* A product on the calling thread, from inside an OpenMP parallel region of
 * at most dev->num_threads threads (arguments as llmt_onednn_gemm): fp32, or
 * 16-bit operands where llmt_cpu_gemm_native(dev, dt) holds (else
 * LLMT_EUNSUPPORTED). */
int llmt_cpu_gemm_serial(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                         int64_t ldb, float beta, void *c, int64_t ldc, int dt, int c_dt);
/* llmt_cpu_gemm_serial in fp32. */
int llmt_cpu_sgemm_serial(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                          int64_t ldb, float beta, float *c, int64_t ldc);
int llmt_cpu_gemm(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                  void *c, int64_t ldc, int dt, void *scratch);
/* D = alpha op(A) op(B) + beta C (ops.h's gemm_cd): C's block copied into D,
 * then llmt_cpu_gemm on D, so the bits are those of that pair of calls. */
int llmt_cpu_gemm_cd(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                     float beta, const void *c, int64_t ldc, void *d, int64_t ldd, int dt,
                     void *scratch);
/* C = alpha op(A) op(B) + beta C with A and B in 16-bit dtype dt, C in fp32,
 * on the CPU's own instructions with fp32 accumulation (the LM head's
 * logits and head gradient). Only where llmt_cpu_gemm_native(dev, dt) holds;
 * elsewhere LLMT_EUNSUPPORTED (callers widen instead). */
int llmt_cpu_gemm_to_f32(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                         int64_t ldb, float beta, float *c, int64_t ldc, int dt);

int llmt_cpu_embedding_fwd(llmt_device *dev, void *out, const void *table, const int32_t *ids,
                           int64_t m, int64_t d, int dt);
int llmt_cpu_embedding_bwd(llmt_device *dev, void *dtable, const void *dout, const int32_t *ids,
                           int64_t m, int64_t d, int dt);

int llmt_cpu_rmsnorm_fwd(llmt_device *dev, void *out, float *rstd, const void *x, const void *w,
                         int64_t m, int64_t d, float eps, int dt);
int llmt_cpu_rmsnorm_bwd(llmt_device *dev, void *dx, void *dw, const void *dout, const void *x,
                         const void *w, const float *rstd, int64_t m, int64_t d, int accumulate,
                         int dt, void *scratch);

int llmt_cpu_rope(llmt_device *dev, void *x, const float *cos_sin, int64_t m, int64_t seq,
                  int64_t heads, int64_t head_dim, int64_t row_stride, int inverse, int dt);

int llmt_cpu_attention_fwd(llmt_device *dev, void *out, void *probs, const void *qkv,
                           const llmt_attn_dims *a, int dt, void *scratch);
int llmt_cpu_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                           const void *probs, const void *out, const llmt_attn_dims *a, int dt,
                           void *scratch);
size_t llmt_cpu_attention_scratch(const llmt_op_dims *dims);
size_t llmt_cpu_attention_saved_bytes(const llmt_attn_dims *a);
int llmt_cpu_attention_kv_fwd(llmt_device *dev, void *out, const void *q, const void *kv,
                              int64_t m, const llmt_attn_dims *a, int dt, void *scratch);
size_t llmt_cpu_attention_kv_scratch(const llmt_attn_dims *a, int num_threads);

int llmt_cpu_swiglu_fwd(llmt_device *dev, void *out, const void *gate_up, int64_t m, int64_t f,
                        int dt);
int llmt_cpu_swiglu_bwd(llmt_device *dev, void *dgate_up, const void *dout, const void *gate_up,
                        int64_t m, int64_t f, int dt);

int llmt_cpu_cast(llmt_device *dev, void *dst, int dst_dt, const void *src, int src_dt, int64_t n);
int llmt_cpu_add(llmt_device *dev, void *y, const void *x, int64_t n, int dt);
/* sum (fp32) += x (dtype dt) widened (cpu_accumulate.c). */
int llmt_cpu_accumulate(llmt_device *dev, float *sum, const void *x, int64_t n, int dt);

int llmt_cpu_lm_head_ce(llmt_device *dev, const llmt_ce_args *args);
size_t llmt_cpu_ce_scratch(const llmt_op_dims *dims);

int llmt_cpu_grad_stats(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                        double *sumsq, int64_t *nonfinite, void *scratch);
int llmt_cpu_grad_stats_blocks(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                               int64_t block, double *partials, int64_t *nonfinite,
                               void *scratch);
int llmt_cpu_adamw(llmt_device *dev, const llmt_adamw_args *args);

#endif
