/* The adaptive controller's ladder of notches, its predictions and the
 * optimizer (and gradient) placement of its offload rungs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "model/grad_place.h"
#include "model/slicer_internal.h"
#include "optim/offload.h"
#include "optim/optim_internal.h"
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

/* The notch with full recompute on every layer and nothing offloaded; the
 * offload rungs are the layers + 1 notches after it. */
static int64_t recompute_top(const llmt_controller *c)
{
    return (int64_t)(LLMT_LADDER_LEVELS - 1) * c->layers;
}

void llmt_controller_init(llmt_controller *c, const llmt_model *m, const llmt_slicer *slicer,
                          int32_t batch, int32_t seq, int32_t policy, int32_t micro_batch)
{
    memset(c, 0, sizeof *c);
    c->model = m;
    c->slicer = slicer;
    c->batch = batch;
    c->seq = seq;
    c->layers = (int32_t)m->dims.layers;
    c->base_level = level_of(policy);
    c->base_micro = micro_batch < batch ? micro_batch : batch;
    int64_t halvings = 0;
    for (int32_t b = c->base_micro; b > 1; b = (b + 1) / 2)
        halvings++;
    c->base = (int64_t)c->base_level * c->layers;
    c->max = recompute_top(c) + c->layers + 1 + halvings;
    c->notch = c->base;
    c->cap = c->layers + 1;
}

/* The offload layers of rung r (0..layers + 1). */
static int32_t rung_layers(const llmt_controller *c, int64_t r)
{
    return r <= c->layers ? (int32_t)r : LLMT_OFFLOAD_ALL_LAYERS;
}

/* The offload rung notch k places at when the cap is `cap`. */
static int64_t placed_rung(const llmt_controller *c, int64_t k, int32_t cap)
{
    int64_t rc_top = recompute_top(c), off_top = rc_top + c->layers + 1;
    int64_t rung = k <= rc_top ? 0 : k < off_top ? k - rc_top : c->layers + 1;
    return rung < cap ? rung : cap;
}

void llmt_controller_notch(const llmt_controller *c, int64_t k, uint8_t *flags, int32_t *micro,
                           int32_t *offload_layers)
{
    int64_t rc_top = recompute_top(c), off_top = rc_top + c->layers + 1;
    int64_t level = (k < rc_top ? k : rc_top) / c->layers;
    int64_t extra = k < rc_top ? k % c->layers : 0;
    for (int32_t l = 0; l < c->layers; l++)
        flags[l] = ladder[level + (l < extra ? 1 : 0)];
    *offload_layers = rung_layers(c, placed_rung(c, k, c->cap));
    int32_t b = c->base_micro;
    for (int64_t h = off_top; h < k; h++)
        b = (b + 1) / 2;
    *micro = b;
}

/* The parts a placed optimizer has at rung offload_layers (0: none). */
static int32_t rung_parts(const llmt_controller *c, int32_t offload_layers)
{
    return offload_layers ? c->parts : c->rest_parts;
}

/* The gradient split at a notch with offload_layers offloaded: the
 * placed optimizer's rung's (0 where its parts keep the gradients on the
 * device), else the model's (placed by the optimizer's owner, which the
 * notches do not move). */
static int64_t notch_grad_split(const llmt_controller *c, int32_t offload_layers)
{
    if (!c->opt)
        return c->model->grad_split;
    return llmt_offload_grad_split_of(c->model, rung_parts(c, offload_layers), offload_layers);
}

/* Device bytes of what the controller places, with offload_layers
 * offloaded: the optimizer's device segment [split, end) of its range (a
 * sharded optimizer's: this rank's; the split is the rung's prefix clamped
 * to it), as the optimizer sizes it, and, when the rungs offload
 * gradients, the model's device gradients (the segment from the gradient
 * split on and one bucket, as the model sizes them). Gradients that never
 * move, a sharded optimizer's gradient sum and exchange buffer, are left
 * out. */
static uint64_t device_state_bytes(const llmt_controller *c, int32_t offload_layers)
{
    const llmt_optimizer *o = c->opt;
    const llmt_model *m = o->model;
    int32_t parts = rung_parts(c, offload_layers);
    int64_t split = llmt_offload_split(o, parts, offload_layers);
    size_t moment = 0, master = 0;
    llmt_optimizer_sizes(m->cfg.precision, o->end - split, &moment, &master);
    uint64_t bytes = 2 * (uint64_t)moment + master;
    if (c->parts & LLMT_OFFLOAD_GRADS) {
        int64_t gs = notch_grad_split(c, offload_layers);
        int64_t elems = m->num_params - gs + llmt_grad_bucket_elems(m, gs, m->ops->host_memory);
        bytes += (uint64_t)elems * llmt_dtype_size(m->dt);
    }
    return bytes;
}

int llmt_controller_bytes(const llmt_controller *c, int64_t k, uint64_t *bytes)
{
    uint8_t *flags = malloc((size_t)c->layers);
    if (!flags)
        return llmt_fail(LLMT_ENOMEM, "controller: out of memory");
    int32_t micro = 0, offload = 0;
    llmt_controller_notch(c, k, flags, &micro, &offload);
    llmt_layout lay;
    int rc = llmt_layout_compute(&c->model->cfg, flags, micro, c->seq, c->model->dev->num_threads,
                                 c->model->ops, 0, &lay);
    free(flags);
    uint64_t sum_device = 0, sum_host = 0;
    if (!rc && c->slicer)
        llmt_slicer_sum_bytes(c->slicer, c->batch, micro, notch_grad_split(c, offload), &sum_device,
                              &sum_host);
    if (!rc)
        *bytes = (uint64_t)lay.act_bytes + lay.work_bytes + sum_device +
                 (c->opt ? device_state_bytes(c, offload) : 0);
    return rc;
}

/* The host gradients [0, gs) a step keeps (llmt_dp_grad_home in data
 * parallel over an engine that sends them from the device bucket): the
 * most of any count of micro-batches a notch may give (1 to the batch; a
 * fast window's share does not grow with the count). */
static int64_t grad_home(const llmt_controller *c, int64_t gs)
{
    const llmt_optimizer *o = c->opt;
    const llmt_model *m = o->model;
    if (!o->comm || !o->comm->alltoallv_add)
        return gs;
    const int64_t kept = llmt_grad_home_elems(m, gs);
    const int from_slots = llmt_grad_bucket_slots(m->ops->host_memory) > 1;
    int64_t most = 0;
    for (int32_t count = 1; count <= c->batch && most < gs; count++) {
        int64_t h = llmt_dp_grad_home(gs, kept, from_slots, o->reduce_mode, count,
                                      llmt_comm_size(o->comm), llmt_comm_rank(o->comm));
        most = h > most ? h : most;
    }
    return most;
}

/* Host bytes of what the controller places with offload_layers
 * offloaded, as the optimizer, the model and the slicer allocate them
 * (HOST_STATE): the optimizer's host segment [first, split) with its
 * staging, and, when the rung offloads gradients, the host gradients
 * (grad_home of [0, gradient split)) and (with_sum) an ordered slicer's
 * sum of them. */
static uint64_t host_state_bytes(const llmt_controller *c, int32_t offload_layers, int with_sum)
{
    const llmt_optimizer *o = c->opt;
    const llmt_model *m = o->model;
    int64_t split = llmt_offload_split(o, rung_parts(c, offload_layers), offload_layers);
    size_t moment = 0, master = 0, w = llmt_dtype_size(m->dt);
    llmt_optimizer_sizes(m->cfg.precision, split - o->first, &moment, &master);
    const int64_t gs = notch_grad_split(c, offload_layers);
    uint64_t bytes = 2 * (uint64_t)moment + master +
                     llmt_offload_staging_bytes(m->ops->host_memory, split - o->first, w) +
                     (uint64_t)grad_home(c, gs) * w;
    /* An ordered slicer's sum keeps the gradients' host segment too at a
     * notch of several micro-batches: counted at every rung, as at the
     * smaller micro-batches that keep the cap's placement (one more than
     * a rung holding the batch whole needs). */
    uint64_t sum_device = 0, sum_host = 0;
    if (c->slicer && with_sum)
        llmt_slicer_sum_bytes(c->slicer, c->batch, 1, gs, &sum_device, &sum_host);
    return bytes + sum_host;
}

/* Host bytes the placed optimizer's state and the model's offloaded
 * gradients hold now, and (with_sum) the ordered sum's host segment. */
static uint64_t held_host_bytes(const llmt_controller *c, int with_sum)
{
    const llmt_optimizer *o = c->opt;
    return (uint64_t)o->hm.bytes + o->hv.bytes + o->hmaster.bytes + o->stage_g.bytes +
           o->stage_w.bytes + o->model->host_grads.bytes +
           (c->slicer && with_sum ? llmt_slicer_sum_host_held(c->slicer) : 0);
}

int32_t llmt_controller_host_cap(const llmt_controller *c)
{
    int32_t cap = c->layers + 1;
    if (!c->opt || !c->opt->model->ctx->host_budget)
        return cap;
    const llmt_context *ctx = c->opt->model->ctx;
    const uint64_t budget = ctx->host_budget, in_use = ctx->current[LLMT_MEM_HOST_STATE];
    const uint64_t held = held_host_bytes(c, 1), other = in_use > held ? in_use - held : 0;
    /* Host bytes never fall as the rungs climb. */
    while (cap > 0 && other + host_state_bytes(c, rung_layers(c, cap), 1) > budget)
        cap--;
    /* A rise that moves the current notch's state (a passed-over rung or a
     * smaller micro-batch, placed as the cap) goes no higher than the host
     * holds beside the placement it leaves: the move holds both (the sum
     * is freed before a move and laid out again after it). */
    const int64_t now = placed_rung(c, c->notch, c->cap);
    const uint64_t leaves = held_host_bytes(c, 0);
    while (cap > c->cap && placed_rung(c, c->notch, cap) != now &&
           other + leaves +
                   host_state_bytes(c, rung_layers(c, placed_rung(c, c->notch, cap)), 0) >
               budget)
        cap--;
    return cap;
}

uint64_t llmt_controller_placed_bytes(const llmt_controller *c)
{
    int32_t parts = 0, layers = 0;
    if (!c->opt || llmt_optimizer_get_offload(c->opt, &parts, &layers))
        return 0;
    return device_state_bytes(c, layers);
}

int llmt_controller_apply(llmt_controller *c, int64_t k, llmt_recompute *rc, llmt_slicer *s)
{
    uint8_t *flags = malloc((size_t)c->layers);
    if (!flags)
        return llmt_fail(LLMT_ENOMEM, "controller: out of memory");
    int32_t micro = 0, offload = 0;
    llmt_controller_notch(c, k, flags, &micro, &offload);
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

/* Fails with rc and the message of the move from the placement (parts,
 * layers) that just failed (llmt_error_last), after trying to go back to
 * it: should that fail too, the message says so, and that the state stays
 * where the failed move left it (the cap's placement) for the next
 * decision to place (sync_placement). */
static int fail_after_going_back(llmt_controller *c, int rc, int32_t parts, int32_t layers)
{
    char first[512];
    snprintf(first, sizeof first, "%s", llmt_error_last());
    if (llmt_optimizer_set_offload(c->opt, parts, layers) == LLMT_OK)
        return llmt_fail(rc, "%s", first);
    return llmt_fail(rc, "%s; going back failed too (%s): the state stays where the move left "
                     "it until the next decision places it", first, llmt_error_last());
}

/* Offloads `to` layers (at least one) from the placement (now,
 * now_layers). With the gradients on the device (now_layers 0) and
 * gradient offload allowed, the optimizer's state moves first, freeing its
 * device bytes before the gradients' move allocates their device segment
 * and bucket; should the second move fail, the first is undone (if it can
 * be). */
static int offload_to(llmt_controller *c, int32_t to, int32_t now, int32_t now_layers)
{
    if (!(c->parts & LLMT_OFFLOAD_GRADS) || now_layers != 0)
        return llmt_optimizer_set_offload(c->opt, c->parts, to);
    LLMT_TRY(llmt_optimizer_set_offload(c->opt, LLMT_OFFLOAD_OPTIMIZER, to));
    int rc = llmt_optimizer_set_offload(c->opt, c->parts, to);
    return rc ? fail_after_going_back(c, rc, now, 0) : LLMT_OK;
}

int llmt_controller_placeable(const llmt_optimizer *opt, int *placeable)
{
    int32_t parts = 0, layers = 0;
    LLMT_TRY(llmt_optimizer_get_offload(opt, &parts, &layers));
    /* An optimizer without offload (its rungs offload the state), or one
     * whose owner allowed gradient offload but offloaded no layer (the
     * rungs offload state and gradients). */
    *placeable = parts == LLMT_OFFLOAD_NONE || ((parts & LLMT_OFFLOAD_GRADS) && layers == 0);
    return LLMT_OK;
}

int llmt_controller_attach(llmt_controller *c, llmt_optimizer *opt, int place, int grads)
{
    int32_t parts = 0, layers = 0;
    LLMT_TRY(llmt_optimizer_get_offload(opt, &parts, &layers));
    c->opt = place ? opt : NULL;
    /* A placeable owner's parts are NONE or OPTIMIZER | GRADS of no layer;
     * without `grads` the rung without offload is NONE on every rank. */
    c->parts = LLMT_OFFLOAD_OPTIMIZER | (grads ? parts & LLMT_OFFLOAD_GRADS : 0);
    c->rest_parts = grads ? parts : LLMT_OFFLOAD_NONE;
    c->attached = 1;
    return LLMT_OK;
}

int llmt_controller_moves(const llmt_controller *c, int64_t k)
{
    int32_t parts = 0, layers = 0;
    if (!c->opt || llmt_optimizer_get_offload(c->opt, &parts, &layers))
        return 0;
    return layers != rung_layers(c, placed_rung(c, k, c->cap));
}

int llmt_controller_place(llmt_controller *c, int64_t k, uint64_t budget, uint64_t in_use)
{
    if (!c->opt)
        return LLMT_OK;
    const int32_t target = rung_layers(c, placed_rung(c, k, c->cap));
    int32_t now = 0, layers = 0;
    LLMT_TRY(llmt_optimizer_get_offload(c->opt, &now, &layers));
    if (layers == target)
        return LLMT_OK;
    /* The move holds the old and the new device segments at once. The
     * targets never pass the cap, so its placement has the fewest device
     * bytes. */
    const int32_t cap_layers = rung_layers(c, c->cap);
    int via_cap = budget && target != cap_layers && in_use + device_state_bytes(c, target) > budget;
    if (via_cap)
        LLMT_TRY(offload_to(c, cap_layers, now, layers));
    /* From the device (not through the cap), offload_to moves the state
     * before the gradients. */
    int rc = via_cap || !target ? llmt_optimizer_set_offload(c->opt, rung_parts(c, target), target)
                                : offload_to(c, target, now, layers);
    if (rc && via_cap) /* back where it was, if that fits; the refusal is the message */
        return fail_after_going_back(c, rc, now, layers);
    return rc;
}

/* Whether notch k is an offload rung that changes nothing: the optimizer
 * is not placed by the controller, or the rung is above the cap. A
 * sharded optimizer's rung under the cap is never passed over, even where
 * it moves nothing of this rank's range: the ranks' ladders must be the
 * same (and every rung moves some rank's state, the ranges covering the
 * whole buffer). */
static int idle_rung(const llmt_controller *c, int64_t k)
{
    int64_t rung = k - recompute_top(c);
    return rung > 0 && rung <= c->layers + 1 && (!c->opt || rung > c->cap);
}

void llmt_controller_snap(llmt_controller *c)
{
    if (idle_rung(c, c->notch))
        c->notch = recompute_top(c) + (c->opt ? c->cap : 0);
}

int64_t llmt_controller_lighter(const llmt_controller *c, int64_t k)
{
    if (k <= c->base)
        return k;
    int64_t n = k - 1;
    while (n > c->base && idle_rung(c, n)) /* the base is never an offload rung */
        n--;
    return n;
}

int llmt_controller_find(const llmt_controller *c, uint64_t other, uint64_t limit, int64_t *k,
                         int64_t *least, uint64_t *least_bytes)
{
    *k = -1;
    int64_t lowest = -1;
    uint64_t lowest_bytes = UINT64_MAX;
    for (int64_t n = c->notch + 1; n <= c->max; n++) {
        if (idle_rung(c, n))
            continue;
        uint64_t bytes = 0;
        LLMT_TRY(llmt_controller_bytes(c, n, &bytes));
        if (other + bytes <= limit) {
            *k = n;
            return LLMT_OK;
        }
        if (bytes <= lowest_bytes) {
            lowest = n;
            lowest_bytes = bytes;
        }
    }
    if (least) {
        *least = lowest;
        *least_bytes = lowest_bytes;
    }
    return LLMT_OK;
}

void llmt_controller_describe(const llmt_controller *c, int64_t k, char *buf, size_t cap)
{
    uint8_t *flags = malloc((size_t)c->layers);
    int32_t micro = 0, offload = 0;
    if (!flags) {
        snprintf(buf, cap, "notch %lld", (long long)k);
        return;
    }
    llmt_controller_notch(c, k, flags, &micro, &offload);
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
    int n = 0;
    const char *what = c->parts & LLMT_OFFLOAD_GRADS ? "optimizer state and gradients"
                                                      : "optimizer state";
    if (used < cap && c->opt && offload == LLMT_OFFLOAD_ALL_LAYERS)
        n = snprintf(buf + used, cap - used, "; %s offloaded: all", what);
    else if (used < cap && c->opt && offload > 0)
        n = snprintf(buf + used, cap - used, "; %s offloaded: embedding and layers 0-%d", what,
                     offload - 1);
    used += n > 0 ? (size_t)n : 0;
    if (used < cap)
        snprintf(buf + used, cap - used, "; micro-batch %d", micro);
    free(flags);
}
