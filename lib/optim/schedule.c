/* Learning-rate schedules: linear warmup, then constant, cosine or linear
 * decay to a floor. */
#include <math.h>

#include "optim/optim_internal.h"

double llmt_schedule_lr(const llmt_optimizer_config *c, int64_t step)
{
    if (c->warmup_steps > 0 && step < c->warmup_steps)
        return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    if (c->schedule == LLMT_SCHEDULE_CONSTANT)
        return c->lr;
    int64_t span = c->total_steps - c->warmup_steps;
    double p = span > 0 ? (double)(step - c->warmup_steps) / (double)span : 1.0;
    p = p < 0.0 ? 0.0 : p > 1.0 ? 1.0 : p;
    double shape = c->schedule == LLMT_SCHEDULE_COSINE ? 0.5 * (1.0 + cos(3.14159265358979323846 * p)) : 1.0 - p;
    return c->min_lr + (c->lr - c->min_lr) * shape;
}
