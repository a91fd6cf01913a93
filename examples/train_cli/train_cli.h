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

/* For a failed or stopped start: removes dir, the default fast tier this
 * run created, when it holds nothing but the store's lock file (llmt.lock,
 * include/llmt/checkpoint.h) and no process holds that lock. The lock is
 * taken, the file unlinked while it is held, then the directory removed, so
 * another store opening dir meanwhile either fails to lock the old file or
 * creates a new one, which makes the removal fail harmlessly. (A store
 * that opened the old file just before the unlink and locks it just after
 * would hold a lock on a removed file: called while --out's lock is held,
 * and the default fast tier is named after --out, so no other llmt-train
 * opens it meanwhile.) Reports nothing: whatever is not removed is simply
 * left. */
void remove_fast_dir_if_unused(const char *dir);

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

/* ---- launch.c */

/* How long a failed rank waits for the others by default (--fail-wait). */
#define LAUNCH_FAIL_WAIT_S 30

/* How this process was started: alone, or as one rank of a multi-process
 * launch (mpirun/mpiexec, srun, a torchrun-style environment). */
typedef struct launch {
    int world;       /* ranks in the run; 1 for a single process */
    int rank;        /* this process, in [0, world) */
    int local_rank;  /* among the ranks on this node; -1 while unknown */
    const char *how; /* the launch, for messages ("Open MPI OMPI_COMM_WORLD_SIZE=2, ...") */
    char vars[160];  /* what how points to, when launched */
    llmt_comm *comm; /* the library's communicator; NULL for a single process */
    void *adapter;   /* the llmt_comm_mpi that comm lives in, when MPI runs */
    int mpi_started; /* MPI_Init was called: launch_end finalizes */
    int fail_wait_s; /* launch_max_bounded's wait (--fail-wait); LAUNCH_FAIL_WAIT_S */
} launch;

/* Reads the launch from the environment: Open MPI's OMPI_COMM_WORLD_*,
 * MPICH's PMI_*, Slurm's SLURM_*, or WORLD_SIZE/RANK/LOCAL_RANK, the first
 * whose size variable is set. Starts nothing. 0, or 2 with a message on
 * stderr naming a variable that is not a whole number in range. */
int launch_detect(launch *l);

/* For a launch of more than one rank: initialises MPI, checks that its
 * size and rank are the environment's (a torchrun-style environment without
 * an MPI launch is refused, saying how to launch), fills l->comm through
 * llmt/comm_mpi.h and l->local_rank, tags every later stderr line with
 * "rank N: " and sends stdout of ranks other than 0 to /dev/null. A single
 * process: nothing. 0; 2 for a launch that cannot work (no MPI in this
 * build, or MPI and the environment disagree); 1 when MPI fails; each with
 * a message on stderr. Call launch_end afterwards whatever it returned. */
int launch_start(launch *l, int *argc, char ***argv);

/* For --data-parallel in a world of one: initialises MPI (under `mpiexec
 * -n 1` or as a singleton) and fills l->comm, a communicator of one rank,
 * as launch_start does for more. Nothing when l->comm is already there.
 * 0; 2 without MPI in this build or when MPI says more ranks than the
 * environment; 1 when MPI fails; each with a message on stderr. */
int launch_start_alone(launch *l);

/* The largest of value over all ranks (value itself for a single process):
 * how the ranks agree that one of them asked to stop. When the ranks
 * cannot reach each other, value, or -1 when it is 0 (with a message). */
int launch_max(const launch *l, int value);

/* launch_max for a point that a rank may fail to reach (one stuck in
 * NCCL's join while another failed before it): a rank passing a nonzero
 * value waits for the others at most l->fail_wait_s seconds, then ends
 * the job (MPI_Abort with exit_status, saying so). The largest value. */
int launch_max_bounded(const launch *l, int value, int exit_status);

/* Rank 0's bytes buf[0..bytes) replace buf on every rank (nothing for a
 * single process). 0, or -1 with a message on stderr. */
int launch_broadcast(const launch *l, void *buf, size_t bytes);

/* Ends the launch with this process's exit status, which it returns:
 * releases the communicator and finalizes MPI if launch_start (or
 * launch_start_alone) started it. The ranks first agree on their statuses
 * (launch_max_bounded: a rank that failed alone leaves the others blocked
 * in a collective, so it waits at most l->fail_wait_s seconds and then
 * aborts the job), so no rank hangs. */
int launch_end(launch *l, int status);

/* ---- nccl_comm.c */

/* For train.backend cuda trained data-parallel (l->comm, or a world of one
 * with --data-parallel): this rank's NCCL communicator on ctx (opened on
 * CUDA device `device`, named in messages), which the
 * library's trainer then takes. Rank 0 makes the unique id, the launch's
 * (MPI) communicator carries it to the others, every rank joins; the
 * ranks agree on the outcome (launch_max_bounded). 0 with *out (free it
 * before ctx), or 1 on every rank with a message on stderr: the failing
 * rank's own (status and reason), the others naming that rank. */
int nccl_comm_create(const launch *l, llmt_context *ctx, int device, llmt_comm **out);

#endif
