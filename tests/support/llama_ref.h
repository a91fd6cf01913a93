/* An independent double-precision reference of the LLaMA forward pass and
 * loss, written straight from the Hugging Face LlamaForCausalLM definition,
 * for checking the library's forward values and gradients. */
#ifndef LLMT_TEST_LLAMA_REF_H
#define LLMT_TEST_LLAMA_REF_H

#include <stdint.h>

#include "llmt/llmt.h"

/* The weights of a model as double arrays, one per named tensor, in the
 * model's tensor order (so index i matches llmt_model_tensor_info(i)). */
typedef struct ref_weights {
    int32_t count;
    char **names;
    double **data;
    int64_t *numel;
    llmt_model_config cfg;
} ref_weights;

/* Copies every parameter of a model into a ref_weights. */
int ref_weights_from_model(llmt_model *m, ref_weights *out);
void ref_weights_free(ref_weights *w);

/* The tensor named name (abort if absent). */
double *ref_tensor(const ref_weights *w, const char *name);

/* Logits [batch * seq, vocab] (when logits != NULL) and the mean
 * cross-entropy over targets != -1 (the return value). */
double ref_forward(const ref_weights *w, const int32_t *tokens, const int32_t *targets,
                   int batch, int seq, double *logits);

#endif
