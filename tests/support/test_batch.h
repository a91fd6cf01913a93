/* A learnable token stream for training tests. */
#ifndef LLMT_TEST_BATCH_H
#define LLMT_TEST_BATCH_H

#include <stdint.h>

/* Fills a batch x seq window of tokens and its next-token targets: a random
 * walk over `vocab` tokens where each token mostly determines the next (a
 * noisy permutation), so a model can learn it. The same step gives the same
 * batch; steps repeat with period 16. */
void test_learnable_batch(int step, int batch, int seq, int vocab, int32_t *tokens,
                          int32_t *targets);

#endif
