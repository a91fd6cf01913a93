/* The backend op table: every operation the library performs on device
 * memory. The model, optimizer and trainer are written once against it; the
 * CPU backend (lib/ops/cpu) is the reference, the CUDA backend (cuda/) a
 * second implementation loaded as a plugin.
 *
 * Pointers named "device" point into memory the backend allocated; the host
 * never dereferences them except through these functions. Functions returning
 * int report failures with llmt_fail semantics: a negative LLMT_E* code and a
 * message set through the host's error function. */
#ifndef LLMT_OPS_OPS_H
#define LLMT_OPS_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever llmt_backend_ops or llmt_plugin_host changes, so a CUDA
 * plugin from another build is refused instead of misused. */
#define LLMT_BACKEND_ABI 11

typedef struct llmt_device llmt_device;

/* Fences of the copy stream's copies: 0 and 1 mark the gradient bucket's
 * slots (lib/model/grad_buckets.c), 2 and 3 the optimizer offload's two
 * staging halves (lib/optim/offload.c). */
#define LLMT_COPY_FENCES 4

/* Arguments of one AdamW update over n consecutive parameters (PyTorch's
 * AdamW: w *= 1 - lr wd; m, v updated; w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)),
 * the gradient multiplied by grad_factor first. */
typedef struct llmt_adamw_args {
    void *w;             /* weights, dtype w_dt */
    float *master;       /* fp32 master weights, or NULL: the update works on w */
    const void *g;       /* gradients, dtype w_dt */
    void *m, *v;         /* moments, dtype state_dt */
    int64_t n;
    int w_dt, state_dt;
    float grad_factor;   /* 1 / loss scale * clip coefficient */
    float lr, beta1, beta2, eps, weight_decay;
    float bias_correction1, bias_correction2; /* 1 - beta^t */
    /* Stochastic rounding of w (no master): element i draws value
     * rng_offset + i of Philox stream (seed, LLMT_STREAM_ROUNDING). */
    int stochastic;
    uint64_t seed, rng_offset;
} llmt_adamw_args;

/* Dimensions that size the ops' scratch; ce_chunk is the lm_head_ce chunk
 * (ce_chunk(batch * seq, vocab) for a model's step). */
typedef struct llmt_op_dims {
    int64_t batch, seq, hidden, heads, kv_heads, head_dim, ffn, vocab, ce_chunk;
    int dt;
    int num_threads;
} llmt_op_dims;

/* Shape of one attention call. */
typedef struct llmt_attn_dims {
    int64_t batch, seq, heads, kv_heads, head_dim;
} llmt_attn_dims;

/* Arguments of lm_head_ce. With targets, the summed loss and counted rows
 * are returned (rows with target -1 ignored) and, with want_grad, dh is
 * written and dw accumulated with the gradient of grad_scale * sum(loss_i).
 * With logits_out, every row's fp32 logits are copied there (host). */
typedef struct llmt_ce_args {
    const void *h;          /* [m, d] final hidden states */
    const void *w;          /* [vocab, d] LM head */
    const int32_t *targets; /* [m], -1 = ignore; NULL: logits only */
    int64_t m, d, vocab, chunk;
    int dt;
    int want_grad;
    float grad_scale;
    void *dh;            /* [m, d] */
    void *dw;            /* [vocab, d] */
    /* scratch_bytes() of dims with batch * seq >= m, ce_chunk >= chunk,
     * and ce_chunk < batch * seq when chunk < m (the CUDA op needs its fp32
     * head gradient buffer when chunk < m; the size has it when ce_chunk <
     * batch * seq). */
    void *scratch;
    double *loss_sum;    /* host: sum of the losses of counted rows */
    int64_t *count;      /* host: rows with a target */
    float *logits_out;   /* host [m, vocab] or NULL */
} llmt_ce_args;

typedef struct llmt_backend_ops {
    const char *name;
    /* 1 when device memory is host memory (the CPU): checkpoints then read
     * and write tensors in place instead of through a bounce buffer. */
    int host_memory;

    /* Memory. mem_alloc returns raw device memory (the context accounts it). */
    int (*mem_alloc)(llmt_device *dev, size_t bytes, void **out);
    void (*mem_free)(llmt_device *dev, void *ptr);
    /* Host memory for the STAGING category (pinned on CUDA); NULL where
     * mem_alloc already returns host memory. */
    int (*host_alloc)(llmt_device *dev, size_t bytes, void **out);
    void (*host_free)(llmt_device *dev, void *ptr);
    int (*copy_to_device)(llmt_device *dev, void *dst, const void *host_src, size_t bytes);
    int (*copy_to_host)(llmt_device *dev, void *host_dst, const void *src, size_t bytes);
    int (*copy_on_device)(llmt_device *dev, void *dst, const void *src, size_t bytes);
    int (*mem_zero)(llmt_device *dev, void *dst, size_t bytes);
    /* Device memory in all and free now; 0 and 0 where unknown. */
    int (*mem_info)(llmt_device *dev, uint64_t *total, uint64_t *free_now);
    /* Waits for all work queued on the backend's streams (the copy
     * stream's included). */
    int (*synchronize)(llmt_device *dev);
    /* Stores to the host that overlap the ops, on a copy stream beside the
     * stream the ops run on; both NULL where host_memory (copies are then
     * synchronous: callers use copy_to_host). copy_to_host_async queues a
     * copy of bytes from device src to host dst (HOST_STATE or STAGING
     * memory: pinned on CUDA) that starts after every op queued before the
     * call and every copy queued on the copy stream before it (the copy
     * stream runs its copies in the order queued), returns without
     * waiting, and marks fence `fence` (0 .. LLMT_COPY_FENCES - 1) after
     * the copy, replacing the fence's earlier mark. Until a wait_fence on
     * that fence (or synchronize), no op may write src and the host may not
     * touch dst. */
    int (*copy_to_host_async)(llmt_device *dev, void *host_dst, const void *src, size_t bytes,
                              int fence);
    /* Ops queued after this call start once the copies up to fence's last
     * mark are done; the host does not wait. A fence never marked: no wait. */
    int (*wait_fence)(llmt_device *dev, int fence);
    /* Loads from the host that overlap the host's work, on the same copy
     * stream (NULL where host_memory). copy_to_device_async queues a copy
     * of bytes from host src (HOST_STATE or STAGING memory) to device dst
     * ordered like copy_to_host_async's copies (after every op queued
     * before the call and every earlier copy on the copy stream), returns
     * without waiting, and marks fence `fence` like copy_to_host_async.
     * Until a fence_sync on that fence (or synchronize) the host may not
     * write src; until a wait_fence on it no op may read or write dst. */
    int (*copy_to_device_async)(llmt_device *dev, void *dst, const void *host_src, size_t bytes,
                                int fence);
    /* Returns once the copies up to fence's last mark are done (the host
     * waits; the ops do not). A fence never marked: returns at once. */
    int (*fence_sync)(llmt_device *dev, int fence);

    /* Releases the backend instance. */
    void (*destroy)(llmt_device *dev);

    /* ---- Numeric ops. Tensors are row-major; "dt" is the storage dtype of
     * the activation and parameter tensors (F32, BF16 or F16), computed in
     * fp32. Per-row statistics (rstd) are always fp32. Ops that need scratch
     * take `scratch`, at least scratch_bytes() large. Reductions run in a
     * fixed order: the same inputs and thread count give the same bits. */

    /* Scratch bytes the ops need for a model of these dimensions. */
    size_t (*scratch_bytes)(const llmt_op_dims *dims);

    /* C[m,n] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T. */
    int (*gemm)(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                void *c, int64_t ldc, int dt, void *scratch);
    /* D[m,n] = alpha * op(A) op(B) + beta * C with a separate output D (the
     * residual add folded into the product: cuBLASLt's C != D); C is read
     * only, and not at all when beta is 0 (c may then be NULL). D == C (then
     * ldd must equal ldc) is gemm; otherwise the spans from D's first to
     * last element and C's must not intersect (refused, LLMT_EINVAL, even
     * when interleaved rows share no element), and D must not overlap A or B
     * (not checked). On the CPU the bits are those of copying C's
     * m x n block into D and calling gemm on D. */
    int (*gemm_cd)(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                   float beta, const void *c, int64_t ldc, void *d, int64_t ldd, int dt,
                   void *scratch);

    /* out[i] = table[ids[i]] for i < m; rows of d. */
    int (*embedding_fwd)(llmt_device *dev, void *out, const void *table, const int32_t *ids,
                         int64_t m, int64_t d, int dt);
    /* dtable[ids[i]] += dout[i]: each element is its value widened to fp32
     * plus the dout of every token naming its row, added in token order in
     * fp32, rounded to the dtype once (so many small contributions to a
     * frequent id are not lost); the same bits for any thread count. */
    int (*embedding_bwd)(llmt_device *dev, void *dtable, const void *dout, const int32_t *ids,
                         int64_t m, int64_t d, int dt);

    /* out = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps), per row. */
    int (*rmsnorm_fwd)(llmt_device *dev, void *out, float *rstd, const void *x, const void *w,
                       int64_t m, int64_t d, float eps, int dt);
    /* dx (= or += when accumulate) and dw += the gradients of rmsnorm_fwd. */
    int (*rmsnorm_bwd)(llmt_device *dev, void *dx, void *dw, const void *dout, const void *x,
                       const void *w, const float *rstd, int64_t m, int64_t d, int accumulate,
                       int dt, void *scratch);

    /* Rotates the first `heads` head vectors of each row in place, row r at
     * position r % seq (rotate-half convention); inverse rotates back, which
     * is the backward pass. cos_sin: per position head_dim / 2 cosines, then
     * as many sines. */
    int (*rope)(llmt_device *dev, void *x, const float *cos_sin, int64_t m, int64_t seq,
                int64_t heads, int64_t head_dim, int64_t row_stride, int inverse, int dt);

    /* Bytes attention keeps from forward for backward (the CPU keeps the
     * probabilities; a flash-style kernel would keep a logsumexp per row). */
    size_t (*attention_saved_bytes)(const llmt_attn_dims *a);
    /* Causal attention over qkv rows [q heads | k heads | v heads]; out is
     * [m, heads * head_dim]; `saved` (attention_saved_bytes) is written when
     * not NULL, for backward. */
    int (*attention_fwd)(llmt_device *dev, void *out, void *saved, const void *qkv,
                         const llmt_attn_dims *a, int dt, void *scratch);
    /* dqkv = gradient of attention_fwd; saved NULL recomputes what forward
     * would have kept, with the same arithmetic (same bits). */
    int (*attention_bwd)(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                         const void *saved, const void *out, const llmt_attn_dims *a, int dt,
                         void *scratch);

    /* out[i, j] = silu(gu[i, j]) * gu[i, f + j] for rows of 2f. */
    int (*swiglu_fwd)(llmt_device *dev, void *out, const void *gate_up, int64_t m, int64_t f,
                      int dt);
    /* dgate_up = gradient of swiglu_fwd. */
    int (*swiglu_bwd)(llmt_device *dev, void *dgate_up, const void *dout, const void *gate_up,
                      int64_t m, int64_t f, int dt);

    /* dst[i] = src[i] converted between dtypes (round to nearest even). */
    int (*cast)(llmt_device *dev, void *dst, int dst_dt, const void *src, int src_dt, int64_t n);

    /* y += x over n elements. */
    int (*add)(llmt_device *dev, void *y, const void *x, int64_t n, int dt);

    /* Fused LM head and cross-entropy, chunked over rows so that only
     * [chunk, vocab] logits exist at once; see llmt_ce_args. */
    int (*lm_head_ce)(llmt_device *dev, const llmt_ce_args *args);
    /* Rows per lm_head_ce chunk the backend prefers for m rows of a vocab
     * head: min(m, a bound of the backend's). A size function (callable on
     * a planning table): the model's forward passes it as args->chunk and
     * its layout as dims->ce_chunk with m = batch * seq, so the plan sizes
     * what runs. Non-decreasing in m, so an arena laid out for m rows also
     * serves fewer. */
    int64_t (*ce_chunk)(int64_t m, int64_t vocab);

    /* Bytes of scratch the optimizer ops need (allocated by the optimizer). */
    size_t optim_scratch_bytes;
    /* One pass over gradients: the sum of (factor g)^2 and the count of
     * non-finite (factor g); factor g is rounded to fp32, then squared and
     * summed in double (a finite value's square cannot overflow). */
    int (*grad_stats)(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                      double *sumsq, int64_t *nonfinite, void *scratch);
    /* Per block of `block` elements of g (the last may be shorter): the sum
     * of (factor g)^2, squared and summed in double as in grad_stats, into
     * host partials[i], and the count of non-finite (factor g) in all.
     * Block i's partial has the same bits for any thread count, and whether
     * g is the whole buffer or a sub-range starting at a multiple of
     * `block` (so a buffer split at such points gives the whole buffer's
     * partials). scratch: optim_scratch_bytes of
     * device memory (the CPU ignores it); returns once partials are written.
     * NULL where the backend has none (then no sharded optimizer). */
    int (*grad_stats_blocks)(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                             int64_t block, double *partials, int64_t *nonfinite,
                             void *scratch);
    /* One AdamW update; see llmt_adamw_args. */
    int (*adamw)(llmt_device *dev, const llmt_adamw_args *args);

    /* Attention of the last m of a->seq positions of one sequence (a->batch
     * 1) against a key/value cache of all a->seq, causal: query row i sees
     * cache rows [0, a->seq - m + i]. q is [m, heads * head_dim]; kv rows are
     * [k heads | v heads], 2 kv_heads head_dim wide; out is [m, heads *
     * head_dim]. scratch: attention_kv_scratch_bytes() of a cache of at
     * least a->seq positions. NULL where the backend has none (then no
     * cached generation). */
    int (*attention_kv_fwd)(llmt_device *dev, void *out, const void *q, const void *kv,
                            int64_t m, const llmt_attn_dims *a, int dt, void *scratch);
    /* Scratch bytes attention_kv_fwd needs for a cache of up to a->seq
     * positions with num_threads threads (NULL with attention_kv_fwd). */
    size_t (*attention_kv_scratch_bytes)(const llmt_attn_dims *a, int num_threads);

    /* sum[i] += x[i] over n elements: sum is fp32, x of dtype dt widened to
     * fp32, one fp32 addition per element (the same bits on every backend
     * and thread count). The ordered slicer's and the sharded owner's fp32
     * gradient sums are built with it, in every mode. */
    int (*accumulate)(llmt_device *dev, float *sum, const void *x, int64_t n, int dt);
} llmt_backend_ops;

/* A backend instance; each backend embeds this first in its own state. */
struct llmt_device {
    const llmt_backend_ops *ops;
    int num_threads; /* CPU threads for host-side work */
};

/* What libllmt hands a plugin backend: its error function (the plugin cannot
 * reach libllmt's internal symbols). */
typedef struct llmt_plugin_host {
    uint32_t abi; /* LLMT_BACKEND_ABI */
    int (*fail)(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
} llmt_plugin_host;

/* The one symbol a CUDA plugin exports. */
#define LLMT_CUDA_PLUGIN_ENTRY "llmt_plugin_cuda_open"
typedef int (*llmt_plugin_open_fn)(const llmt_plugin_host *host, int device, int num_threads,
                                   llmt_device **out);

/* Creates the CPU backend. */
int llmt_cpu_backend_create(int num_threads, llmt_device **out);

#endif
