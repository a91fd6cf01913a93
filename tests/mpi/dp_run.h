/* What the data-parallel tests under mpiexec share: a shard of learnable
 * tokens, and a small training run, sharded over
 * a communicator or, as the reference, one process whose slicer sums
 * micro-batches in order. */
#ifndef LLMT_TEST_DP_RUN_H
#define LLMT_TEST_DP_RUN_H

#include <stdint.h>

#include "llmt/llmt.h"
#include "mpi_check.h"

enum { VOCAB = 32, B = 12, MICRO = 2, T = 8, STEPS = 20, HALF = 10 };

/* The shape of the next runs: layers (1 leaves ranks of -n 4 owning no
 * parameter), micro-batch rows (B: one micro-batch for all ranks) and
 * whether the LM head is the embedding (0 unless a test sets it). */
extern int32_t layers, micro, tied;

/* The fast tier of the next runs that have a ckpt_dir: rank 0's store gets
 * fast_dir (NULL: none) and the run saves there every fast_every steps. */
extern const char *fast_dir;
extern int64_t fast_every;

/* The backend of the next runs' contexts (an llmt_backend; LLMT_BACKEND_CPU
 * unless a test sets it), and their attention heads and key/value heads
 * (4 and 2 unless set; the hidden size is 32, and the CUDA kernels take
 * heads of 32, 64 or 128 elements: 1 and 1 there). */
extern int32_t backend, heads, kv_heads;

/* The optimizer placement of the next runs' configs (cfg->offload_parts and
 * offload_layers; LLMT_OFFLOAD_NONE unless a test sets it). */
extern int32_t offload_parts, offload_layers;

/* Whether the next runs' trainers are adaptive (with a recompute handle);
 * 0 unless a test sets it. Their memory threshold (1.0 unless set: only a
 * failed allocation escalates), relax window (1 step unless set) and the
 * recompute policy every layer starts at, the controller's base notch
 * (LLMT_RECOMPUTE_NONE unless set). */
extern int adaptive;
extern double adaptive_threshold;
extern int32_t adaptive_relax_window, adaptive_recompute;

/* An NCCL communicator serving every run on the CUDA emulator (one device,
 * work done at launch), or NULL: run_open marks it as taking the device
 * memory of each run's context, as one made on that context would. */
extern llmt_comm *device_comm;


/* The model of the runs: `layers` layers, `heads` and `kv_heads`, in
 * precision. */
void dp_model_config(llmt_model_config *mc, int precision);

/* Writes dir/train_000000.bin: one shard of a learnable token stream. */
void write_shard(const char *dir);

typedef struct run {
    llmt_context *ctx;
    llmt_model *model;
    llmt_optimizer *opt;
    llmt_loss_scaler *scaler;
    llmt_slicer *slicer;
    llmt_recompute *recompute; /* adaptive runs only */
    llmt_loader *loader;
    llmt_ckpt_store *store;
    llmt_trainer *tr;
} run;

/* A run of `layers` layers over dir's shard in precision (fp16_mixed gets a
 * dynamic loss scale from 2^24: its first steps overflow), sharded over comm
 * with reduce (comm NULL: one process with an ordered slicer); with
 * ckpt_dir, rank 0 holds a store there and the run checkpoints every
 * `every` steps (0: never). seed: the context's (the initial weights). */
void run_open(run *r, const char *dir, int precision, llmt_comm *comm, int reduce,
              const char *ckpt_dir, int64_t every, uint64_t seed);
void run_close(run *r);

/* Runs n steps, each step's loss into losses (may be NULL). */
void train(run *r, int n, double *losses);

/* The end P of the prefix [0, P) whose state `off` offloaded layers put in
 * host memory, from the parameters' names (not the library's
 * llmt_offload_prefix): none for 0, else the embedding's and layers
 * 0..off-1's elements, stored first in that order; every element for
 * LLMT_OFFLOAD_ALL_LAYERS. */
int64_t offload_prefix_of(const llmt_model *m, int32_t off);

/* Step i + 1 of an adaptive run, its loss into loss[i]: expects every rank
 * to have the same notch and offload after it, the micro-batch to be MICRO
 * and this rank's peak within budget (0: not checked). */
void adaptive_step_agreed(run *r, int i, uint64_t budget, double *loss);

/* A trainer's log callback: appends the line to the buffer user (a
 * char[8192]). */
void append_log(void *user, const char *line);

#endif
