/* The adaptive memory controller: a ladder of "notches", each a recompute
 * policy per layer, an optimizer placement and a micro-batch, ordered from
 * lightest to heaviest: first every layer in turn climbs the recompute
 * ladder one level (FFN activation, + attention core, attention core + FFN,
 * full); then, with full recompute, the optimizer's state of layers [0, k)
 * moves to host memory for k = 1..layers, then all of it (the offload
 * rungs; with the gradients too where the optimizer's owner allows it);
 * then the micro-batch halves (ceil) down to 1. The offload rungs
 * are always numbered (so a checkpoint's notch means the same whatever the
 * optimizer), but they move state only for an optimizer the controller
 * places (llmt_controller_place); for any other they equal full recompute
 * and are passed over. With a host budget, the rungs above the heaviest
 * the host holds (the cap) are passed over the same way: they, and the
 * micro-batch halvings, place the state as the cap does, so a smaller
 * micro-batch comes right after the offload the host can take. The bytes
 * of any notch come from the functions the model, optimizer and slicer
 * allocate with, so predictions are exact; they do not always fall along
 * the ladder (an ordered slicer's sum appears at the first halving).
 *
 * A sharded (ZeRO-1) optimizer is placed too, each rank its own range: a
 * rung's prefix is the same on every rank, its state's split each rank's
 * (llmt_offload_split), so a rung may move no state on a rank whose range
 * lies past it; its gradients' split (when the rungs offload them) is the
 * same on every rank, which holds the whole model's gradients. The ladder,
 * and which rungs are passed over, depend only on whether the optimizer is
 * placed and on the cap, which the ranks agree on (adapt.c: the cap is the
 * least of the ranks'), so every rank has the same ladder; the bytes of a
 * notch are this rank's. */
#ifndef LLMT_TRAIN_CONTROLLER_H
#define LLMT_TRAIN_CONTROLLER_H

#include <stdint.h>

#include "llmt/optimizer.h"
#include "llmt/recompute.h"
#include "llmt/slicer.h"
#include "model/model_internal.h"

/* Ladder levels of recompute, lightest first. */
#define LLMT_LADDER_LEVELS 5

typedef struct llmt_controller {
    const llmt_model *model;
    /* The slicer whose ordered accumulation holds an fp32 sum of every
     * gradient at a notch of several micro-batches, counted in the notch's
     * bytes (llmt_slicer_sum_bytes); NULL where the batch is summed
     * otherwise (data parallel: the sharded optimizer's sum, allocated
     * once). */
    const llmt_slicer *slicer;
    int32_t batch, seq, layers;
    int32_t base_level;      /* ladder level the configuration starts at */
    int32_t base_micro;      /* micro-batch the configuration starts at */
    int64_t notch, base, max; /* current, lowest allowed, highest */
    /* Set by llmt_controller_attach: the optimizer whose state the offload
     * rungs place, or NULL when they do not (placed by its owner, or the
     * ranks of a sharded one disagreed); the parts its offload rungs
     * offload (LLMT_OFFLOAD_OPTIMIZER, or with LLMT_OFFLOAD_GRADS where the
     * owner allowed it, on every rank of a sharded one) and those of the
     * rung without offload (the owner's: NONE, or OPTIMIZER | GRADS of no
     * layer); attached says the decision is made. */
    llmt_optimizer *opt;
    int32_t parts, rest_parts;
    int attached;
    /* The heaviest offload rung in use (1..layers: that many layers'
     * state offloaded with the embedding; layers + 1, the default: all;
     * 0: none): the rungs above it are passed over, and they and the
     * micro-batch halvings place the state as it does. The trainer sets
     * it at every decision from llmt_controller_host_cap (adapt.c). */
    int32_t cap;
} llmt_controller;

/* Sets up the ladder for a model, global batch, sequence length and the
 * configured policy and micro-batch (which become the base notch); slicer
 * as llmt_controller's. */
void llmt_controller_init(llmt_controller *c, const llmt_model *m, const llmt_slicer *slicer,
                          int32_t batch, int32_t seq, int32_t policy, int32_t micro_batch);

/* Recompute flags of every layer (layers entries), the micro-batch and the
 * optimizer offload (0: none; k: layers [0, k); LLMT_OFFLOAD_ALL_LAYERS) of
 * notch k. */
void llmt_controller_notch(const llmt_controller *c, int64_t k, uint8_t *flags, int32_t *micro,
                           int32_t *offload_layers);

/* Device bytes notch k needs that depend on the notch: the activation
 * arena (activations + workspace), the device part of the ordered
 * accumulation's sum at a notch of several micro-batches, plus, for a
 * placed optimizer, its state
 * left on the device (a sharded optimizer's: of this rank's range; and the
 * model's device gradients, when the rungs offload gradients). */
int llmt_controller_bytes(const llmt_controller *c, int64_t k, uint64_t *bytes);

/* Device bytes of the placed optimizer's state now (0 when the controller
 * places none): the share of llmt_controller_bytes that is allocated
 * between steps. */
uint64_t llmt_controller_placed_bytes(const llmt_controller *c);

/* Applies notch k's recompute and micro-batch to the recompute handle and
 * the slicer (the placement is llmt_controller_place's). */
int llmt_controller_apply(llmt_controller *c, int64_t k, llmt_recompute *rc, llmt_slicer *s);

/* Whether the controller may place opt: an optimizer (sharded or not)
 * that starts without offload (its rungs offload the state), or with
 * LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS of 0 layers (the rungs
 * offload state and gradients). *placeable receives 1 or 0. */
int llmt_controller_placeable(const llmt_optimizer *opt, int *placeable);

/* Makes the decision once, before the first llmt_controller_place: the
 * offload rungs place opt when `place` is nonzero (which
 * llmt_controller_placeable must allow), else nothing; they offload its
 * gradients too where its owner allowed it and `grads` is nonzero (without
 * `grads`, the rung without offload is LLMT_OFFLOAD_NONE). A
 * data-parallel run attaches with the ranks' agreed decisions, so that the
 * ladders, and the gradients' placements, are the same. */
int llmt_controller_attach(llmt_controller *c, llmt_optimizer *opt, int place, int grads);

/* Moves the placed optimizer's state (nothing when the controller places
 * none) to notch k's offload (nothing when it is there already);
 * when the new device segment would not fit beside the old one under
 * budget (0: none) with in_use bytes allocated, it moves through the
 * cap's placement (with no cap: everything offloaded, no device bytes),
 * which needs fewer device bytes than the end state. On failure (LLMT_ENOMEM
 * naming the budget or host budget) the placement is as it was, or, should
 * going back fail too, as the message says. */
int llmt_controller_place(llmt_controller *c, int64_t k, uint64_t budget, uint64_t in_use);

/* Whether llmt_controller_place(c, k, ...) moves state: the controller
 * places the optimizer, which is not at notch k's offload. */
int llmt_controller_moves(const llmt_controller *c, int64_t k);

/* The heaviest offload rung (as llmt_controller's cap) whose placement
 * fits the context's host budget beside the host_state bytes in use that
 * are not the placed optimizer's (its state, staging and offloaded
 * gradients, and an ordered slicer's sum, as allocated now); layers + 1
 * without a host budget or a placed optimizer. A rise above the current
 * cap that moves the current notch's state goes no higher than the host
 * holds beside the placement it leaves (the move holds both; the ordered
 * sum, freed before a move, in neither). A placement
 * is held twice while it moves, so an escalation or relaxation between two
 * rungs under the cap may still be refused. */
int32_t llmt_controller_host_cap(const llmt_controller *c);

/* After the cap changed: a current notch on a passed-over offload rung
 * becomes the cap's rung, which has its configuration, so that relaxing
 * from it changes something. */
void llmt_controller_snap(llmt_controller *c);

/* The notch below k that changes something (the offload rungs of an
 * unplaced optimizer, or above the cap, change nothing); k itself when k
 * is the base. */
int64_t llmt_controller_lighter(const llmt_controller *c, int64_t k);

/* The smallest notch above the current whose bytes, added to `other`
 * bytes, stay within limit into *k; -1 when none. Then, with least not
 * NULL, the same walk gives the heaviest of those notches whose bytes are
 * the least of theirs (the offload rungs passed over are skipped) into
 * *least, and its bytes into *least_bytes; *least = -1 when the current
 * notch is the last. Where the bytes never rise along the ladder (no
 * ordered slicer) that is the heaviest notch not passed over. */
int llmt_controller_find(const llmt_controller *c, uint64_t other, uint64_t limit, int64_t *k,
                         int64_t *least, uint64_t *least_bytes);

/* Text "ffn_act on layers 0-3, none on 4-7; micro-batch 8" of notch k, with
 * "; optimizer offloaded: ..." for a placed optimizer's offload rungs. */
void llmt_controller_describe(const llmt_controller *c, int64_t k, char *buf, size_t cap);

#endif
