/* An op profiler for benchmarks and tests: a copy of a context's backend op
 * table whose numeric and copy ops, while recording, synchronize the device,
 * time the call, synchronize again, and add the elapsed time, one call and
 * the call's cost (op_cost.h, from its actual arguments) to its family.
 *
 * It is installed on the context before the model is created: a model keeps
 * the op table it was created with (lib/model/model.c), and so does every
 * optimizer of that model. Ops the profiler does not know (added to
 * llmt_backend_ops later), the non-numeric ones (allocation, scratch
 * sizes, synchronize itself) and attention_kv_fwd (generation only, never
 * called by a training step) pass through untimed; a NULL op stays NULL,
 * so what the library tests for presence is unchanged.
 *
 * One profiler is installed at a time (the wrappers find it through a
 * static pointer); it is used from one thread, like its context. */
#ifndef LLMT_BENCH_OP_PROFILE_H
#define LLMT_BENCH_OP_PROFILE_H

#include "llmt/llmt.h"
#include "op_cost.h"

/* Per family: calls, costs, and the seconds the calls took. */
typedef struct op_profile_family {
    op_cost cost;   /* calls, FLOPs, bytes, roofline of the timed calls */
    double seconds; /* measured, each call between two synchronizations */
} op_profile_family;

typedef struct op_profile {
    llmt_backend_ops table;        /* the context's while installed */
    const llmt_backend_ops *inner; /* the backend's own */
    int recording; /* 1: time and count calls; 0: pass them through */
    op_profile_family family[OP_FAMILY_COUNT];
} op_profile;

/* Installs p on ctx, not recording, counts zeroed. Returns 0, or -1 when
 * an argument is NULL or a profiler is installed already. */
int op_profile_install(op_profile *p, llmt_context *ctx);

/* Gives ctx its backend's table back. Call it after the models and
 * optimizers created while p was installed are freed (they hold p->table). */
void op_profile_uninstall(op_profile *p, llmt_context *ctx);

/* Zeroes every family's counts and times. */
void op_profile_reset(op_profile *p);

#endif
