/* The adaptive memory controller: a ladder of "notches", each a recompute
 * policy per layer and a micro-batch, ordered from lightest to heaviest:
 * first every layer in turn climbs the recompute ladder one level (FFN
 * activation, + attention core, attention core + FFN, full), then the
 * micro-batch halves (ceil) down to 1 with full recompute. The arena bytes
 * of any notch come from the layout function the model allocates with, so
 * predictions are exact. */
#ifndef LLMT_TRAIN_CONTROLLER_H
#define LLMT_TRAIN_CONTROLLER_H

#include <stdint.h>

#include "llmt/recompute.h"
#include "llmt/slicer.h"
#include "model/model_internal.h"

/* Ladder levels of recompute, lightest first. */
#define LLMT_LADDER_LEVELS 5

typedef struct llmt_controller {
    const llmt_model *model;
    int32_t batch, seq, layers;
    int32_t base_level;      /* ladder level the configuration starts at */
    int32_t base_micro;      /* micro-batch the configuration starts at */
    int64_t notch, base, max; /* current, lowest allowed, highest */
} llmt_controller;

/* Sets up the ladder for a model, global batch, sequence length and the
 * configured policy and micro-batch (which become the base notch). */
void llmt_controller_init(llmt_controller *c, const llmt_model *m, int32_t batch, int32_t seq,
                          int32_t policy, int32_t micro_batch);

/* Recompute flags of every layer (layers entries) and the micro-batch of notch k. */
void llmt_controller_notch(const llmt_controller *c, int64_t k, uint8_t *flags, int32_t *micro);

/* Bytes of the activation arena (activations + workspace) of notch k. */
int llmt_controller_arena_bytes(const llmt_controller *c, int64_t k, uint64_t *bytes);

/* Applies notch k to the recompute handle and the slicer. */
int llmt_controller_apply(llmt_controller *c, int64_t k, llmt_recompute *rc, llmt_slicer *s);

/* The smallest notch above the current whose arena, added to `other`
 * bytes, stays within limit; -1 when none. */
int llmt_controller_find(const llmt_controller *c, uint64_t other, uint64_t limit, int64_t *k);

/* Text "ffn_act on layers 0-3, none on 4-7; micro-batch 8" of notch k. */
void llmt_controller_describe(const llmt_controller *c, int64_t k, char *buf, size_t cap);

#endif
