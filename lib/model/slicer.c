/* llmt_slicer: a global batch as micro-batches, normalised globally. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "llmt/slicer.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "model/ordered_sum.h"
#include "model/slicer_internal.h"

struct llmt_slicer {
    llmt_model *model;
    int32_t micro_batch;
    int32_t accumulation; /* llmt_accumulation */
    /* Ordered accumulation: the fp32 sum the micro-batches' gradients are
     * added to, laid out as the gradients are (ordered_sum.h). */
    llmt_ordered_sum sum;
};

int llmt_slicer_create(llmt_slicer **out, llmt_model *model, int32_t micro_batch)
{
    if (!out || !model)
        return llmt_fail(LLMT_EINVAL, "llmt_slicer_create: %s is NULL", out ? "model" : "out");
    *out = NULL;
    if (micro_batch < 1)
        return llmt_fail(LLMT_EINVAL, "llmt_slicer_create: micro_batch = %d (must be >= 1)",
                         micro_batch);
    llmt_slicer *s = calloc(1, sizeof *s);
    if (!s)
        return llmt_fail(LLMT_ENOMEM, "llmt_slicer_create: out of host memory");
    s->model = model;
    s->micro_batch = micro_batch;
    *out = s;
    return LLMT_OK;
}

void llmt_slicer_free(llmt_slicer *s)
{
    if (s)
        llmt_slicer_release_sum(s);
    free(s);
}

int llmt_slicer_set_accumulation(llmt_slicer *s, int32_t accumulation)
{
    if (!s)
        return llmt_fail(LLMT_EINVAL, "llmt_slicer_set_accumulation: slicer is NULL");
    if (accumulation != LLMT_ACCUMULATE_IN_PLACE && accumulation != LLMT_ACCUMULATE_ORDERED)
        return llmt_fail(LLMT_EINVAL, "llmt_slicer_set_accumulation: accumulation = %d is not an "
                         "llmt_accumulation", accumulation);
    s->accumulation = accumulation;
    if (accumulation == LLMT_ACCUMULATE_IN_PLACE)
        llmt_slicer_release_sum(s);
    return LLMT_OK;
}

int32_t llmt_slicer_accumulation(const llmt_slicer *s)
{
    return s ? s->accumulation : -1;
}

int llmt_slicer_set_micro_batch(llmt_slicer *s, int32_t micro_batch)
{
    if (!s || micro_batch < 1)
        return llmt_fail(LLMT_EINVAL, "llmt_slicer_set_micro_batch: %s",
                         s ? "micro_batch must be >= 1" : "slicer is NULL");
    s->micro_batch = micro_batch;
    return LLMT_OK;
}

int32_t llmt_slicer_micro_batch(const llmt_slicer *s)
{
    return s ? s->micro_batch : -1;
}

/* Targets that count (not -1) among n. */
static int64_t counted(const int32_t *targets, int64_t n)
{
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        c += targets[i] >= 0;
    return c;
}

void llmt_slicer_sum_bytes(const llmt_slicer *s, int32_t batch, int32_t micro, int64_t grad_split,
                           uint64_t *device, uint64_t *host)
{
    *device = *host = 0;
    if (s->accumulation == LLMT_ACCUMULATE_ORDERED && micro < batch)
        llmt_ordered_sum_bytes(s->model->num_params, grad_split, device, host);
}

uint64_t llmt_slicer_sum_host_held(const llmt_slicer *s)
{
    return s->sum.host.bytes;
}

void llmt_slicer_release_sum(llmt_slicer *s)
{
    llmt_ordered_sum_release(&s->sum, s->model->ctx);
}

int llmt_slicer_forward_backward(llmt_slicer *s, const int32_t *tokens, const int32_t *targets,
                                 int32_t batch, int32_t seq_len, double grad_scale, double *loss)
{
    const char *fn = "llmt_slicer_forward_backward";
    if (!s || !tokens || !targets)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn,
                         !s ? "slicer" : !tokens ? "tokens" : "targets");
    if (batch < 1 || seq_len < 1)
        return llmt_fail(LLMT_EINVAL, "%s: batch = %d, seq_len = %d (must be >= 1)", fn, batch,
                         seq_len);
    llmt_model *m = s->model;
    int32_t b = s->micro_batch < batch ? s->micro_batch : batch;
    /* Ordered: the sum starts as the gradients held now and each
     * micro-batch's gradient, computed alone, is added to it in order. */
    const int ordered = s->accumulation == LLMT_ACCUMULATE_ORDERED && b < batch;
    if (!ordered) /* a batch in one micro-batch holds no sum (as planned) */
        llmt_slicer_release_sum(s);
    /* Exactly one micro-batch's arena: a smaller last slice runs inside it. */
    if (!m->have_arena || m->layout.batch != b || m->layout.seq != seq_len ||
        memcmp(m->arena_flags, m->rc_flags, (size_t)m->dims.layers) != 0) {
        int rc = llmt_model_reserve_activations(m, b, seq_len);
        if (rc)
            return rc;
    }
    int64_t total = counted(targets, (int64_t)batch * seq_len);
    if (ordered)
        LLMT_TRY(llmt_ordered_sum_begin(&s->sum, m));
    double loss_sum = 0.0;
    for (int32_t first = 0; first < batch; first += b) {
        int32_t rows = batch - first < b ? batch - first : b;
        int64_t off = (int64_t)first * seq_len;
        double slice_loss = 0.0;
        if (ordered)
            LLMT_TRY(llmt_model_zero_grads(m));
        int rc = llmt_model_forward_backward(m, tokens + off, targets + off, rows, seq_len,
                                             grad_scale, total > 0 ? (double)total : 1.0,
                                             &slice_loss);
        if (!rc && ordered)
            rc = llmt_ordered_sum_add(&s->sum, m);
        if (rc)
            return rc;
        loss_sum += slice_loss * (double)counted(targets + off, (int64_t)rows * seq_len);
    }
    if (ordered)
        LLMT_TRY(llmt_ordered_sum_end(&s->sum, m));
    if (loss)
        *loss = total > 0 ? loss_sum / (double)total : 0.0;
    return LLMT_OK;
}
