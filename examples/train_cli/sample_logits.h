/* The logits llmt-train's sample draws from: through the KV-cache generator
 * (include/llmt/generate.h) where the backend has cached attention, else by
 * running the window again through llmt_model_logits for every token (the
 * CUDA backend, which has no attention_kv_fwd). Both give the logits that
 * follow the last max_seq_len tokens of the text so far. */
#ifndef LLMT_EXAMPLES_SAMPLE_LOGITS_H
#define LLMT_EXAMPLES_SAMPLE_LOGITS_H

#include <stddef.h>
#include <stdint.h>

#include <llmt/llmt.h>

typedef struct sample_logits {
    llmt_model *model;   /* borrowed */
    llmt_generator *gen; /* NULL: recompute */
    float *rows;         /* recompute: [window, vocab] logits */
    size_t window;       /* the model's max_seq_len */
    size_t vocab;
} sample_logits;

/* Opens s on model m with the generator, or, when the backend has no cached
 * attention (LLMT_EUNSUPPORTED), as sample_logits_open_recompute does. 0, or
 * a library status with its message in llmt_error_last(). */
int sample_logits_open(sample_logits *s, llmt_model *m);

/* Opens s on model m to recompute the window for every token. 0 or a status. */
int sample_logits_open_recompute(sample_logits *s, llmt_model *m);

/* Writes the vocab logits that follow tokens[0..len) (len >= 1; each call's
 * tokens extend the previous call's by one, or start anew) into logits,
 * seeing the last `window` tokens. 0 or a status. */
int sample_logits_next(sample_logits *s, const int32_t *tokens, size_t len, float *logits);

/* Releases what s holds (not the model); a closed or zeroed s is accepted. */
void sample_logits_close(sample_logits *s);

#endif
