/* FLOPs, bytes and roofline time of the backend's ops (lib/ops/ops.h), per
 * call and for one training step of a model, grouped into op families.
 * The one place these formulas live: the op profiler (op_profile.h) costs
 * each call it times with them, bench_gpu_step --roofline prints the step's
 * table from them, and docs/cuda.md's roofline table is that output.
 *
 * FLOPs are model FLOPs as MFU counts them: 2 per multiply-add of a matrix
 * product (GEMMs, the LM head, attention's two products forward and four
 * backward), attention over the full T x T square (PaLM's convention, the
 * one bench_gpu_step's MFU uses); `causal_flops` is the half a causal
 * kernel needs (equal to `flops` outside attention). Element-wise arithmetic
 * (norms, softmax, SwiGLU, AdamW) is not counted: about 0.12% of the 1B
 * step (docs/cuda.md derives it), and never what bounds those ops.
 * Bytes are the least HBM traffic of a call: every input read once and
 * every output written once at its dtype's size (an output accumulated
 * into, beta = 1, is read and written); what an op keeps for backward is
 * what a fused kernel needs (attention: a logsumexp per query row; the LM
 * head: no logits in memory). Host <-> device copies count their bytes once.
 * Roofline time is max(causal FLOPs / peak, bytes / bandwidth) per call at
 * an H200's datasheet figures below. */
#ifndef LLMT_BENCH_OP_COST_H
#define LLMT_BENCH_OP_COST_H

#include <stdint.h>

#include "llmt/model.h"
#include "ops/ops.h"

/* Dense bf16 tensor-core peak of an H100/H200 SXM (NVIDIA's H200 datasheet,
 * "BF16 Tensor Core 1,979 TFLOPS with sparsity": half of it dense). */
#define OP_PEAK_TFLOPS 989.4
/* HBM3e bandwidth of an H200 SXM (NVIDIA's H200 datasheet: 4.8 TB/s). */
#define OP_HBM_TBPS 4.8

/* The families a step's op calls are grouped into. */
typedef enum op_family {
    OP_GEMM_FWD,    /* gemm with B transposed (X W^T): every forward product of the layers */
    OP_GEMM_BWD,    /* the other gemms: data (dY W) and weight (dY^T X) gradients */
    OP_ATTN_FWD,    /* attention_fwd */
    OP_ATTN_BWD,    /* attention_bwd */
    OP_LM_HEAD_CE,  /* lm_head_ce: the LM head forward and backward, cross-entropy */
    OP_RMSNORM,     /* rmsnorm_fwd, rmsnorm_bwd */
    OP_ROPE,        /* rope, both directions */
    OP_SWIGLU,      /* swiglu_fwd, swiglu_bwd */
    OP_EMBEDDING,   /* embedding_fwd, embedding_bwd */
    OP_ELEMENTWISE, /* add, cast, accumulate */
    OP_COPY,        /* copies and mem_zero: residual stream, zeroed gradients, token uploads */
    OP_OPTIMIZER,   /* grad_stats, grad_stats_blocks, adamw */
    OP_FAMILY_COUNT
} op_family;

/* What calls of one family cost, summed. */
typedef struct op_cost {
    int64_t calls;
    double flops;        /* model FLOPs (attention: the full square) */
    double causal_flops; /* attention: the causal half; else = flops */
    double bytes;        /* least HBM traffic */
    double roofline_s;   /* sum over the calls of max(compute, memory) time */
    double compute_s;    /* sum over the calls of causal FLOPs / peak */
} op_cost;

/* Short name of family f ("gemm_fwd", ...), "?" outside the enum. */
const char *op_family_name(int f);

/* One call's cost (calls = 1, roofline_s and compute_s filled). es: the
 * byte size of the call's dtype; accumulate: the output is read too. */
op_cost op_cost_gemm(int64_t m, int64_t n, int64_t k, int accumulate, int64_t es);
op_cost op_cost_attention(const llmt_attn_dims *a, int backward, int64_t es);
op_cost op_cost_lm_head_ce(int64_t m, int64_t d, int64_t vocab, int want_grad, int64_t es);
op_cost op_cost_rmsnorm(int64_t m, int64_t d, int backward, int accumulate, int64_t es);
op_cost op_cost_rope(int64_t m, int64_t seq, int64_t heads, int64_t head_dim, int64_t es);
op_cost op_cost_swiglu(int64_t m, int64_t f, int backward, int64_t es);
op_cost op_cost_embedding(int64_t m, int64_t d, int backward, int64_t es);
/* n elements read from src_es and written at dst_es (cast); add reads y
 * and x and writes y: op_cost_bytes(3 n es). */
op_cost op_cost_cast(int64_t n, int64_t src_es, int64_t dst_es);
/* accumulate: an fp32 sum of n elements read and written, x (es) read. */
op_cost op_cost_accumulate(int64_t n, int64_t es);
/* A call that moves `bytes` and computes nothing (copies, memset, add). */
op_cost op_cost_bytes(double bytes);
/* grad_stats over n gradients. */
op_cost op_cost_grad_stats(int64_t n, int64_t es);
/* AdamW over n parameters: gradient read, moments (state_es) read and
 * written, the fp32 master read and written and the weights written where
 * `master`, else the weights read and written. */
op_cost op_cost_adamw(int64_t n, int64_t es, int master, int64_t state_es);

/* acc += c. */
void op_cost_add(op_cost *acc, op_cost c);

/* The cost per family of one steady training step of model c (zeroed
 * gradients, forward and backward over batch x seq tokens, an AdamW step;
 * no recompute, no offload, no loss scaler, one micro-batch), the calls the
 * library makes for it (lib/model/forward.c, backward.c, grad_buckets.c,
 * lib/optim/optimizer.c). Returns 0, or -1 for a config without positive
 * dimensions or with an unknown precision. */
int op_cost_step(const llmt_model_config *c, int64_t batch, int64_t seq,
                 op_cost out[OP_FAMILY_COUNT]);

#endif
