/* llmt_loss_scaler: the loss scale of mixed precision. The loss is multiplied
 * by the scale before backward so small fp16 gradients do not flush to zero;
 * the optimizer step divides it back out. When a gradient overflows (inf or
 * NaN) the step is skipped, the scale backs off and a counter grows; after
 * growth_interval clean steps in a row the scale grows. A static scaler keeps
 * its scale but still skips overflowing steps. */
#ifndef LLMT_LOSS_SCALER_H
#define LLMT_LOSS_SCALER_H

#include "llmt/common.h"
#include "llmt/context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_loss_scaler llmt_loss_scaler;

#define LLMT_LOSS_SCALER_CONFIG_VERSION 1

typedef struct llmt_loss_scaler_config {
    uint32_t version;        /* LLMT_LOSS_SCALER_CONFIG_VERSION */
    int32_t dynamic;         /* 1 dynamic (default), 0 static */
    double init_scale;       /* 65536 */
    double growth_factor;    /* 2 */
    double backoff_factor;   /* 0.5 */
    int64_t growth_interval; /* 1000 clean steps */
    double min_scale;        /* 1 */
    double max_scale;        /* 2^24 */
} llmt_loss_scaler_config;

#define LLMT_LOSS_SCALER_CONFIG_INIT \
    {LLMT_LOSS_SCALER_CONFIG_VERSION, 1, 65536.0, 2.0, 0.5, 1000, 1.0, 16777216.0}

/* Fills cfg with the defaults of LLMT_LOSS_SCALER_CONFIG_INIT. */
LLMT_API void llmt_loss_scaler_config_init(llmt_loss_scaler_config *cfg);

/* Creates a scaler. Errors: LLMT_EINVAL naming the field (factors must keep
 * growth > 1 > backoff > 0, 0 < min <= init <= max), LLMT_EVERSION. */
LLMT_API int llmt_loss_scaler_create(llmt_loss_scaler **out, const llmt_loss_scaler_config *cfg);

/* Releases a scaler; NULL is accepted. */
LLMT_API void llmt_loss_scaler_free(llmt_loss_scaler *scaler);

/* The scale to multiply the next step's loss by (0 for NULL). */
LLMT_API double llmt_loss_scaler_scale(const llmt_loss_scaler *scaler);

/* Records one step's outcome: found_overflow backs the scale off (dynamic)
 * and counts a skipped step; a clean step counts toward growth. The optimizer
 * step calls this; call it yourself only when driving the scaler by hand. */
LLMT_API int llmt_loss_scaler_update(llmt_loss_scaler *scaler, int32_t found_overflow);

#define LLMT_LOSS_SCALER_STATE_VERSION 1

/* Everything that changes as training goes: with the config, restores the
 * scaler exactly. */
typedef struct llmt_loss_scaler_state {
    uint32_t version;      /* LLMT_LOSS_SCALER_STATE_VERSION */
    double scale;          /* current scale */
    int64_t clean_steps;   /* clean steps since the last change of scale */
    int64_t skipped_steps; /* steps skipped for overflow, in all */
} llmt_loss_scaler_state;

#define LLMT_LOSS_SCALER_STATE_INIT {LLMT_LOSS_SCALER_STATE_VERSION, 0.0, 0, 0}

/* Reads the state into *out (whose version the caller has set). */
LLMT_API int llmt_loss_scaler_get_state(const llmt_loss_scaler *scaler,
                                        llmt_loss_scaler_state *out);

/* Restores a state read by llmt_loss_scaler_get_state. The scale must lie in
 * [min_scale, max_scale] and the counters be >= 0. */
LLMT_API int llmt_loss_scaler_set_state(llmt_loss_scaler *scaler,
                                        const llmt_loss_scaler_state *state);

/* Copies the scaler's configuration into *out. */
LLMT_API int llmt_loss_scaler_get_config(const llmt_loss_scaler *scaler,
                                         llmt_loss_scaler_config *out);

#ifdef __cplusplus
}
#endif

#endif
