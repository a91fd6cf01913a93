/* Causal GQA attention through cuDNN's fused SDPA (cuda_attention_cudnn.cu),
 * which cuda_attention.cu tries first for BF16 and F16 and falls back from
 * to its own fp32 kernels. */
#ifndef LLMT_CUDA_ATTENTION_CUDNN_H
#define LLMT_CUDA_ATTENTION_CUDNN_H

#include "cuda_backend.h"

/* Bytes of cuDNN workspace the scratch holds for attention of this shape
 * and dtype (what the fused kernels' deterministic backward needs, from the
 * frontend's formula, plus a margin); 0 where cuDNN is never tried: F32, or
 * a plugin built without the cuDNN frontend. Grows with every argument, so
 * a call's shape never needs more than the planned one. */
size_t llmt_cudnn_attention_workspace(int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim, int dt);

/* Forward on cuDNN: out [batch * seq, heads * head_dim] and lse [batch,
 * heads, seq] (natural-log logsumexp of the scaled scores, the state the
 * fallback kernels keep too). Returns 1 when it ran, 0 when cuDNN declined
 * (not loaded, a shape or dtype it refuses, more workspace than
 * `workspace_bytes`: the caller runs its own kernel; a refusal of a shape is
 * written to stderr once), or a negative LLMT_E* code (a failure to run, or
 * a refusal under LLMT_CUDA_ATTENTION=cudnn), with the message set. */
int llmt_cudnn_attention_fwd(llmt_device *dev, void *out, float *lse, const void *qkv,
                             const llmt_attn_dims *a, int dt, void *workspace,
                             size_t workspace_bytes);

/* Backward on cuDNN (deterministic algorithms only) from forward's out and
 * lse: writes all of dqkv. Returns like llmt_cudnn_attention_fwd. */
int llmt_cudnn_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                             const float *lse, const void *out, const llmt_attn_dims *a, int dt,
                             void *workspace, size_t workspace_bytes);

/* Which attention a backend runs, from LLMT_CUDA_ATTENTION when the backend
 * is opened: unset, empty or "auto" (cuDNN where it accepts, else the
 * kernels), "fallback" (the kernels only) or "cudnn" (BF16 and F16 must run
 * on cuDNN: a refusal is an error; F32 uses the kernels). Another value is
 * LLMT_EINVAL naming the variable. */
enum { LLMT_CUDA_ATTN_AUTO, LLMT_CUDA_ATTN_FALLBACK, LLMT_CUDA_ATTN_CUDNN };
int llmt_cuda_attention_mode(const llmt_plugin_host *host, int *mode);

/* Releases the backend's cuDNN handle and cached graphs (NULL-safe state). */
void llmt_cudnn_attention_release(llmt_device *dev);

#endif
