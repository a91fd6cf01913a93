"""llmt.Comm over mpi4py, run as `mpiexec -n N python3 -m pytest` (ctest
mpi_python_comm_np2, tests/mpi/CMakeLists.txt; left out of the plain
python_binding run). Every rank runs the same tests in the same order, and
each failure a test provokes happens on every rank, so no rank is left
waiting in a collective."""
import numpy as np
import pytest
from mpi4py import MPI

import llmt
from llmt.errors import EIO
from test_comm import DpRun, assert_bitwise, state_of, write_stream

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
STEPS = 5


@pytest.fixture(scope="module")
def comm():
    with llmt.Comm.from_mpi4py(WORLD) as c:
        yield c


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """Rank 0's shard glob: every rank reads the same paths, as a run does."""
    pattern = write_stream(tmp_path_factory.mktemp("stream")) if RANK == 0 else None
    pattern = WORLD.bcast(pattern, root=0)
    WORLD.Barrier()
    return pattern


def test_from_mpi4py(comm):
    assert (comm.rank, comm.size) == (RANK, SIZE)
    before = comm.bytes_sent
    comm.check_same("a value", 42)
    assert comm.bytes_sent - before == 8 * (SIZE - 1)  # one uint64 to every other rank
    with pytest.raises(TypeError, match="Intracomm"):
        llmt.Comm.from_mpi4py("COMM_WORLD")


def test_the_mpi_engine_moves_the_bytes_asked_for(comm):
    """The engine's collectives on hand-built buffers: rank r's bytes are
    r * 16 + i, and rank r sends r + 1 bytes to each rank."""
    engine = comm.engine
    mine = np.array([RANK * 16 + i for i in range(RANK + 1)], dtype=np.uint8)
    counts = [r + 1 for r in range(SIZE)]
    offsets = [sum(counts[:r]) for r in range(SIZE)]
    expect = np.concatenate([np.arange(r + 1, dtype=np.uint8) + r * 16 for r in range(SIZE)])
    recv = np.zeros(offsets[-1] + counts[-1], dtype=np.uint8)
    engine.allgatherv(mine, recv, counts, offsets)
    assert recv.tolist() == expect.tolist()
    recv[:] = 0
    recv[offsets[RANK]:offsets[RANK] + counts[RANK]] = mine
    engine.allgatherv(None, recv, counts, offsets)  # in place
    assert recv.tolist() == expect.tolist()
    send = np.tile(mine, SIZE)
    engine.alltoallv(send, [RANK + 1] * SIZE, [(RANK + 1) * r for r in range(SIZE)],
                     recv, counts, offsets)
    assert recv.tolist() == expect.tolist()
    buf = np.full(3, RANK, dtype=np.uint8)
    engine.broadcast(buf, SIZE - 1)
    assert buf.tolist() == [SIZE - 1] * 3
    values = np.array([RANK, -RANK], dtype=np.int64)
    engine.allreduce_i64(values, "sum")
    assert values.tolist() == [SIZE * (SIZE - 1) // 2, -(SIZE * (SIZE - 1) // 2)]
    values[:] = [RANK, -RANK]
    engine.allreduce_i64(values, "max")
    assert values.tolist() == [SIZE - 1, 0]
    engine.barrier()


@pytest.mark.skipif(SIZE < 2, reason="needs two ranks to differ")
def test_disagreement_and_agree_name_the_rank(comm):
    with pytest.raises(llmt.CommError, match="differs between rank 0 and rank 1"):
        comm.check_same("the rank", RANK)
    last = SIZE - 1
    if RANK == last:
        with pytest.raises(llmt.IOFailure):
            comm.agree(EIO)
    else:
        with pytest.raises(llmt.CommError, match=f"rank {last} failed"):
            comm.agree(0)


@pytest.mark.parametrize("precision", ["fp32", "bf16_mixed"])
def test_deterministic_ranks_equal_one_ordered_process(comm, stream, precision):
    ref = DpRun(stream, precision)
    ref_losses = ref.train(STEPS)
    dp = DpRun(stream, precision, comm, "deterministic")
    first, end = dp.opt.shard
    shards = WORLD.allgather((first, end))
    bounds = [0] + [e for _, e in shards]
    assert shards == list(zip(bounds[:-1], bounds[1:])) and bounds[-1] == dp.model.num_params
    assert SIZE == 1 or end - first < dp.model.num_params
    before = comm.bytes_sent
    assert dp.train(STEPS) == ref_losses
    deterministic_bytes = comm.bytes_sent - before
    assert_bitwise(state_of(dp), state_of(ref), f"{precision} on {SIZE} ranks")
    assert ref_losses[-1] < ref_losses[0] - 0.1
    # Every layer's state and gradients in host memory: the same bits.
    off = DpRun(stream, precision, comm, "deterministic", offload_parts="optimizer+grads")
    assert off.opt.offload == ("optimizer+grads", -1)
    assert off.train(STEPS) == ref_losses
    assert_bitwise(state_of(off), state_of(ref), f"{precision} on {SIZE} ranks, offloaded")
    off.close()

    fast = DpRun(stream, precision, comm, "fast")
    before = comm.bytes_sent
    fast_losses = fast.train(STEPS)
    fast_bytes = comm.bytes_sent - before
    a, b = state_of(fast), state_of(ref)
    worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
    assert worst <= (2e-4 if precision == "fp32" else 2e-2)
    assert abs(fast_losses[-1] - ref_losses[-1]) < 1e-2
    if SIZE > 1:  # one exchange per step, not one per micro-batch round
        assert fast_bytes < deterministic_bytes
    for run in (fast, dp, ref):
        run.close()


def test_from_config_over_the_ranks(comm, stream):
    cfg = llmt.TrainConfig({"model": {"vocab_size": 32, "hidden_size": 32, "num_layers": 1,
                                      "num_heads": 4, "num_kv_heads": 2, "ffn_size": 64,
                                      "max_seq_len": 8},
                            "batch": {"batch_size": 8, "micro_batch": 2, "seq_len": 8},
                            "data": {"train": stream}, "memory": {"adaptive": False},
                            "train": {"steps": 2, "seed": 3, "threads": 1}})
    cfg.set("dist.reduce", "fast")
    with llmt.Trainer.from_config(None, cfg, comm=comm) as tr:
        losses = [tr.step().loss for _ in range(2)]
        weight = tr.model.get_param("model.norm.weight")
    assert all(np.isfinite(losses))
    everyone = WORLD.allgather((losses, weight.tobytes()))
    assert all(e == everyone[0] for e in everyone)  # the same step on every rank


def test_a_failing_collective_fails_every_rank_with_its_cause(comm, stream):
    original = comm.engine.broadcast

    def bad_root(buf, root):  # an MPI error (MPI_ERR_ROOT) on every rank
        original(buf, SIZE)

    comm.engine.broadcast = bad_root
    try:
        with pytest.raises(llmt.LlmtError) as caught:
            comm.agree(EIO)  # every rank fails: the failure's text is broadcast
    finally:
        del comm.engine.broadcast
    assert isinstance(caught.value, llmt.CommError)
    assert isinstance(caught.value.__cause__, MPI.Exception)

    run = DpRun(stream, "fp32", comm, "deterministic")

    def down(*args):
        raise ConnectionError("link down")

    run.trainer.step()
    comm.engine.alltoallv = down
    try:
        with pytest.raises(llmt.CommError, match="link down") as caught:
            run.trainer.step()
    finally:
        del comm.engine.alltoallv
    assert isinstance(caught.value.__cause__, ConnectionError)
    run.close()
    comm.check_same("still usable", 1)
