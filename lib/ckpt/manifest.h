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
/* Written by a data-parallel save: the optimizer state in one file per rank
 * (llmt_manifest.shards). */
#define LLMT_MANIFEST_FORMAT_SHARDED 2
#define LLMT_MANIFEST_MAX_FILES 8
/* Bytes per chunk checksum of the shard files a save writes (the last chunk
 * of a file may be shorter). A reader takes the manifest's chunk_bytes: any
 * power of two from 4 KiB to 1 GiB. */
#define LLMT_MANIFEST_CHUNK_BYTES ((uint64_t)16 << 20)
/* Ranks of a sharded save at most (bounds the manifest). */
#define LLMT_MANIFEST_MAX_SHARDS 65536
#define LLMT_MANIFEST_MAX_BYTES (16u << 20)

typedef struct llmt_manifest_file {
    char name[64];
    uint64_t bytes;
    uint64_t xxh3;
} llmt_manifest_file;

/* One rank's optimizer file of a sharded save: elements [first, end) of the
 * flat state, and the XXH3-64 of each LLMT_MANIFEST_CHUNK_BYTES of the file
 * so a reader of part of it checks what it reads. */
typedef struct llmt_manifest_shard {
    llmt_manifest_file file;
    int64_t first, end;
    uint64_t *chunks; /* malloc'ed, ceil(file.bytes / chunk_bytes) */
    size_t n_chunks;
} llmt_manifest_shard;

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
    /* Format 2 only: the world size of the save, the elements of the flat
     * state (the shards' ranges tile [0, num_elements) in rank order), the
     * bytes per chunk checksum and one shard per rank (malloc'ed; owned). */
    int32_t world_size;
    int64_t num_elements;
    uint64_t chunk_bytes;
    llmt_manifest_shard *shards;
    /* Format 2, a fast tier local to each node: this directory is one
     * node's copy, holding the shard files of that node's ranks (and, on
     * rank 0's node, the common files); the other files are on the other
     * nodes. Every node's MANIFEST is the same bytes. */
    int per_node;
    /* Set by llmt_manifest_parse (not written): the trailer's XXH3-64 of
     * the JSON, which tells two manifests apart. */
    uint64_t checksum;
} llmt_manifest;

/* Formats m as MANIFEST bytes (JSON, newline, "xxh3:" 16 hex digits,
 * newline) into a malloc'ed buffer. */
int llmt_manifest_format(const llmt_manifest *m, char **out, size_t *len);

/* Parses MANIFEST bytes: trailer checksum first, then the JSON strictly
 * (every field present with its type, no unknown field). LLMT_ECORRUPT with
 * the reason; on success release with llmt_manifest_clear. */
int llmt_manifest_parse(const char *text, size_t len, llmt_manifest *m);

/* The name of rank's optimizer file in a save of size ranks. */
void llmt_manifest_shard_name(char *buf, size_t cap, int32_t rank, int32_t size);

/* Frees what a parse allocated (config_yaml, shards) and zeroes m. */
void llmt_manifest_clear(llmt_manifest *m);

/* The entry for file name (a shard's included), or NULL. */
const llmt_manifest_file *llmt_manifest_find(const llmt_manifest *m, const char *name);

#endif
