/* The parts of llmt-train (examples/llmt-train.c): its run directory, the
 * default corpus, the text sampler and the final metrics record. */
#ifndef LLMT_TRAIN_CLI_H
#define LLMT_TRAIN_CLI_H

#include <stddef.h>
#include <stdio.h>

#include <llmt/llmt.h>

#define PROG "llmt-train"

/* ---- run_dir.c */

/* Creates dir and its missing parents (mkdir -p). 0, or -1 with a message
 * on stderr naming the directory that could not be made. */
int make_dirs(const char *dir);

/* Takes an exclusive, non-blocking lock on DIR/.llmt-train.lock and writes
 * this process's pid into it. Returns the open descriptor (held, and so the
 * lock, until the process exits), or -1 with a message on stderr; when
 * another process holds the lock, the message names its pid. */
int lock_run_dir(const char *dir);

/* Removes a directory tree (the default fast tier after the final save); a
 * failure other than ENOENT is reported on stderr. */
void remove_tree(const char *dir);

/* Appends {"event": "final_eval", "step": N, "eval_loss": X} to the
 * metrics file path (JSONL, as the trainer writes it); 0 or -1 with a
 * message on stderr. Called after the trainer closed the file. */
int append_final_eval(const char *path, long long step, double loss);

/* ---- checkpoints.c */

/* How many checkpoints (valid or not) the directory dir holds, by the
 * store's own rule (llmt_ckpt_list on a read_only store); a missing or empty
 * dir holds none. 0, or -1 with a message on stderr. */
int count_checkpoints(llmt_context *ctx, const char *dir, size_t *count);

/* For --start-over: opens the store on dir and fast_dir (may be ""), fails
 * when it holds a valid checkpoint (resume it instead), else sets aside
 * the invalid ones (llmt_ckpt_set_aside_invalid) and says so. out names the
 * run directory in messages. 0, or -1 with a message on stderr. */
int set_aside_for_start_over(llmt_context *ctx, const char *out, const char *dir,
                             const char *fast_dir);

/* ---- corpus.c */

/* Tokenizes the default corpus (Debian's licence texts) into DIR/data once;
 * a READY file marks completion. 0 or -1 with a message on stderr. */
int prepare_default_corpus(const char *out);

/* Entropy (nats) of the token frequencies of the shards matching pattern:
 * what a model knowing only byte frequencies would score. NaN if none. */
double unigram_entropy(const char *pattern);

/* ---- sample.c */

/* Continues prompt by n byte tokens sampled at temperature 0.8 from the
 * context's random stream, over the byte tokens the model has (ids below
 * min(vocab_size, LLMT_BYTE_VOCAB)); stops at end-of-text. Writes the
 * bytes, NUL-terminated, into out of cap bytes. 0, or -1 with the library's
 * message in llmt_error_last(). */
int sample_text(llmt_trainer *tr, const char *prompt, int n, char *out, size_t cap);

/* Writes s to f with valid UTF-8 as is and every other byte (control
 * characters C0 and C1, DEL, bytes of invalid or overlong sequences) as \xNN,
 * and a backslash as \\, so a sample cannot drive the terminal. */
void print_escaped(FILE *f, const char *s);

#endif
