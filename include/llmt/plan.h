/* llmt_plan: what a configuration needs per memory category, computed
 * without allocating anything, by the very functions the model, optimizer
 * and ops use to size their buffers, so a plan equals the context's measured
 * peak after a training step to the byte (docs/memory.md). */
#ifndef LLMT_PLAN_H
#define LLMT_PLAN_H

#include "llmt/common.h"
#include "llmt/context.h"
#include "llmt/model.h"
#include "llmt/optimizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 appended the data-parallel fields (world_size ... ordered_accumulation),
 * version 3 the offload fields, version 4 host_budget, version 5 reduce_mode; older
 * structs, which
 * end before them, are still accepted (only their bytes are read) and plan
 * a single process without offload and fit without a host budget. */
#define LLMT_PLAN_CONFIG_VERSION 5

/* The most ranks a plan takes (llmt-plan --world's bound). */
#define LLMT_PLAN_MAX_WORLD 65536

typedef struct llmt_plan_config {
    uint32_t version;          /* LLMT_PLAN_CONFIG_VERSION */
    llmt_model_config model;   /* architecture and precision */
    int32_t recompute;         /* llmt_recompute_policy flags for every layer */
    const int32_t *layer_recompute; /* or per layer (num_layers entries); NULL: recompute */
    int32_t micro_batch;       /* sequences per forward/backward */
    int32_t seq_len;           /* tokens per sequence */
    int32_t with_optimizer;    /* 1: include AdamW's state (default 1) */
    /* version 2: */
    int32_t world_size;        /* 0: no communicator (default); N in 1..LLMT_PLAN_MAX_WORLD:
                                  one rank of N with llmt_optimizer_create_sharded (ZeRO-1;
                                  needs with_optimizer = 1) */
    int32_t rank;              /* -1: the rank with the largest peak (default); else 0..N-1 */
    int32_t batch_size;        /* the global batch, >= micro_batch; 0: micro_batch (default) */
    int32_t ordered_accumulation; /* 1: a slicer in LLMT_ACCUMULATE_ORDERED (an fp32
                                     gradient sum, 4 bytes a parameter, when batch_size >
                                     micro_batch, split as the gradients are: the
                                     offloaded ones' part in HOST_STATE); counted only
                                     with world_size 0 */
    /* version 3: the optimizer's placement (llmt_optimizer_set_offload); needs
       with_optimizer = 1 unless offload_parts is NONE */
    int32_t offload_parts;     /* llmt_offload_part: LLMT_OFFLOAD_NONE (default),
                                  LLMT_OFFLOAD_OPTIMIZER, or that | LLMT_OFFLOAD_GRADS */
    int32_t offload_layers;    /* LLMT_OFFLOAD_ALL_LAYERS (default) or 0..num_layers */
    /* version 4: */
    uint64_t host_budget;      /* the llmt_plan_fit* functions' limit on host_peak
                                  (the context's host budget); 0: none (default).
                                  llmt_plan_compute does not read it */
    /* version 5: */
    int32_t reduce_mode;       /* with world_size: the trainer's llmt_reduce_mode
                                  (LLMT_REDUCE_DETERMINISTIC, the default, or
                                  LLMT_REDUCE_FAST); decides which offloaded gradients a
                                  rank keeps in host memory on CUDA */
} llmt_plan_config;

#define LLMT_PLAN_CONFIG_INIT                                                            \
    {LLMT_PLAN_CONFIG_VERSION, LLMT_MODEL_CONFIG_INIT, 0, 0, 1, 256, 1, 0, -1, 0, 0,    \
     LLMT_OFFLOAD_NONE, LLMT_OFFLOAD_ALL_LAYERS, 0, LLMT_REDUCE_DETERMINISTIC}

/* Fills cfg with the defaults of LLMT_PLAN_CONFIG_INIT. */
LLMT_API void llmt_plan_config_init(llmt_plan_config *cfg);

/* Version 2 appended rank, shard_first and shard_end, version 3 host_peak;
 * an older out gets only the fields it has. */
#define LLMT_PLAN_VERSION 3

typedef struct llmt_plan {
    uint32_t version;                        /* set by the caller: LLMT_PLAN_VERSION */
    uint64_t bytes[LLMT_MEM_CATEGORY_SLOTS]; /* per llmt_mem_category (per rank) */
    uint64_t peak;                           /* all device-side categories at once
                                                (every one but host_state) */
    int64_t num_params;
    /* version 2: */
    int32_t rank;                            /* the rank planned; -1 without world_size */
    int64_t shard_first, shard_end;          /* its optimizer's range of the flat
                                                parameters ([0, num_params) unsharded) */
    /* version 3: */
    uint64_t host_peak;                      /* bytes[LLMT_MEM_HOST_STATE]: the offloaded
                                                state, its staging and the offloaded
                                                gradients, all held at once */
} llmt_plan;

#define LLMT_PLAN_INIT {LLMT_PLAN_VERSION, {0}, 0, 0, -1, 0, 0, 0}

/* Plans cfg for the backend and thread count of ctx. With cfg->world_size
 * N >= 1 the plan is one rank's: the model as without, plus the sharded
 * optimizer's moments and master weights for the rank's range, its
 * gradient sum (GRADIENTS, fp32 in every mode) and exchange buffer
 * (WORKSPACE). With
 * cfg->offload_parts = LLMT_OFFLOAD_OPTIMIZER the state of the prefix chosen
 * by cfg->offload_layers is in HOST_STATE (with, on a backend whose memory
 * the host cannot read, two transfer staging buffers) and only the rest in
 * OPTIMIZER (with world_size, the part of the rank's range inside the
 * prefix); with LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS the gradients
 * of that prefix, up to its last whole 4096-element granule, are in
 * HOST_STATE too and GRADS holds the rest and one device bucket (the
 * largest offloaded layer, embedding or tail). out->host_peak is the
 * HOST_STATE bytes. With world_size, every rank offloads the gradients of
 * the whole prefix (each holds the whole model's gradients), and on a
 * backend whose memory the host cannot read (CUDA, over NCCL) a rank that
 * adds no two micro-batches before an exchange (cfg->reduce_mode
 * deterministic, or fast with at most one micro-batch of the global batch
 * a rank) sends them from the device bucket and keeps no host copy of them
 * but a tied embedding's (this plans llmt-train's step; a sharded
 * llmt_optimizer_step after llmt_model_forward_backward stores the whole
 * prefix in host memory at its first use). Errors:
 * LLMT_EINVAL naming the field, LLMT_EVERSION, LLMT_EUNSUPPORTED for
 * gradient offload on a backend without the per-granule gradient norm. */
LLMT_API int llmt_plan_compute(const llmt_context *ctx, const llmt_plan_config *cfg,
                               llmt_plan *out);

/* Plans cfg, as llmt_plan_compute would with a context of backend
 * (LLMT_BACKEND_CPU or LLMT_BACKEND_CUDA) and num_threads (1..1024), but
 * without one: nothing is allocated and no device is opened. A CUDA plan
 * loads the CUDA plugin for its sizes, so it needs the plugin and its
 * libraries but neither a GPU nor a driver. Errors: LLMT_EINVAL naming the
 * argument or field, LLMT_EVERSION, LLMT_EUNSUPPORTED when the CUDA plugin
 * cannot be loaded (naming the file and why) or this build has none. */
LLMT_API int llmt_plan_compute_backend(int32_t backend, int32_t num_threads,
                                       const llmt_plan_config *cfg, llmt_plan *out);

/* The largest micro-batch (cfg->micro_batch, then halving: ceil(b / 2) down
 * to 1) and for it the lightest recompute policy (none, ffn_act,
 * ffn_act+attn_core, attn_core+ffn, full) whose plan fits budget bytes
 * (its peak) and, when cfg->host_budget is not 0, whose host_peak fits
 * cfg->host_budget.
 * The global batch stays cfg->batch_size (cfg->micro_batch when 0) while
 * the micro-batch halves; with world_size the budgets are per rank
 * (cfg->rank's, or with rank -1 the largest peak of any rank and the most
 * host bytes of any rank: the rank holding the least offloaded state has
 * the largest peak). cfg's offload placement is kept as
 * it is. LLMT_ENOMEM, with a message giving the smallest plan's peak, when
 * even micro-batch 1 with full recompute does not fit. */
LLMT_API int llmt_plan_fit(const llmt_context *ctx, const llmt_plan_config *cfg, uint64_t budget,
                           int32_t *micro_batch, int32_t *recompute);

/* llmt_plan_fit for a backend and thread count, without a context (as
 * llmt_plan_compute_backend, with its errors). The fit is for
 * cfg->model.precision: to search precisions too, call it for each. */
LLMT_API int llmt_plan_fit_backend(int32_t backend, int32_t num_threads,
                                   const llmt_plan_config *cfg, uint64_t budget,
                                   int32_t *micro_batch, int32_t *recompute);

/* llmt_plan_fit with offload on its ladder when cfg->offload_parts allows
 * it (with LLMT_OFFLOAD_NONE it is llmt_plan_fit and *offload_layers is 0).
 * At each micro-batch (cfg->micro_batch, then halving) the lightest fitting
 * rung of: the recompute ladder without offload, then full recompute with
 * the cfg->offload_parts (the optimizer's state, and with
 * LLMT_OFFLOAD_GRADS the gradients too) of layers [0, k) offloaded for
 * k = 1, 2, ..., num_layers, then LLMT_OFFLOAD_ALL_LAYERS (everything).
 * Writes the micro-batch, the recompute policy and the layers to offload
 * (0 for none; pass it to llmt_optimizer_set_offload with
 * cfg->offload_parts). cfg->offload_layers is not read. The budget is
 * device bytes (the plan's peak); with cfg->host_budget the rungs whose
 * host_peak exceeds it are passed over, so the fit offloads the layers the
 * host can hold and halves the micro-batch when that is not enough (the
 * halved micro-batch climbing the same rungs). Errors as
 * llmt_plan_fit, and LLMT_ENOMEM giving the smallest plan (micro-batch 1,
 * full recompute, all offloaded) and the budgets. */
LLMT_API int llmt_plan_fit_offload(const llmt_context *ctx, const llmt_plan_config *cfg,
                                   uint64_t budget, int32_t *micro_batch, int32_t *recompute,
                                   int32_t *offload_layers);

/* llmt_plan_fit_offload for a backend and thread count, without a context
 * (as llmt_plan_compute_backend, with its errors). */
LLMT_API int llmt_plan_fit_offload_backend(int32_t backend, int32_t num_threads,
                                           const llmt_plan_config *cfg, uint64_t budget,
                                           int32_t *micro_batch, int32_t *recompute,
                                           int32_t *offload_layers);

#ifdef __cplusplus
}
#endif

#endif
