/* Whole-model helpers for tests: every tensor of a model (weights,
 * gradients, or an optimizer state kind) as one fp32 array in the model's
 * tensor order (the caller frees it), and test-drawn weights. */
#ifndef LLMT_TEST_TENSORS_H
#define LLMT_TEST_TENSORS_H

#include <stdint.h>

#include "llmt/llmt.h"

float *test_all_params(llmt_model *m);
float *test_all_grads(llmt_model *m);
float *test_all_state(llmt_optimizer *o, llmt_model *m, int kind);

/* Replaces every weight with a draw of the test's own generator (seeded):
 * matrices N(0, matrix_std^2), norm weights 1 + N(0, 0.1^2), so that a model
 * is far from linear and its attention far from uniform. */
void test_randomize_params(llmt_model *m, uint64_t seed, double matrix_std);

#endif
