/* The planner per rank, measured, under mpiexec -n N: each rank creates a
 * model, a sharded optimizer and a slicer, trains two steps, and its
 * context's peak per category equals llmt_plan_compute with world_size N and
 * its rank, to the byte; the plan of rank -1 is the largest rank's. The
 * model has 3 granules (10400 parameters): on 2 ranks one and two (the
 * last partial), on 4 ranks rank 0 owns nothing. Offloaded (the state of
 * the embedding and the layer, [0, 9056), in host memory), the ranks below
 * 9056 keep no state on the device and the last one is split; the planned
 * OPTIMIZER and HOST_STATE bytes are the context's current bytes too. */
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"
#include "mpi_check.h"

enum { B = 8, MICRO = 2, T = 12, VOCAB = 41 };

/* Plans and trains precision on this rank, the optimizer's state of the
 * first offload_layers layers (0: none) in host memory, checking the plan
 * against the measured peaks and current optimizer bytes. */
static void check(llmt_comm *comm, int precision, int32_t offload_layers)
{
    const int32_t size = llmt_comm_size(comm);
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    llmt_context *ctx = NULL;
    must(llmt_context_create(&ctx, &cc), "context");
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model.vocab_size = VOCAB;
    pc.model.hidden_size = 32;
    pc.model.num_layers = 1;
    pc.model.num_heads = 4;
    pc.model.num_kv_heads = 2;
    pc.model.ffn_size = 48;
    pc.model.max_seq_len = T;
    pc.model.precision = precision;
    pc.micro_batch = MICRO;
    pc.seq_len = T;
    pc.batch_size = B;
    pc.world_size = size;
    pc.rank = rank;
    pc.offload_parts = offload_layers ? LLMT_OFFLOAD_OPTIMIZER : LLMT_OFFLOAD_NONE;
    pc.offload_layers = offload_layers;
    llmt_plan p = LLMT_PLAN_INIT;
    must(llmt_plan_compute(ctx, &pc, &p), "plan");

    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_slicer *sl = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.offload_parts = pc.offload_parts;
    oc.offload_layers = offload_layers;
    must(llmt_model_create(&m, ctx, &pc.model), "model");
    must(llmt_optimizer_create_sharded(&o, m, &oc, comm, LLMT_REDUCE_DETERMINISTIC), "optimizer");
    must(llmt_slicer_create(&sl, m, MICRO), "slicer");
    int32_t tokens[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (i * 7 + 3 + rank) % VOCAB;
        targets[i] = (i * 11 + 5) % VOCAB;
    }
    for (int step = 0; step < 2; step++) {
        must(llmt_model_zero_grads(m), "zero");
        must(llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, NULL), "backward");
        must(llmt_optimizer_step(o, NULL, NULL), "step");
    }
    int64_t first = -1, end = -1;
    must(llmt_optimizer_shard(o, &first, &end), "shard");
    EXPECT(first == p.shard_first && end == p.shard_end && p.rank == rank,
           "precision %d: planned rank %d [%lld, %lld), the optimizer holds [%lld, %lld)",
           precision, p.rank, (long long)p.shard_first, (long long)p.shard_end,
           (long long)first, (long long)end);
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(ctx, &s), "stats");
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++)
        EXPECT(s.peak[c] == p.bytes[c], "precision %d, %d ranks, offload %d layers: %s planned "
               "%llu, measured %llu", precision, size, offload_layers,
               llmt_mem_category_name(c), (unsigned long long)p.bytes[c],
               (unsigned long long)s.peak[c]);
    EXPECT(s.total_peak == p.peak, "precision %d: peak planned %llu, measured %llu", precision,
           (unsigned long long)p.peak, (unsigned long long)s.total_peak);
    /* Every rank of 2 and 4 that owns a range starts it below 9056. */
    EXPECT((offload_layers && first < end) == (s.current[LLMT_MEM_HOST_STATE] > 0),
           "precision %d, offload %d layers, range [%lld, %lld): host_state %llu", precision,
           offload_layers, (long long)first, (long long)end,
           (unsigned long long)s.current[LLMT_MEM_HOST_STATE]);
    const int mem[2] = {LLMT_MEM_OPTIMIZER, LLMT_MEM_HOST_STATE};
    for (int k = 0; k < 2; k++)
        EXPECT(s.current[mem[k]] == p.bytes[mem[k]], "precision %d, offload %d layers: %s "
               "planned %llu, current %llu", precision, offload_layers,
               llmt_mem_category_name(mem[k]), (unsigned long long)p.bytes[mem[k]],
               (unsigned long long)s.current[mem[k]]);

    /* Rank -1: the largest rank's plan, the same on every rank. */
    pc.rank = -1;
    llmt_plan largest = LLMT_PLAN_INIT;
    must(llmt_plan_compute(ctx, &pc, &largest), "plan of the largest rank");
    unsigned long long mine = s.total_peak, most = 0;
    MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    EXPECT(largest.peak == most, "precision %d: rank -1 planned %llu, the largest measured %llu",
           precision, (unsigned long long)largest.peak, most);
    EXPECT(largest.rank != rank || largest.peak == mine, "rank -1 names this rank, not its peak");

    llmt_slicer_free(sl);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    llmt_comm_mpi *cm = NULL;
    must(llmt_comm_mpi_create(&cm, MPI_COMM_WORLD), "communicator");
    for (int precision = 0; precision < 4; precision++) {
        check(cm->comm, precision, 0);
        check(cm->comm, precision, 1);
    }
    llmt_comm_mpi_free(cm);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s: the planner per rank on %d ranks\n", total ? "FAILED" : "ok", size);
    MPI_Finalize();
    return total ? 1 : 0;
}
