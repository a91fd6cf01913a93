/* Token sampling as Hugging Face generate does it: temperature, top-k,
 * top-p, then a draw from the softmax of the tokens kept. */
#include <math.h>
#include <stdlib.h>

#include "model/generate_internal.h"

/* qsort's order of candidates: larger logit first, then smaller index, a
 * total order, so every run sorts alike. */
static int by_logit(const void *a, const void *b)
{
    const llmt_gen_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int32_t argmax(const float *logits, int64_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

int32_t llmt_gen_sample(llmt_generator *g, float *logits, float u)
{
    const int64_t V = g->model->dims.vocab;
    const llmt_generator_config *c = &g->cfg;
    if (c->temperature == 0.0f)
        return argmax(logits, V);
    /* The largest logit is subtracted before dividing, so every tempered
     * logit is <= 0 (the largest exactly 0): a tiny temperature sends the
     * others to -inf, which softmax makes 0, never to inf - inf = NaN. */
    const float top = logits[argmax(logits, V)];
    for (int64_t i = 0; i < V; i++)
        logits[i] = (logits[i] - top) / c->temperature;
    llmt_gen_cand *cand = g->cand;
    for (int32_t i = 0; i < V; i++)
        cand[i] = (llmt_gen_cand){logits[i], i};
    qsort(cand, (size_t)V, sizeof *cand, by_logit);
    /* Top-k: every token at least as likely as the k-th. */
    int64_t kept = V;
    if (c->top_k > 0 && c->top_k < V) {
        float kth = cand[c->top_k - 1].logit;
        kept = c->top_k;
        while (kept < V && cand[kept].logit == kth)
            kept++;
    }
    /* Softmax over the kept tokens, in double. */
    double sum = 0.0, mx = cand[0].logit;
    for (int64_t r = 0; r < kept; r++)
        sum += g->prob[r] = exp((double)cand[r].logit - mx);
    for (int64_t r = 0; r < kept; r++)
        g->prob[r] /= sum;
    /* Top-p: HF removes, from the least likely up, the tokens whose
     * cumulative probability stays at or below 1 - top_p, and keeps the most
     * likely one always. */
    if (c->top_p < 1.0f) {
        double cum = 0.0;
        int64_t r = kept - 1;
        while (r > 0 && (cum += g->prob[r]) <= 1.0 - (double)c->top_p)
            r--;
        kept = r + 1;
        sum = 0.0;
        for (r = 0; r < kept; r++)
            sum += g->prob[r];
        for (r = 0; r < kept; r++)
            g->prob[r] /= sum;
    }
    /* The first token, most likely first, whose cumulative probability passes u. */
    double cum = 0.0;
    for (int64_t r = 0; r < kept - 1; r++)
        if ((cum += g->prob[r]) > (double)u)
            return cand[r].index;
    return cand[kept - 1].index;
}
