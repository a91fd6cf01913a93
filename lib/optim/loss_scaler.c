/* llmt_loss_scaler: dynamic or static loss scale with overflow backoff. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "llmt/loss_scaler.h"
#include "optim/optim_internal.h"

struct llmt_loss_scaler {
    llmt_loss_scaler_config cfg;
    llmt_loss_scaler_state state;
};

void llmt_loss_scaler_config_init(llmt_loss_scaler_config *cfg)
{
    if (cfg) {
        const llmt_loss_scaler_config defaults = LLMT_LOSS_SCALER_CONFIG_INIT;
        *cfg = defaults;
    }
}

int llmt_loss_scaler_config_check(const llmt_loss_scaler_config *c, const char *fn)
{
    if (c->version != LLMT_LOSS_SCALER_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows %u", fn,
                         c->version, LLMT_LOSS_SCALER_CONFIG_VERSION);
    if (c->dynamic != 0 && c->dynamic != 1)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->dynamic = %d (must be 0 or 1)", fn, c->dynamic);
    if (!(c->min_scale > 0 && c->min_scale <= c->max_scale && isfinite(c->max_scale)))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->min_scale = %g, cfg->max_scale = %g (need "
                         "0 < min <= max, finite)", fn, c->min_scale, c->max_scale);
    if (!(c->init_scale >= c->min_scale && c->init_scale <= c->max_scale))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->init_scale = %g is outside [%g, %g]", fn,
                         c->init_scale, c->min_scale, c->max_scale);
    if (!(c->growth_factor > 1 && c->growth_factor <= 1e6))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->growth_factor = %g (must be in (1, 1e6])", fn,
                         c->growth_factor);
    if (!(c->backoff_factor > 0 && c->backoff_factor < 1))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->backoff_factor = %g (must be in (0, 1))", fn,
                         c->backoff_factor);
    if (c->growth_interval < 1)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->growth_interval = %lld (must be >= 1)", fn,
                         (long long)c->growth_interval);
    return LLMT_OK;
}

int llmt_loss_scaler_create(llmt_loss_scaler **out, const llmt_loss_scaler_config *cfg)
{
    if (!out || !cfg)
        return llmt_fail(LLMT_EINVAL, "llmt_loss_scaler_create: %s is NULL", out ? "cfg" : "out");
    *out = NULL;
    int rc = llmt_loss_scaler_config_check(cfg, "llmt_loss_scaler_create");
    if (rc)
        return rc;
    llmt_loss_scaler *s = calloc(1, sizeof *s);
    if (!s)
        return llmt_fail(LLMT_ENOMEM, "llmt_loss_scaler_create: out of host memory");
    s->cfg = *cfg;
    s->state.version = LLMT_LOSS_SCALER_STATE_VERSION;
    s->state.scale = cfg->init_scale;
    *out = s;
    return LLMT_OK;
}

void llmt_loss_scaler_free(llmt_loss_scaler *s)
{
    free(s);
}

double llmt_loss_scaler_scale(const llmt_loss_scaler *s)
{
    return s ? s->state.scale : 0.0;
}

int llmt_loss_scaler_update(llmt_loss_scaler *s, int32_t found_overflow)
{
    if (!s)
        return llmt_fail(LLMT_EINVAL, "llmt_loss_scaler_update: scaler is NULL");
    llmt_loss_scaler_state *st = &s->state;
    if (found_overflow) {
        st->skipped_steps++;
        st->clean_steps = 0;
        if (s->cfg.dynamic)
            st->scale = fmax(s->cfg.min_scale, st->scale * s->cfg.backoff_factor);
    } else if (s->cfg.dynamic && ++st->clean_steps >= s->cfg.growth_interval) {
        st->scale = fmin(s->cfg.max_scale, st->scale * s->cfg.growth_factor);
        st->clean_steps = 0;
    }
    return LLMT_OK;
}

int llmt_loss_scaler_get_state(const llmt_loss_scaler *s, llmt_loss_scaler_state *out)
{
    if (!s || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_loss_scaler_get_state: %s is NULL", s ? "out" : "scaler");
    if (out->version != LLMT_LOSS_SCALER_STATE_VERSION)
        return llmt_fail(LLMT_EVERSION, "llmt_loss_scaler_get_state: out->version = %u, this "
                         "library knows %u", out->version, LLMT_LOSS_SCALER_STATE_VERSION);
    *out = s->state;
    return LLMT_OK;
}

int llmt_loss_scaler_set_state(llmt_loss_scaler *s, const llmt_loss_scaler_state *state)
{
    const char *fn = "llmt_loss_scaler_set_state";
    if (!s || !state)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, s ? "state" : "scaler");
    if (state->version != LLMT_LOSS_SCALER_STATE_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: state->version = %u, this library knows %u", fn,
                         state->version, LLMT_LOSS_SCALER_STATE_VERSION);
    if (!(state->scale >= s->cfg.min_scale && state->scale <= s->cfg.max_scale))
        return llmt_fail(LLMT_EINVAL, "%s: state->scale = %g is outside [%g, %g]", fn,
                         state->scale, s->cfg.min_scale, s->cfg.max_scale);
    if (state->clean_steps < 0 || state->skipped_steps < 0)
        return llmt_fail(LLMT_EINVAL, "%s: negative counters (%lld clean, %lld skipped)", fn,
                         (long long)state->clean_steps, (long long)state->skipped_steps);
    s->state = *state;
    return LLMT_OK;
}

int llmt_loss_scaler_get_config(const llmt_loss_scaler *s, llmt_loss_scaler_config *out)
{
    if (!s || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_loss_scaler_get_config: %s is NULL", s ? "out" : "scaler");
    *out = s->cfg;
    return LLMT_OK;
}
