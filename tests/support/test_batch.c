#include "test_batch.h"

void test_learnable_batch(int step, int batch, int seq, int vocab, int32_t *tokens,
                          int32_t *targets)
{
    uint64_t s = 0x9e3779b97f4a7c15ULL * (uint64_t)(step % 16 + 1);
    for (int b = 0; b < batch; b++) {
        int32_t tok = (int32_t)((s >> 7) % (uint64_t)vocab);
        for (int t = 0; t <= seq; t++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            int32_t next = (s % 8 == 0) ? (int32_t)((s >> 9) % (uint64_t)vocab) : (tok * 5 + 3) % vocab;
            if (t < seq)
                tokens[b * seq + t] = tok;
            if (t > 0)
                targets[b * seq + t - 1] = tok;
            tok = next;
        }
    }
}
