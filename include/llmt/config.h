/* llmt_train_config: everything a training run is configured by, and its
 * YAML form (docs/config.md has every key with its default and range).
 *
 * A YAML file sets any subset of the keys over the defaults of
 * llmt_train_config_init; unknown keys, wrong types and out-of-range values
 * are errors naming the key, the line and the column. The effective
 * configuration can be written back as YAML (checkpoints store it). */
#ifndef LLMT_CONFIG_H
#define LLMT_CONFIG_H

#include "llmt/common.h"
#include "llmt/loss_scaler.h"
#include "llmt/model.h"
#include "llmt/optimizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Room for a path or glob in the configuration, terminating NUL included. */
#define LLMT_CONFIG_PATH_MAX 1024

#define LLMT_TRAIN_CONFIG_VERSION 4

typedef struct llmt_train_config {
    uint32_t version; /* LLMT_TRAIN_CONFIG_VERSION */

    llmt_model_config model;           /* model: ... and precision */
    llmt_optimizer_config optimizer;   /* optimizer: and schedule: */
    llmt_loss_scaler_config loss_scale; /* loss_scale: */
    int32_t recompute;                 /* llmt_recompute_policy flags for every layer */

    /* batch: */
    int32_t batch_size;  /* sequences per optimizer step (the global batch) */
    int32_t micro_batch; /* sequences per forward/backward */
    int32_t seq_len;     /* tokens per sequence */

    /* data: */
    char train_data[LLMT_CONFIG_PATH_MAX]; /* glob of training shards */
    char val_data[LLMT_CONFIG_PATH_MAX];   /* glob of held-out shards; "" none */
    int32_t shuffle;

    /* train: */
    int64_t steps;         /* optimizer steps of the run */
    int64_t eval_every;    /* steps between evaluations; 0 never */
    int32_t eval_batches;  /* held-out batches per evaluation */
    int64_t log_every;     /* steps between progress lines */
    char metrics[LLMT_CONFIG_PATH_MAX]; /* JSONL metrics file; "" none */
    uint64_t seed;
    int32_t threads;       /* 0: all cores */
    int32_t backend;       /* llmt_backend */
    int32_t device;

    /* checkpoint: */
    char checkpoint_dir[LLMT_CONFIG_PATH_MAX]; /* durable tier; "" none */
    int64_t checkpoint_every;
    int32_t checkpoint_keep;
    int32_t checkpoint_async;
    char fast_checkpoint_dir[LLMT_CONFIG_PATH_MAX]; /* tmpfs tier; "" none */
    int64_t fast_checkpoint_every;
    int32_t fast_checkpoint_keep;

    /* memory: */
    uint64_t memory_budget;  /* bytes; 0 none */
    double memory_threshold; /* fraction of capacity where the controller acts */
    int32_t adaptive;        /* 1: adapt recompute and micro-batch to memory */
    /* version 2 */
    int32_t dist_reduce;     /* dist.reduce: llmt_reduce_mode of a data-parallel run */
    int32_t accumulation;    /* batch.accumulation: llmt_accumulation of one process */
    /* version 4 */
    uint64_t memory_host_budget; /* memory.host_budget: the context's host budget
                                    (llmt_context_set_host_budget), bytes; 0 none */
} llmt_train_config;

/* Fills cfg with the defaults (docs/config.md). */
LLMT_API void llmt_train_config_init(llmt_train_config *cfg);

/* Parses YAML text over cfg (which the caller initialised): only the keys
 * present change. `source` names the text in messages ("run.yaml"). The
 * text is one YAML document nested at most 32 deep: a second document
 * ('---' mid-file) or deeper nesting is refused. Errors: LLMT_EINVAL naming
 * source:line:column and the key. On error cfg may be partly changed. */
LLMT_API int llmt_train_config_parse_yaml(llmt_train_config *cfg, const char *text, size_t len,
                                          const char *source);

/* Sets one key of cfg from its text, as a YAML file would: key is the
 * dotted name of docs/config.md ("optimizer.lr", "batch.batch_size",
 * "precision"), value the plain text of the value ("3e-4", "true", a path;
 * no YAML quoting). The value is checked exactly as the YAML loader checks
 * it. Errors: LLMT_EINVAL naming the key and the value (unknown key, wrong
 * type, out of range), LLMT_EVERSION; cfg is unchanged then. */
LLMT_API int llmt_train_config_set(llmt_train_config *cfg, const char *key, const char *value);

/* Reads and parses a YAML file over cfg. Errors as parse, and LLMT_EIO
 * (unreadable; a FIFO, directory or device, refused without blocking). */
LLMT_API int llmt_train_config_load_yaml(llmt_train_config *cfg, const char *path);

/* Checks the relations between fields (micro_batch <= batch_size, seq_len
 * within the model, ...), naming the keys. */
LLMT_API int llmt_train_config_check(const llmt_train_config *cfg);

/* Writes cfg as YAML with every key into a caller buffer of cap bytes
 * (NUL-terminated); *needed (may be NULL) receives the size needed, NUL
 * included. cap 0 asks for the size only. LLMT_EINVAL when cap is too small
 * (nothing is written then). */
LLMT_API int llmt_train_config_to_yaml(const llmt_train_config *cfg, char *out, size_t cap,
                                       size_t *needed);

#ifdef __cplusplus
}
#endif

#endif
