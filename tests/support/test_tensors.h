/* Every tensor of a model (weights, gradients, or an optimizer state kind)
 * as one fp32 array in the model's tensor order; the caller frees it. */
#ifndef LLMT_TEST_TENSORS_H
#define LLMT_TEST_TENSORS_H

#include "llmt/llmt.h"

float *test_all_params(llmt_model *m);
float *test_all_grads(llmt_model *m);
float *test_all_state(llmt_optimizer *o, llmt_model *m, int kind);

#endif
