/* A small complete training setup for checkpoint and trainer tests: shards
 * of learnable tokens on disk, and a context, model, optimizer, loss scaler
 * and loader over them, stepped by hand. */
#ifndef LLMT_TEST_TRAIN_FIXTURE_H
#define LLMT_TEST_TRAIN_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "llmt/llmt.h"

enum { FIX_VOCAB = 32, FIX_B = 2, FIX_T = 8 };

typedef struct fixture {
    llmt_context *ctx;
    llmt_model *model;
    llmt_optimizer *opt;
    llmt_loss_scaler *scaler;
    llmt_loader *loader;
    int64_t step;
    int64_t tokens_seen;
} fixture;

/* Writes two shards (uint16) of a learnable token stream into dir as
 * dir/train_000000.bin and dir/train_000001.bin; windows per epoch: 10. */
void fixture_write_shards(const char *dir);

/* Creates the objects for a precision mode (FP16_MIXED gets a dynamic
 * scaler starting at 2^24, so its first steps overflow and are skipped). */
void fixture_open(fixture *f, const char *dir, int precision, int hidden);
void fixture_close(fixture *f);

/* Runs n training steps, writing each step's loss to losses (may be NULL). */
void fixture_train(fixture *f, int n, double *losses);

/* The whole state as bytes, for exact comparison: weights, moments, master
 * weights, scaler state, context random stream, data position, counters.
 * Caller frees. */
unsigned char *fixture_state_bytes(const fixture *f, size_t *len);

/* The llmt_train_state of the fixture's objects. */
llmt_train_state fixture_state(fixture *f);

#endif
