/* CUDA fused LM head and cross-entropy, chunked over rows like the CPU: a
 * chunk's fp32 logits come from one GEMM (operands in the model's dtype,
 * fp32 result), a block per row turns them into the row's loss and, with a
 * gradient, into grad_scale * (softmax - onehot) in place; then dh for the
 * chunk and the head's gradient come from two more GEMMs.
 *
 * For 16-bit dtypes the logits' gradient is rounded to the dtype for those
 * two GEMMs (cuBLASLt multiplies operands of one type; an fp32 product over
 * the whole head would cost several times the step's other GEMMs), and the
 * head's gradient is accumulated over the chunks in an fp32 buffer and
 * added to dw once at the end, as on the CPU.
 *
 * Losses: each row's loss is computed in double, and the chunk's rows are
 * added to a running sum in row order by one thread, so the total has the
 * CPU's order. It and the count are copied back at the end.
 *
 * Scratch, from llmt_cuda_align_ptr(scratch), each region 256-aligned:
 * GEMM workspace | logits [chunk, vocab] f32 | row losses [chunk] f64 |
 * totals (f64 sum, i64 count) | 16-bit only: dlogits [chunk, vocab] dtype,
 * head gradient [vocab, d] f32. */
#include <string.h>

#include "cuda_kernels.cuh"

#define CE_THREADS 512

/* Loss of each row of a chunk; with want_grad the row becomes the gradient
 * of scale * loss. Rows with target -1 have loss 0 (and zero gradient). */
__global__ void __launch_bounds__(CE_THREADS)
    ce_rows_kernel(float *logits, double *row_loss, const int32_t *targets, int64_t rows,
                   int64_t vocab, int want_grad, float scale)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *row = logits + r * vocab;
        const int32_t target = targets[r];
        if (target < 0) { /* block-uniform */
            if (threadIdx.x == 0)
                row_loss[r] = 0.0;
            if (want_grad)
                for (int64_t k = threadIdx.x; k < vocab; k += blockDim.x)
                    row[k] = 0.0f;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t k = threadIdx.x; k < vocab; k += blockDim.x)
            mx = fmaxf(mx, row[k]);
        mx = block_max(mx, red);
        float sum = 0.0f;
        for (int64_t k = threadIdx.x; k < vocab; k += blockDim.x)
            sum += expf(row[k] - mx);
        sum = block_sum(sum, red);
        if (threadIdx.x == 0)
            row_loss[r] = (double)mx + log((double)sum) - (double)row[target];
        __syncthreads(); /* row[target] is read before it is overwritten */
        if (want_grad) {
            const float inv = scale / sum;
            for (int64_t k = threadIdx.x; k < vocab; k += blockDim.x) {
                float gk = expf(row[k] - mx) * inv;
                row[k] = k == target ? gk - scale : gk;
            }
        }
    }
}

/* totals += the chunk's row losses in row order; count += rows with a target. */
__global__ void ce_total_kernel(double *totals, const double *row_loss, const int32_t *targets,
                                int64_t rows)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    double sum = totals[0];
    long long count = ((long long *)totals)[1];
    for (int64_t r = 0; r < rows; r++) {
        sum += row_loss[r];
        count += targets[r] >= 0;
    }
    totals[0] = sum;
    ((long long *)totals)[1] = count;
}

/* fp32 -> dtype of n elements (dlogits for the 16-bit GEMMs). */
template <typename T> __global__ void to_dt_kernel(T *dst, const float *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(src[i]);
}

/* Byte offsets of the scratch regions, from the aligned start. */
typedef struct ce_layout {
    size_t logits, row_loss, totals, dlogits, dw, end;
} ce_layout;

static ce_layout ce_plan(int64_t chunk, int64_t vocab, int64_t d, int dt)
{
    ce_layout l;
    l.logits = llmt_cuda_round_up(LLMT_CUDA_GEMM_WORKSPACE);
    l.row_loss = l.logits + llmt_cuda_round_up((size_t)(chunk * vocab) * sizeof(float));
    l.totals = l.row_loss + llmt_cuda_round_up((size_t)chunk * sizeof(double));
    l.dlogits = l.totals + llmt_cuda_round_up(2 * sizeof(double));
    l.dw = l.dlogits;
    l.end = l.dlogits;
    if (dt != LLMT_DTYPE_F32) {
        l.dw = l.dlogits + llmt_cuda_round_up((size_t)(chunk * vocab) * llmt_cuda_dt_size(dt));
        l.end = l.dw + llmt_cuda_round_up((size_t)(vocab * d) * sizeof(float));
    }
    return l;
}

size_t llmt_cuda_ce_scratch(const llmt_op_dims *d)
{
    return ce_plan(d->ce_chunk, d->vocab, d->hidden, d->dt).end + LLMT_CUDA_ALIGN;
}

int llmt_cuda_lm_head_ce(llmt_device *dev, const llmt_ce_args *a)
{
    const char *op = "lm_head_ce";
    LLMT_CUDA_CHECK_DT(dev, a->dt, op);
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (!a->scratch)
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: scratch is NULL", op);
    if (a->m > 0 && (a->chunk < 1 || a->vocab < 1 || a->d < 1))
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: chunk %lld, vocab %lld, d %lld", op,
                              (long long)a->chunk, (long long)a->vocab, (long long)a->d);
    const int dt = a->dt, wide = dt == LLMT_DTYPE_F32;
    const int want_grad = a->want_grad && a->targets;
    const int64_t V = a->vocab, d = a->d;
    const size_t esize = llmt_cuda_dt_size(dt);
    cudaStream_t stream = cb->stream;
    const ce_layout lay = ce_plan(a->chunk, V, d, dt);
    char *base = llmt_cuda_align_ptr(a->scratch);
    float *logits = (float *)(base + lay.logits);
    double *row_loss = (double *)(base + lay.row_loss);
    double *totals = (double *)(base + lay.totals);
    void *dlogits = base + lay.dlogits;
    float *dw32 = (float *)(base + lay.dw);

    LLMT_CUDA_CHECK(dev, cudaMemsetAsync(totals, 0, 2 * sizeof(double), stream), op);
    if (want_grad && !wide)
        LLMT_CUDA_CHECK(dev, cudaMemsetAsync(dw32, 0, (size_t)(V * d) * sizeof(float), stream), op);
    for (int64_t c0 = 0; c0 < a->m; c0 += a->chunk) {
        const int64_t rows = c0 + a->chunk < a->m ? a->chunk : a->m - c0;
        const void *h = (const char *)a->h + (size_t)(c0 * d) * esize;
        int rc = llmt_cuda_matmul(dev, op, 0, 1, rows, V, d, 1.0f, h, d, a->w, d, dt, 0.0f,
                                  logits, V, LLMT_DTYPE_F32, a->scratch);
        if (rc)
            return rc;
        if (a->logits_out)
            LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(a->logits_out + c0 * V, logits,
                                                 (size_t)(rows * V) * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream), op);
        if (!a->targets)
            continue;
        LLMT_LAUNCH(llmt_cuda_blocks(rows, 1), CE_THREADS, stream, ce_rows_kernel)(
            logits, row_loss, a->targets + c0, rows, V, want_grad, a->grad_scale);
        LLMT_LAUNCH(1, 32, stream, ce_total_kernel)(totals, row_loss, a->targets + c0, rows);
        LLMT_CUDA_LAUNCHED(dev, op);
        if (!want_grad)
            continue;
        void *dh = (char *)a->dh + (size_t)(c0 * d) * esize;
        if (wide) {
            rc = llmt_cuda_matmul(dev, op, 0, 0, rows, d, V, 1.0f, logits, V, a->w, d, dt, 0.0f,
                                  dh, d, dt, a->scratch);
            if (!rc)
                rc = llmt_cuda_matmul(dev, op, 1, 0, V, d, rows, 1.0f, logits, V, h, d, dt, 1.0f,
                                      a->dw, d, dt, a->scratch);
        } else {
            LLMT_CUDA_DISPATCH(dt, T,
                               LLMT_LAUNCH(llmt_cuda_blocks(rows * V, 256), 256, stream,
                                           to_dt_kernel<T>)((T *)dlogits, logits, rows * V));
            LLMT_CUDA_LAUNCHED(dev, op);
            rc = llmt_cuda_matmul(dev, op, 0, 0, rows, d, V, 1.0f, dlogits, V, a->w, d, dt, 0.0f,
                                  dh, d, dt, a->scratch);
            if (!rc)
                rc = llmt_cuda_matmul(dev, op, 1, 0, V, d, rows, 1.0f, dlogits, V, h, d, dt, 1.0f,
                                      dw32, d, LLMT_DTYPE_F32, a->scratch);
        }
        if (rc)
            return rc;
    }
    if (want_grad && !wide) {
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
