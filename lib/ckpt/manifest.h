/* The MANIFEST of a checkpoint: the training state that is not tensors, and
 * every file's size and checksum, as JSON followed by a checksum trailer
 * (docs/checkpoint-format.md). Parsing is pure (no I/O) and strict, so it
 * can be fuzzed. */
#ifndef LLMT_CKPT_MANIFEST_H
#define LLMT_CKPT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "llmt/context.h"
#include "llmt/data.h"
#include "llmt/loss_scaler.h"
#include "llmt/model.h"
#include "llmt/optimizer.h"

#define LLMT_MANIFEST_FORMAT 1
#define LLMT_MANIFEST_MAX_FILES 8
#define LLMT_MANIFEST_MAX_BYTES (16u << 20)

typedef struct llmt_manifest_file {
    char name[64];
    uint64_t bytes;
    uint64_t xxh3;
} llmt_manifest_file;

typedef struct llmt_manifest {
    int64_t format;             /* LLMT_MANIFEST_FORMAT */
    char library_version[32];
    int64_t step, epoch, tokens_seen;
    llmt_model_config model;    /* precision included */
    int has_optimizer;
    llmt_optimizer_config optimizer;
    int64_t optimizer_steps;
    int has_scaler;
    llmt_loss_scaler_config scaler_config;
    llmt_loss_scaler_state scaler;
    llmt_rng_state context_rng;
    int has_loader;
    llmt_loader_state loader;
    char *config_yaml;          /* owned; NULL when absent */
    int n_files;
    llmt_manifest_file files[LLMT_MANIFEST_MAX_FILES];
} llmt_manifest;

/* Formats m as MANIFEST bytes (JSON, newline, "xxh3:" 16 hex digits,
 * newline) into a malloc'ed buffer. */
int llmt_manifest_format(const llmt_manifest *m, char **out, size_t *len);

/* Parses MANIFEST bytes: trailer checksum first, then the JSON strictly
 * (every field present with its type, no unknown field). LLMT_ECORRUPT with
 * the reason; on success release with llmt_manifest_clear. */
int llmt_manifest_parse(const char *text, size_t len, llmt_manifest *m);

/* Frees what a parse allocated (config_yaml) and zeroes m. */
void llmt_manifest_clear(llmt_manifest *m);

/* The entry for file name, or NULL. */
const llmt_manifest_file *llmt_manifest_find(const llmt_manifest *m, const char *name);

#endif
