/* The adaptive controller's ladder of notches and its predictions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/controller.h"

static const uint8_t ladder[LLMT_LADDER_LEVELS] = {
    LLMT_RECOMPUTE_NONE,
    LLMT_RECOMPUTE_FFN_ACT,
    LLMT_RECOMPUTE_FFN_ACT | LLMT_RECOMPUTE_ATTN_CORE,
    LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN,
    LLMT_RECOMPUTE_FULL,
};

/* The lightest ladder level that drops at least what policy drops. */
static int32_t level_of(int32_t policy)
{
    for (int32_t l = 0; l < LLMT_LADDER_LEVELS; l++)
        if ((ladder[l] & policy) == policy || l == LLMT_LADDER_LEVELS - 1)
            return l;
    return LLMT_LADDER_LEVELS - 1;
}

void llmt_controller_init(llmt_controller *c, const llmt_model *m, int32_t batch, int32_t seq,
                          int32_t policy, int32_t micro_batch)
{
    memset(c, 0, sizeof *c);
    c->model = m;
    c->batch = batch;
    c->seq = seq;
    c->layers = (int32_t)m->dims.layers;
    c->base_level = level_of(policy);
    c->base_micro = micro_batch < batch ? micro_batch : batch;
    int64_t halvings = 0;
    for (int32_t b = c->base_micro; b > 1; b = (b + 1) / 2)
        halvings++;
    c->base = (int64_t)c->base_level * c->layers;
    c->max = (int64_t)(LLMT_LADDER_LEVELS - 1) * c->layers + halvings;
    c->notch = c->base;
}

void llmt_controller_notch(const llmt_controller *c, int64_t k, uint8_t *flags, int32_t *micro)
{
    int64_t rc_top = (int64_t)(LLMT_LADDER_LEVELS - 1) * c->layers;
    int64_t level = (k < rc_top ? k : rc_top) / c->layers;
    int64_t extra = k < rc_top ? k % c->layers : 0;
    for (int32_t l = 0; l < c->layers; l++)
        flags[l] = ladder[level + (l < extra ? 1 : 0)];
    int32_t b = c->base_micro;
    for (int64_t h = rc_top; h < k; h++)
        b = (b + 1) / 2;
    *micro = b;
}

int llmt_controller_arena_bytes(const llmt_controller *c, int64_t k, uint64_t *bytes)
{
    uint8_t *flags = malloc((size_t)c->layers);
    if (!flags)
        return llmt_fail(LLMT_ENOMEM, "controller: out of memory");
    int32_t micro = 0;
    llmt_controller_notch(c, k, flags, &micro);
    llmt_layout lay;
    int rc = llmt_layout_compute(&c->model->cfg, flags, micro, c->seq, c->model->dev->num_threads,
                                 c->model->ops, 0, &lay);
    free(flags);
    if (!rc)
        *bytes = (uint64_t)lay.act_bytes + lay.work_bytes;
    return rc;
}

int llmt_controller_apply(llmt_controller *c, int64_t k, llmt_recompute *rc, llmt_slicer *s)
{
    uint8_t *flags = malloc((size_t)c->layers);
    if (!flags)
        return llmt_fail(LLMT_ENOMEM, "controller: out of memory");
    int32_t micro = 0;
    llmt_controller_notch(c, k, flags, &micro);
    int status = LLMT_OK;
    for (int32_t l = 0; l < c->layers && !status; l++)
        status = llmt_recompute_set_layers(rc, l, 1, flags[l]);
    if (!status)
        status = llmt_slicer_set_micro_batch(s, micro);
    free(flags);
    if (!status)
        c->notch = k;
    return status;
}

int llmt_controller_find(const llmt_controller *c, uint64_t other, uint64_t limit, int64_t *k)
{
    for (int64_t n = c->notch + 1; n <= c->max; n++) {
        uint64_t arena = 0;
        int rc = llmt_controller_arena_bytes(c, n, &arena);
        if (rc)
            return rc;
        if (other + arena <= limit) {
            *k = n;
            return LLMT_OK;
        }
    }
    *k = -1;
    return LLMT_OK;
}

void llmt_controller_describe(const llmt_controller *c, int64_t k, char *buf, size_t cap)
{
    uint8_t *flags = malloc((size_t)c->layers);
    int32_t micro = 0;
    if (!flags) {
        snprintf(buf, cap, "notch %lld", (long long)k);
        return;
    }
    llmt_controller_notch(c, k, flags, &micro);
    size_t used = 0;
    buf[0] = '\0';
    for (int32_t l = 0; l < c->layers && used < cap;) {
        int32_t end = l;
        while (end + 1 < c->layers && flags[end + 1] == flags[l])
            end++;
        int n = snprintf(buf + used, cap - used, "%s%s on layers %d-%d", l ? ", " : "recompute ",
                         llmt_recompute_policy_name(flags[l]), l, end);
        used += n > 0 ? (size_t)n : 0;
        l = end + 1;
    }
    if (used < cap)
        snprintf(buf + used, cap - used, "; micro-batch %d", micro);
    free(flags);
}
