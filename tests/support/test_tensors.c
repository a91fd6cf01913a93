/* Gathering a model's tensors for whole-model comparisons in tests. */
#include <stdio.h>
#include <stdlib.h>

#include "test_rand.h"
#include "test_tensors.h"

enum { WEIGHTS, GRADS, STATE };

static float *gather(llmt_model *m, llmt_optimizer *o, int what, int kind)
{
    float *out = malloc((size_t)llmt_model_num_params(m) * sizeof *out);
    size_t at = 0;
    for (int32_t i = 0; i < llmt_model_num_tensors(m); i++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        llmt_model_tensor_info(m, i, &info);
        size_t n = (size_t)info.numel;
        int rc = what == WEIGHTS ? llmt_model_get_param(m, info.name, out + at, n)
                 : what == GRADS ? llmt_model_get_grad(m, info.name, out + at, n)
                                 : llmt_optimizer_get_state(o, kind, info.name, out + at, n);
        if (rc != LLMT_OK) {
            fprintf(stderr, "test_tensors: %s: %s\n", info.name, llmt_error_last());
            abort();
        }
        at += n;
    }
    return out;
}

float *test_all_params(llmt_model *m)
{
    return gather(m, NULL, WEIGHTS, 0);
}

float *test_all_grads(llmt_model *m)
{
    return gather(m, NULL, GRADS, 0);
}

float *test_all_state(llmt_optimizer *o, llmt_model *m, int kind)
{
    return gather(m, o, STATE, kind);
}

void test_randomize_params(llmt_model *m, uint64_t seed, double matrix_std)
{
    uint64_t s = seed;
    for (int32_t i = 0; i < llmt_model_num_tensors(m); i++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        llmt_model_tensor_info(m, i, &info);
        float *v = malloc((size_t)info.numel * sizeof *v);
        int norm = info.ndim == 1;
        for (int64_t j = 0; j < info.numel; j++)
            v[j] = (float)(norm ? 1.0 + 0.1 * trand_normal(&s) : matrix_std * trand_normal(&s));
        if (llmt_model_set_param(m, info.name, v, (size_t)info.numel) != LLMT_OK) {
            fprintf(stderr, "test_tensors: %s: %s\n", info.name, llmt_error_last());
            abort();
        }
        free(v);
    }
}
