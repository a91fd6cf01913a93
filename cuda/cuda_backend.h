/* State of the CUDA backend instance and what its files share: error
 * macros, the scratch layout helpers and the op functions gathered into the
 * op table by cuda_backend.cu. */
#ifndef LLMT_CUDA_BACKEND_H
#define LLMT_CUDA_BACKEND_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "llmt/common.h"
#include "ops/ops.h"

/* Kernels are launched through this macro rather than with <<<>>> directly,
 * so the same sources also build for the CPU emulator of tests/gpu/emu
 * (which defines LLMT_CUDA_EMULATE and its own launcher):
 *   LLMT_LAUNCH(grid, block, stream, kernel<T>)(args...); */
#ifndef LLMT_CUDA_EMULATE
#define LLMT_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#endif
/* Called with the copy stream once it is made: nothing on a GPU; the
 * emulator then runs that stream's copies as late as CUDA may (cuda_emu.h). */
#ifndef LLMT_CUDA_EMULATE
#define LLMT_CUDA_EMU_COPY_STREAM(stream) ((void)(stream))
#endif

/* cuBLASLt workspace: what NVIDIA recommends for Hopper. It is carved from
 * the ops' scratch (so it is accounted), which scratch_bytes includes. */
#define LLMT_CUDA_GEMM_WORKSPACE ((size_t)32 << 20)
/* Every region carved from scratch starts on this boundary. */
#define LLMT_CUDA_ALIGN ((size_t)256)
/* Remembered cuBLASLt algorithm choices (one per GEMM shape). */
#define LLMT_CUDA_GEMM_CACHE 64

/* What an algorithm choice depends on, compared with memcmp (zeroed first;
 * `zero` keeps the struct free of padding). D (the output) has its own
 * leading dimension and alignment, equal to C's when the product is in place. */
typedef struct llmt_cuda_gemm_key {
    int64_t m, n, k, lda, ldb, ldc, ldd;
    int32_t trans_a, trans_b, ab_dt, c_dt;
    uint32_t align_a, align_b, align_c, align_d, pad, zero;
} llmt_cuda_gemm_key;

typedef struct llmt_cuda_gemm_entry {
    llmt_cuda_gemm_key key;
    cublasLtMatmulAlgo_t algo;
} llmt_cuda_gemm_entry;

typedef struct llmt_cuda_backend {
    llmt_device base; /* first: the library sees an llmt_device */
    const llmt_plugin_host *host;
    int device;
    cudaStream_t stream;
    /* The copy stream of copy_to_host_async and copy_to_device_async
     * (cuda_memory.cu): `queued` is recorded on `stream` before each such
     * copy and waited for on copy_stream; fence[f] is recorded on
     * copy_stream after the copy. */
    cudaStream_t copy_stream;
    cudaEvent_t queued, fence[LLMT_COPY_FENCES];
    cublasLtHandle_t lt;
    /* Algorithm cache of the GEMMs, filled round-robin. */
    llmt_cuda_gemm_entry gemm_cache[LLMT_CUDA_GEMM_CACHE];
    int gemm_cached, gemm_next;
    /* Attention: LLMT_CUDA_ATTN_* (cuda_attention_cudnn.h), read when the
     * backend opens, and cuDNN's handle and graphs (NULL until first used). */
    int attn_mode;
    void *cudnn_attn;
} llmt_cuda_backend;

static inline llmt_cuda_backend *llmt_cuda(llmt_device *dev)
{
    return (llmt_cuda_backend *)dev;
}

/* Turns a CUDA error into LLMT_ECUDA with the CUDA text and the failing op. */
#define LLMT_CUDA_CHECK(dev, call, op)                                                      \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess)                                                           \
            return llmt_cuda(dev)->host->fail(LLMT_ECUDA, "CUDA %s: %s (%s)", op,         \
                                              cudaGetErrorString(err_),                    \
                                              cudaGetErrorName(err_));                     \
    } while (0)

/* The same for cuBLASLt's status codes. */
#define LLMT_CUBLAS_CHECK(dev, call, op)                                                    \
    do {                                                                                   \
        cublasStatus_t st_ = (call);                                                       \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                  \
            return llmt_cuda(dev)->host->fail(LLMT_ECUDA, "CUDA %s: cuBLASLt: %s (%s)", op, \
                                              cublasLtGetStatusString(st_),                \
                                              cublasLtGetStatusName(st_));                 \
    } while (0)

/* After a kernel launch: a bad configuration is reported here, faults in
 * the kernel at the next synchronising call. */
#define LLMT_CUDA_LAUNCHED(dev, op) LLMT_CUDA_CHECK(dev, cudaGetLastError(), op)

/* Bytes of an element and name of a dtype. The plugin cannot call libllmt
 * (it is loaded with RTLD_LOCAL into programs that may link libllmt
 * statically), so it has its own. */
static inline size_t llmt_cuda_dt_size(int dt)
{
    return dt == LLMT_DTYPE_F32 ? 4 : (dt == LLMT_DTYPE_BF16 || dt == LLMT_DTYPE_F16) ? 2 : 0;
}

static inline const char *llmt_cuda_dt_name(int dt)
{
    return dt == LLMT_DTYPE_F32 ? "F32" : dt == LLMT_DTYPE_BF16 ? "BF16"
                                        : dt == LLMT_DTYPE_F16 ? "F16" : "?";
}

/* Whether dt is a storage dtype of activations and weights. */
static inline int llmt_cuda_float_dt(int dt)
{
    return dt == LLMT_DTYPE_F32 || dt == LLMT_DTYPE_BF16 || dt == LLMT_DTYPE_F16;
}

/* Refuses a dtype the op does not handle. */
#define LLMT_CUDA_CHECK_DT(dev, dt, op)                                                     \
    do {                                                                                   \
        if (!llmt_cuda_float_dt(dt))                                                       \
            return llmt_cuda(dev)->host->fail(LLMT_EUNSUPPORTED, "CUDA %s: dtype %d is "   \
                                              "not F32, BF16 or F16", op, (int)(dt));     \
    } while (0)

static inline size_t llmt_cuda_round_up(size_t bytes)
{
    return (bytes + LLMT_CUDA_ALIGN - 1) / LLMT_CUDA_ALIGN * LLMT_CUDA_ALIGN;
}

/* The first LLMT_CUDA_ALIGN boundary at or after p (scratch regions are
 * sized with LLMT_CUDA_ALIGN bytes of slack for it). */
static inline char *llmt_cuda_align_ptr(void *p)
{
    uintptr_t u = (uintptr_t)p;
    return (char *)((u + LLMT_CUDA_ALIGN - 1) / LLMT_CUDA_ALIGN * LLMT_CUDA_ALIGN);
}

/* Grid size of a grid-stride loop over n items with `threads` per block. */
static inline unsigned llmt_cuda_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    const int64_t cap = (int64_t)1 << 16;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* ---- memory (cuda_memory.cu) */
int llmt_cuda_mem_alloc(llmt_device *dev, size_t bytes, void **out);
void llmt_cuda_mem_free(llmt_device *dev, void *ptr);
int llmt_cuda_host_alloc(llmt_device *dev, size_t bytes, void **out);
void llmt_cuda_host_free(llmt_device *dev, void *ptr);
int llmt_cuda_copy_to_device(llmt_device *dev, void *dst, const void *src, size_t bytes);
int llmt_cuda_copy_to_host(llmt_device *dev, void *dst, const void *src, size_t bytes);
int llmt_cuda_copy_on_device(llmt_device *dev, void *dst, const void *src, size_t bytes);
int llmt_cuda_mem_zero(llmt_device *dev, void *dst, size_t bytes);
int llmt_cuda_mem_info(llmt_device *dev, uint64_t *total, uint64_t *free_now);
int llmt_cuda_synchronize(llmt_device *dev);
int llmt_cuda_copy_to_host_async(llmt_device *dev, void *dst, const void *src, size_t bytes,
                                 int fence);
int llmt_cuda_wait_fence(llmt_device *dev, int fence);
int llmt_cuda_copy_to_device_async(llmt_device *dev, void *dst, const void *src, size_t bytes,
                                   int fence);
int llmt_cuda_fence_sync(llmt_device *dev, int fence);

/* ---- GEMM (cuBLASLt in cuda_gemm.cu; the entry points over it in cuda_gemm_ops.cu) */
/* C[m,n] = alpha op(A) op(B) + beta C, row-major, A and B of dtype ab_dt and
 * C of c_dt, fp32 accumulation; scratch (may be NULL) holds the workspace of
 * LLMT_CUDA_GEMM_WORKSPACE bytes from llmt_cuda_align_ptr(scratch). */
int llmt_cuda_matmul(llmt_device *dev, const char *op, int trans_a, int trans_b, int64_t m,
                     int64_t n, int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                     int64_t ldb, int ab_dt, float beta, void *c, int64_t ldc, int c_dt,
                     void *scratch);
/* The same with a separate output: D[m,n] (dtype c_dt, leading dimension
 * ldd) = alpha op(A) op(B) + beta C, C read only (ops.h's gemm_cd); d == c
 * is llmt_cuda_matmul. */
int llmt_cuda_matmul_cd(llmt_device *dev, const char *op, int trans_a, int trans_b, int64_t m,
                        int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                        const void *b, int64_t ldb, int ab_dt, float beta, const void *c,
                        int64_t ldc, void *d, int64_t ldd, int c_dt, void *scratch);
int llmt_cuda_gemm(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                   void *c, int64_t ldc, int dt, void *scratch);
int llmt_cuda_gemm_cd(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                      float beta, const void *c, int64_t ldc, void *d, int64_t ldd, int dt,
                      void *scratch);
/* Scratch of the GEMM: the workspace and its alignment slack. */
size_t llmt_cuda_gemm_scratch(void);

/* ---- row-wise kernels (cuda_rowwise.cu) */
int llmt_cuda_embedding_fwd(llmt_device *dev, void *out, const void *table, const int32_t *ids,
                            int64_t m, int64_t d, int dt);
int llmt_cuda_embedding_bwd(llmt_device *dev, void *dtable, const void *dout, const int32_t *ids,
                            int64_t m, int64_t d, int dt);
int llmt_cuda_rmsnorm_fwd(llmt_device *dev, void *out, float *rstd, const void *x, const void *w,
                          int64_t m, int64_t d, float eps, int dt);
int llmt_cuda_rmsnorm_bwd(llmt_device *dev, void *dx, void *dw, const void *dout, const void *x,
                          const void *w, const float *rstd, int64_t m, int64_t d, int accumulate,
                          int dt, void *scratch);
size_t llmt_cuda_rmsnorm_scratch(const llmt_op_dims *dims);
int llmt_cuda_rope(llmt_device *dev, void *x, const float *cos_sin, int64_t m, int64_t seq,
                   int64_t heads, int64_t head_dim, int64_t row_stride, int inverse, int dt);
int llmt_cuda_swiglu_fwd(llmt_device *dev, void *out, const void *gate_up, int64_t m, int64_t f,
                         int dt);
int llmt_cuda_swiglu_bwd(llmt_device *dev, void *dgate_up, const void *dout, const void *gate_up,
                         int64_t m, int64_t f, int dt);
int llmt_cuda_cast(llmt_device *dev, void *dst, int dst_dt, const void *src, int src_dt, int64_t n);
int llmt_cuda_add(llmt_device *dev, void *y, const void *x, int64_t n, int dt);
/* y (dtype dt) = y + x (fp32), over n elements. */
int llmt_cuda_add_f32(llmt_device *dev, void *y, const float *x, int64_t n, int dt);

/* ---- attention (cuda_attention.cu) */
size_t llmt_cuda_attention_saved_bytes(const llmt_attn_dims *a);
size_t llmt_cuda_attention_scratch(const llmt_op_dims *dims);
int llmt_cuda_attention_fwd(llmt_device *dev, void *out, void *saved, const void *qkv,
                            const llmt_attn_dims *a, int dt, void *scratch);
int llmt_cuda_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                            const void *saved, const void *out, const llmt_attn_dims *a, int dt,
                            void *scratch);

/* ---- LM head and cross-entropy (cuda_cross_entropy.cu) */
/* ops.h's ce_chunk: all m rows while their fp32 logits take at most 2 GiB. */
int64_t llmt_cuda_ce_chunk(int64_t m, int64_t vocab);
size_t llmt_cuda_ce_scratch(const llmt_op_dims *dims);
int llmt_cuda_lm_head_ce(llmt_device *dev, const llmt_ce_args *args);

/* ---- optimizer (cuda_optim.cu) */
extern const size_t llmt_cuda_optim_scratch_bytes;
int llmt_cuda_grad_stats(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                         double *sumsq, int64_t *nonfinite, void *scratch);
/* Per block of `block` elements: partials into host memory, the non-finite
 * count in all; waits for the stream (ops.h's grad_stats_blocks). */
int llmt_cuda_grad_stats_blocks(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                                int64_t block, double *partials, int64_t *nonfinite,
                                void *scratch);
int llmt_cuda_adamw(llmt_device *dev, const llmt_adamw_args *args);
/* sum (fp32) += x (dtype dt) widened, over n elements (ops.h's accumulate). */
int llmt_cuda_accumulate(llmt_device *dev, float *sum, const void *x, int64_t n, int dt);
/* accumulate on a given stream of dev (the NCCL engine's, for the sums it
 * queues behind its exchanges). */
int llmt_cuda_accumulate_on(llmt_device *dev, cudaStream_t stream, float *sum, const void *x,
                            int64_t n, int dt);

#endif
