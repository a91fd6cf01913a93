/* CPU fused LM head and cross-entropy. Rows are processed in chunks: the
 * chunk's logits are computed, turned into per-row losses and, when asked,
 * into the logits' gradient in place, which is then pushed through the LM
 * head (dh for the chunk, dw accumulated) before the next chunk reuses the
 * buffer. The full [m, vocab] logits never exist.
 *
 * For 16-bit dtypes the head's gradient is accumulated in fp32 over the
 * chunks and added to dw once at the end, and the products run one of two
 * ways, as the device's GEMM dispatch chose (llmt_cpu_gemm_native):
 * - native (bf16 on AVX512_BF16 or AMX): h and the head as stored, fp32
 *   logits and head gradient, fp32 accumulation. The logits' gradient is
 *   computed in fp32 and rounded once to the dtype for the two backward
 *   products, as the CUDA backend does (oneDNN multiplies operands of one
 *   type; fp32 backward products would need the head widened every call).
 * - widened: the head is converted to fp32 once per call, each chunk's rows
 *   of h and dh pass through fp32 copies, and all products are fp32. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

/* Scratch layout, in order: row losses [chunk] f64 (first, so they are
 * 8-byte aligned whatever the vocabulary); logits [chunk, vocab] f32; for
 * 16-bit only: head [vocab, d], head gradient [vocab, d], h rows
 * [chunk, d] and dh rows [chunk, d], all f32. The native path uses only the
 * head gradient of these; they are planned whatever the CPU, so that a
 * model's memory plan does not depend on the machine it is made on. */
size_t llmt_cpu_ce_scratch(const llmt_op_dims *d)
{
    size_t bytes = (size_t)d->ce_chunk * ((size_t)d->vocab * sizeof(float) + sizeof(double));
    if (d->dt != LLMT_DTYPE_F32)
        bytes += (2 * (size_t)d->vocab + 2 * (size_t)d->ce_chunk) * (size_t)d->hidden *
                 sizeof(float);
    return bytes;
}

/* Loss of one row of logits; with want_grad, the row becomes
 * scale * (softmax - onehot(target)). */
LLMT_CLONES static double ce_row(float *logits, int64_t vocab, int32_t target, int want_grad,
                                 float scale)
{
    float mx = row_max(logits, vocab);
    float sum = exp_sum(logits, vocab, mx, 0);
    double loss = (double)mx + log((double)sum) - (double)logits[target];
    if (want_grad) {
        float inv = scale / sum;
        for (int64_t k = 0; k < vocab; k++)
            logits[k] = fast_expf(logits[k] - mx) * inv;
        logits[target] -= scale;
    }
    return loss;
}

/* ce_row with want_grad for a native 16-bit head: the row's fp32 gradient,
 * the same values as ce_row's, is rounded to dt into the row's own storage,
 * element k to 16-bit slot k (the first half of the row, so the rounded
 * rows keep a stride of 2 vocab elements). Each block is computed before
 * memcpy overwrites it, and the slots written lie below the fp32 elements
 * still to be read. */
#define CE_BLOCK 64
LLMT_CLONES static double ce_row_rounded(float *logits, int64_t vocab, int32_t target,
                                         float scale, int dt)
{
    float mx = row_max(logits, vocab);
    float sum = exp_sum(logits, vocab, mx, 0);
    double loss = (double)mx + log((double)sum) - (double)logits[target];
    float inv = scale / sum;
    float g[CE_BLOCK];
    uint16_t rounded[CE_BLOCK];
    for (int64_t j = 0; j < vocab; j += CE_BLOCK) {
        int64_t len = vocab - j < CE_BLOCK ? vocab - j : CE_BLOCK;
        for (int64_t i = 0; i < len; i++)
            g[i] = fast_expf(logits[j + i] - mx) * inv;
        if (target >= j && target < j + len)
            g[target - j] -= scale;
        round_to_16bit(rounded, g, len, dt);
        memcpy((uint16_t *)(void *)logits + j, rounded, (size_t)len * sizeof *rounded);
    }
    return loss;
}

/* n elements of dtype dt to fp32 and back, in parallel. */
static void convert_in(llmt_device *dev, float *dst, const void *src, int64_t n, int dt)
{
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, n))
    for (int64_t i = 0; i < n; i++)
        dst[i] = get(src, dt, i);
}

static void convert_out(llmt_device *dev, void *dst, const float *src, int64_t n, int dt,
                        int accumulate)
{
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, n))
    for (int64_t i = 0; i < n; i++)
        put(dst, dt, i, accumulate ? get(dst, dt, i) + src[i] : src[i]);
}

/* The products of one chunk of rows [c0, c0 + rows) on a native 16-bit
 * head: logits from h and the head as stored; with dlogits (the gradient
 * rounded to dt, row stride 2 vocab), dh and the fp32 head gradient dw_f32
 * (overwritten by the first chunk, accumulated by the others). */
static int native_logits(llmt_device *dev, const llmt_ce_args *a, int64_t c0, int64_t rows,
                         float *logits)
{
    return llmt_cpu_gemm_to_f32(dev, 0, 1, rows, a->vocab, a->d, 1.0f, cat(a->h, a->dt, c0 * a->d),
                                a->d, a->w, a->d, 0.0f, logits, a->vocab, a->dt);
}

static int native_backward(llmt_device *dev, const llmt_ce_args *a, int64_t c0, int64_t rows,
                           const void *dlogits, float *dw_f32)
{
    const int dt = a->dt;
    LLMT_TRY(llmt_cpu_gemm(dev, 0, 0, rows, a->d, a->vocab, 1.0f, dlogits, 2 * a->vocab, a->w,
                           a->d, 0.0f, at(a->dh, dt, c0 * a->d), a->d, dt, NULL));
    return llmt_cpu_gemm_to_f32(dev, 1, 0, a->vocab, a->d, rows, 1.0f, dlogits, 2 * a->vocab,
                                cat(a->h, dt, c0 * a->d), a->d, c0 == 0 ? 0.0f : 1.0f, dw_f32,
                                a->d, dt);
}

int llmt_cpu_lm_head_ce(llmt_device *dev, const llmt_ce_args *a)
{
    const int dt = a->dt, wide = dt == LLMT_DTYPE_F32;
    const int native = !wide && llmt_cpu_gemm_native(dev, dt);
    const int want_grad = a->want_grad && a->targets;
    double *row_loss = a->scratch;
    float *logits = (float *)(row_loss + a->chunk);
    float *w = (float *)a->w, *dw = a->dw;
    float *h_rows = NULL, *dh_rows = NULL;
    if (!wide) {
        w = logits + a->chunk * a->vocab;
        dw = w + a->vocab * a->d;
        h_rows = dw + a->vocab * a->d;
        dh_rows = h_rows + a->chunk * a->d;
    }
    if (!wide && !native) {
        convert_in(dev, w, a->w, a->vocab * a->d, dt);
        if (want_grad)
            memset(dw, 0, (size_t)(a->vocab * a->d) * sizeof *dw);
    }
    double loss_sum = 0.0;
    int64_t count = 0;
    for (int64_t c0 = 0; c0 < a->m; c0 += a->chunk) {
        int64_t rows = c0 + a->chunk < a->m ? a->chunk : a->m - c0;
        const float *h = wide ? (const float *)a->h + c0 * a->d : h_rows;
        if (native)
            LLMT_TRY(native_logits(dev, a, c0, rows, logits));
        else {
            if (!wide)
                convert_in(dev, h_rows, cat(a->h, dt, c0 * a->d), rows * a->d, dt);
            LLMT_TRY(llmt_cpu_gemm(dev, 0, 1, rows, a->vocab, a->d, 1.0f, h, a->d, w, a->d, 0.0f,
                                   logits, a->vocab, LLMT_DTYPE_F32, NULL));
        }
        if (a->logits_out)
            memcpy(a->logits_out + c0 * a->vocab, logits, (size_t)(rows * a->vocab) * sizeof(float));
        if (!a->targets)
            continue;
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, rows * a->vocab))
        for (int64_t r = 0; r < rows; r++) {
            float *row = logits + r * a->vocab;
            int32_t target = a->targets[c0 + r];
            if (target < 0) {
                row_loss[r] = 0.0;
                if (want_grad)
                    memset(row, 0, (size_t)a->vocab * sizeof *row);
            } else if (native && want_grad) {
                row_loss[r] = ce_row_rounded(row, a->vocab, target, a->grad_scale, dt);
            } else {
                row_loss[r] = ce_row(row, a->vocab, target, want_grad, a->grad_scale);
            }
        }
        for (int64_t r = 0; r < rows; r++) { /* in row order: deterministic */
            loss_sum += row_loss[r];
            count += a->targets[c0 + r] >= 0;
        }
        if (!want_grad)
            continue;
        if (native) {
            LLMT_TRY(native_backward(dev, a, c0, rows, logits, dw));
            continue;
        }
        float *dh = wide ? (float *)a->dh + c0 * a->d : dh_rows;
        LLMT_TRY(llmt_cpu_gemm(dev, 0, 0, rows, a->d, a->vocab, 1.0f, logits, a->vocab, w, a->d,
                               0.0f, dh, a->d, LLMT_DTYPE_F32, NULL));
        LLMT_TRY(llmt_cpu_gemm(dev, 1, 0, a->vocab, a->d, rows, 1.0f, logits, a->vocab, h, a->d,
                               1.0f, dw, a->d, LLMT_DTYPE_F32, NULL));
        if (!wide)
            convert_out(dev, at(a->dh, dt, c0 * a->d), dh_rows, rows * a->d, dt, 0);
    }
    if (want_grad && !wide && a->m > 0) /* native: dw_f32 is written by the first chunk */
        convert_out(dev, a->dw, dw, a->vocab * a->d, dt, 1);
    if (a->loss_sum)
        *a->loss_sum = loss_sum;
    if (a->count)
        *a->count = count;
    return LLMT_OK;
}
