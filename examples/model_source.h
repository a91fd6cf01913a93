/* The model a tool reads: a checkpoint directory (the newest checkpoint
 * that verifies, or a given step), a Hugging Face directory, or a file that
 * llmt_model_create_from_file takes. Shared by llmt-generate and llmt-eval. */
#ifndef LLMT_EXAMPLES_MODEL_SOURCE_H
#define LLMT_EXAMPLES_MODEL_SOURCE_H

#include <stdint.h>

#include <llmt/llmt.h>

typedef struct model_source {
    const char *checkpoint; /* --checkpoint DIR: a checkpoint store's directory */
    int64_t step;           /* --step N with --checkpoint; -1: the newest that verifies */
    const char *hf;         /* --hf DIR */
    const char *model;      /* --model FILE (or a step-N directory) */
} model_source;

/* Checks that exactly one of checkpoint, hf and model is set, and step only
 * with checkpoint; prints "PROG: ..." and returns -1 otherwise. */
int model_source_check(const char *prog, const model_source *src);

/* Creates the model (in the precision it was saved in) on ctx; on failure
 * prints "PROG: ..." naming the directory or file and returns -1. *what
 * receives a description of what was read ("checkpoint DIR step N", ...)
 * in a buffer of what_cap bytes. */
int model_source_load(const char *prog, const model_source *src, llmt_context *ctx,
                      llmt_model **out, char *what, size_t what_cap);

#endif
