/* CUDA fused LM head and cross-entropy. Rows come in chunks of
 * llmt_cuda_ce_chunk rows: all of them when their fp32 logits take at most
 * LLMT_CUDA_CE_LOGITS_BYTES (a training step of the ~1B config, B 8 x T 2048
 * x vocab 32000, is one chunk), else chunks of that many rows. Per chunk:
 * - one GEMM for the chunk's fp32 logits (operands in the model's dtype);
 * - one kernel, a block per row, for the row's loss (in double) and, with a
 *   gradient, grad_scale * (softmax - onehot) written in place in the
 *   model's dtype: element k of a 16-bit gradient goes to 16-bit slot k of
 *   the row's own fp32 storage, so the rounded rows keep a stride of twice
 *   the fp32 one (as the CPU's native path, lib/ops/cpu/cpu_cross_entropy.c);
 *   the gradient is rounded once, from fp32, and no conversion pass runs;
 * - dh = dlogits W and dW += dlogits^T h, two GEMMs on that gradient
 *   (cuBLASLt multiplies operands of one type; fp32 products over the whole
 *   head would cost several times the step's other GEMMs).
 *
 * The head's gradient is accumulated in fp32 and rounded to the dtype once,
 * as on the CPU. With one chunk that is the dW GEMM itself (beta 1 into dw:
 * fp32 accumulation, dw widened, one rounding), and no [vocab, d] buffer
 * exists. With several chunks of a 16-bit dtype, cuBLASLt cannot write a
 * 16-bit D from an fp32 C, so the chunks' products go to an fp32 [vocab, d]
 * buffer (the first chunk writes it, beta 0; the others add, beta 1), added
 * to dw once at the end. That buffer costs 8 vocab d bytes of traffic per
 * chunk against the dW GEMM's 2 vocab d chunk FLOPs: at the thousands of
 * rows a chunk has here, a few percent of that GEMM's time. FP32 adds each
 * chunk's product into dw (beta 1), as the CPU does.
 *
 * Losses: each row's loss is computed in double, and the chunk's rows are
 * added to a running sum in row order by one thread, so the total has the
 * CPU's order (the same bits run to run). It and the count are copied back
 * at the end.
 *
 * The fp32 logits rows have a stride of ce_logits_ld(vocab) floats, vocab
 * rounded up to a multiple of 4, so every fp32 row and every 16-bit
 * gradient row (2 ce_logits_ld elements, 4 ce_logits_ld bytes) starts
 * 16-byte aligned, as cuBLASLt's fastest kernels want of the GEMMs' rows
 * (an odd vocabulary such as GPT-2's 50257 would leave them 4-byte
 * aligned). A row's padding, at most 3 floats, is never written as logits
 * nor read: every loop and GEMM stops at vocab.
 *
 * Scratch, from llmt_cuda_align_ptr(scratch), each region 256-aligned:
 * GEMM workspace | logits [chunk, ce_logits_ld(vocab)] f32 | row losses
 * [chunk] f64 | totals (f64 sum, i64 count) | with several chunks of a
 * 16-bit dtype only: head gradient [vocab, d] f32. */
#include <string.h>

#include "cuda_kernels.cuh"

#define CE_THREADS 512

/* The most bytes of fp32 logits one chunk holds. */
#define LLMT_CUDA_CE_LOGITS_BYTES ((int64_t)2 << 30)

/* (max, sum of exp(x - max)) of two parts merged into mx, sum. The same bits
 * whichever part comes first (max and + are commutative), so a butterfly
 * leaves every lane with the same value. A part with no elements has sum 0
 * (and max -inf) and adds nothing. */
__device__ __forceinline__ void softmax_merge(float &mx, float &sum, float omx, float osum)
{
    const float m = fmaxf(mx, omx);
    sum = (sum == 0.0f ? 0.0f : sum * expf(mx - m)) + (osum == 0.0f ? 0.0f : osum * expf(omx - m));
    mx = m;
}

__device__ __forceinline__ void warp_softmax_merge(float &mx, float &sum)
{
    for (int off = 16; off > 0; off >>= 1) {
        const float omx = __shfl_xor_sync(0xffffffffu, mx, off);
        const float osum = __shfl_xor_sync(0xffffffffu, sum, off);
        softmax_merge(mx, sum, omx, osum);
    }
}

/* The block's (max, sum of exp(x - max)) from every thread's, in a tree
 * fixed by blockDim (as block_sum); every thread gets the result. */
__device__ __forceinline__ void block_softmax_stats(float &mx, float &sum, float *smx,
                                                    float *ssum)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    warp_softmax_merge(mx, sum);
    if (lane == 0) {
        smx[warp] = mx;
        ssum[warp] = sum;
    }
    __syncthreads();
    mx = lane < warps ? smx[lane] : -INFINITY;
    sum = lane < warps ? ssum[lane] : 0.0f;
    warp_softmax_merge(mx, sum);
    __syncthreads(); /* smx, ssum are reused by the next row */
}

/* Loss of each row of a chunk of fp32 logits (row stride ld floats, of
 * which the first vocab are logits); with want_grad the row becomes the
 * gradient of scale * loss in T, in place (slot k of a row of T over the
 * row's fp32 storage: for 16-bit T a stride of 2 ld). Rows with target -1
 * have loss 0 (and zero gradient). One pass reads the row for its max and
 * sum of exponentials (each thread's running pair, rescaled when its max
 * grows), one more writes the gradient. */
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    ce_rows_kernel(float *logits, double *row_loss, const int32_t *targets, int64_t rows,
                   int64_t vocab, int64_t ld, int want_grad, float scale)
{
    __shared__ float smx[32], ssum[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *row = logits + r * ld;
        T *grad = (T *)row;
        const int32_t target = targets[r];
        if (target < 0) { /* block-uniform */
            if (threadIdx.x == 0)
                row_loss[r] = 0.0;
            if (want_grad)
                for (int64_t k = threadIdx.x; k < vocab; k += blockDim.x)
                    grad[k] = from_f32<T>(0.0f);
            continue;
        }
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t k = threadIdx.x; k < vocab; k += blockDim.x) {
            const float x = row[k];
            if (x > mx) {
                sum = sum * expf(mx - x) + 1.0f;
                mx = x;
            } else {
                sum += expf(x - mx);
            }
        }
        block_softmax_stats(mx, sum, smx, ssum);
        /* Thread 0 reads row[target] before the first barrier below, which
         * every write of the row follows. */
        if (threadIdx.x == 0)
            row_loss[r] = (double)mx + log((double)sum) - (double)row[target];
        if (!want_grad)
            continue;
        const float inv = scale / sum;
        /* In tiles of blockDim elements: every thread reads its fp32
         * element, then, after the barrier, writes its slot. A tile's slots
         * overlap at most its own fp32 elements (those of tile 0), never a
         * later tile's, so one barrier per tile orders every read before
         * the write over it. The tile count is the same for every thread. */
        for (int64_t k0 = 0; k0 < vocab; k0 += blockDim.x) {
            const int64_t k = k0 + threadIdx.x;
            float g = 0.0f;
            if (k < vocab) {
                g = expf(row[k] - mx) * inv;
                if (k == target)
                    g -= scale;
            }
            __syncthreads();
            if (k < vocab)
                grad[k] = from_f32<T>(g);
        }
    }
}

#define CE_TOTAL_THREADS 256

/* totals += the chunk's row losses in row order; count += rows with a target. */
__global__ void __launch_bounds__(CE_TOTAL_THREADS)
    ce_total_kernel(double *totals, const double *row_loss, const int32_t *targets, int64_t rows)
{
    /* The block stages a tile of row losses in shared memory with one
     * coalesced load, so thread 0's ordered sum waits on no global loads. */
    __shared__ double tile_loss[CE_TOTAL_THREADS];
    __shared__ int tile_counted[CE_TOTAL_THREADS];
    double sum = 0.0;
    long long count = 0;
    if (threadIdx.x == 0)
        sum = totals[0], count = ((long long *)totals)[1];
    for (int64_t t0 = 0; t0 < rows; t0 += CE_TOTAL_THREADS) { /* block-uniform */
        const int64_t r = t0 + threadIdx.x;
        if (r < rows) {
            tile_loss[threadIdx.x] = row_loss[r];
            tile_counted[threadIdx.x] = targets[r] >= 0;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const int64_t n = rows - t0 < CE_TOTAL_THREADS ? rows - t0 : CE_TOTAL_THREADS;
            for (int64_t i = 0; i < n; i++) {
                sum += tile_loss[i];
                count += tile_counted[i];
            }
        }
        __syncthreads(); /* the tile is read before the next one is staged */
    }
    if (threadIdx.x == 0) {
        totals[0] = sum;
        ((long long *)totals)[1] = count;
    }
}

/* Byte offsets of the scratch regions, from the aligned start. */
typedef struct ce_layout {
    size_t logits, row_loss, totals, dw, end;
} ce_layout;

/* Row stride, in floats, of the fp32 logits of a vocabulary: vocab rounded
 * up to a multiple of 4 (16 bytes; see the file's comment). */
static int64_t ce_logits_ld(int64_t vocab)
{
    return (vocab + 3) / 4 * 4;
}

/* head_f32: the fp32 [vocab, d] head gradient is needed (several chunks of
 * a 16-bit dtype). */
static ce_layout ce_plan(int64_t chunk, int64_t vocab, int64_t d, int head_f32)
{
    ce_layout l;
    l.logits = llmt_cuda_round_up(LLMT_CUDA_GEMM_WORKSPACE);
    l.row_loss =
        l.logits + llmt_cuda_round_up((size_t)(chunk * ce_logits_ld(vocab)) * sizeof(float));
    l.totals = l.row_loss + llmt_cuda_round_up((size_t)chunk * sizeof(double));
    l.dw = l.totals + llmt_cuda_round_up(2 * sizeof(double));
    l.end = l.dw + (head_f32 ? llmt_cuda_round_up((size_t)(vocab * d) * sizeof(float)) : 0);
    return l;
}

int64_t llmt_cuda_ce_chunk(int64_t m, int64_t vocab)
{
    /* The rows whose (padded) logits fit the bound, in whole 256-row units
     * (at least one): a constant of the vocabulary, so min(m, it) grows
     * with m. */
    int64_t most =
        vocab > 0 ? LLMT_CUDA_CE_LOGITS_BYTES / (ce_logits_ld(vocab) * (int64_t)sizeof(float)) : 0;
    most = most / 256 * 256;
    if (most < 256)
        most = 256;
    return m < most ? m : most;
}

size_t llmt_cuda_ce_scratch(const llmt_op_dims *d)
{
    const int head_f32 = d->dt != LLMT_DTYPE_F32 && d->ce_chunk < d->batch * d->seq;
    return ce_plan(d->ce_chunk, d->vocab, d->hidden, head_f32).end + LLMT_CUDA_ALIGN;
}

/* Copies a chunk's rows of fp32 logits (row stride ld) to the host's
 * [rows, vocab] at dst in one copy, a 2-D one that leaves the padding
 * behind (rows of vocab floats from a pitch of ld to one of vocab). */
static int ce_copy_logits(llmt_device *dev, float *dst, const float *logits, int64_t rows,
                          int64_t vocab, int64_t ld, cudaStream_t stream)
{
    const size_t row_bytes = (size_t)vocab * sizeof(float);
    LLMT_CUDA_CHECK(dev, cudaMemcpy2DAsync(dst, row_bytes, logits, (size_t)ld * sizeof(float),
                                           row_bytes, (size_t)rows, cudaMemcpyDeviceToHost,
                                           stream),
                    "lm_head_ce");
    return LLMT_OK;
}

int llmt_cuda_lm_head_ce(llmt_device *dev, const llmt_ce_args *a)
{
    const char *op = "lm_head_ce";
    LLMT_CUDA_CHECK_DT(dev, a->dt, op);
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (!a->scratch)
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: scratch is NULL", op);
    if (a->m < 0 || (a->m > 0 && (a->chunk < 1 || a->vocab < 1 || a->d < 1)))
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: m %lld, chunk %lld, vocab %lld, d %lld", op,
                              (long long)a->m, (long long)a->chunk, (long long)a->vocab,
                              (long long)a->d);
    const int dt = a->dt, wide = dt == LLMT_DTYPE_F32;
    const int want_grad = a->want_grad && a->targets;
    const int head_f32 = want_grad && !wide && a->chunk < a->m;
    const int64_t V = a->vocab, d = a->d, ld = ce_logits_ld(V);
    /* Row stride of the in-place gradient, in elements of the dtype. */
    const int64_t ldg = wide ? ld : 2 * ld;
    const size_t esize = llmt_cuda_dt_size(dt);
    cudaStream_t stream = cb->stream;
    const ce_layout lay = ce_plan(a->chunk, V, d, head_f32);
    char *base = llmt_cuda_align_ptr(a->scratch);
    float *logits = (float *)(base + lay.logits);
    double *row_loss = (double *)(base + lay.row_loss);
    double *totals = (double *)(base + lay.totals);
    float *dw32 = (float *)(base + lay.dw);

    LLMT_CUDA_CHECK(dev, cudaMemsetAsync(totals, 0, 2 * sizeof(double), stream), op);
    for (int64_t c0 = 0; c0 < a->m; c0 += a->chunk) {
        const int64_t rows = c0 + a->chunk < a->m ? a->chunk : a->m - c0;
        const void *h = (const char *)a->h + (size_t)(c0 * d) * esize;
        int rc = llmt_cuda_matmul(dev, op, 0, 1, rows, V, d, 1.0f, h, d, a->w, d, dt, 0.0f,
                                  logits, ld, LLMT_DTYPE_F32, a->scratch);
        if (!rc && a->logits_out)
            rc = ce_copy_logits(dev, a->logits_out + c0 * V, logits, rows, V, ld, stream);
        if (rc)
            return rc;
        if (!a->targets)
            continue;
        LLMT_CUDA_DISPATCH(dt, T,
                           LLMT_LAUNCH(llmt_cuda_blocks(rows, 1), CE_THREADS, stream,
                                       ce_rows_kernel<T>)(logits, row_loss, a->targets + c0, rows,
                                                          V, ld, want_grad, a->grad_scale));
        LLMT_LAUNCH(1, CE_TOTAL_THREADS, stream, ce_total_kernel)(totals, row_loss,
                                                                   a->targets + c0, rows);
        LLMT_CUDA_LAUNCHED(dev, op);
        if (!want_grad)
            continue;
        void *dh = (char *)a->dh + (size_t)(c0 * d) * esize;
        rc = llmt_cuda_matmul(dev, op, 0, 0, rows, d, V, 1.0f, logits, ldg, a->w, d, dt, 0.0f, dh,
                              d, dt, a->scratch);
        if (!rc && head_f32)
            rc = llmt_cuda_matmul(dev, op, 1, 0, V, d, rows, 1.0f, logits, ldg, h, d, dt,
                                  c0 == 0 ? 0.0f : 1.0f, dw32, d, LLMT_DTYPE_F32, a->scratch);
        else if (!rc)
            rc = llmt_cuda_matmul(dev, op, 1, 0, V, d, rows, 1.0f, logits, ldg, h, d, dt, 1.0f,
                                  a->dw, d, dt, a->scratch);
        if (rc)
            return rc;
    }
    if (head_f32) {
        int rc = llmt_cuda_add_f32(dev, a->dw, dw32, V * d, dt);
        if (rc)
            return rc;
    }
    double host_totals[2] = {0.0, 0.0};
    if (a->targets)
        LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(host_totals, totals, sizeof host_totals,
                                             cudaMemcpyDeviceToHost, stream), op);
    LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(stream), op);
    long long count = 0;
    memcpy(&count, &host_totals[1], sizeof count);
    if (a->loss_sum)
        *a->loss_sum = host_totals[0];
    if (a->count)
        *a->count = (int64_t)count;
    return LLMT_OK;
}
