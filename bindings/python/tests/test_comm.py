"""llmt.Comm over a Python engine in one process, the sharded Optimizer,
Slicer.accumulation and Trainer.from_config(comm=...). The helpers here
(LocalEngine, write_stream, DpRun, state_of) are shared with
test_comm_mpi.py, which runs under mpiexec (tests/mpi/CMakeLists.txt)."""
import gc

import numpy as np
import pytest

import llmt

VOCAB, BATCH, MICRO, SEQ = 32, 12, 2, 8
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
            ffn_size=64, max_seq_len=SEQ)
OPTIMIZER = dict(lr=3e-3, schedule="cosine", warmup_steps=3, total_steps=40, grad_clip=0.5)


class LocalEngine:
    """The engine of a world of one process: every collective is a copy
    (or nothing); counts the calls."""
    rank, size = 0, 1

    def __init__(self):
        self.calls = {}

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def alltoallv(self, send, send_counts, send_offsets, recv, recv_counts, recv_offsets):
        self._count("alltoallv")
        assert send_counts[0] == recv_counts[0]
        recv[recv_offsets[0]:recv_offsets[0] + recv_counts[0]] = \
            send[send_offsets[0]:send_offsets[0] + send_counts[0]]

    def allgatherv(self, send, recv, counts, offsets):
        self._count("allgatherv" if send is not None else "allgatherv_in_place")
        if send is not None:
            recv[offsets[0]:offsets[0] + counts[0]] = send

    def broadcast(self, buf, root):
        self._count("broadcast")
        assert root == 0

    def allreduce_i64(self, values, op):
        self._count("allreduce_i64")
        assert op in ("sum", "max")

    def barrier(self):
        self._count("barrier")


def write_stream(directory):
    """A learnable token stream as one shard in ``directory``; its glob."""
    tokens, x, tok = [], 4242, 1
    for _ in range(1601):
        x = (x * 1664525 + 1013904223) % 2**32
        tok = (x >> 8) % VOCAB if (x >> 28) == 0 else (tok * 5 + 3) % VOCAB
        tokens.append(tok)
    llmt.shard_write(str(directory / "train_000000.bin"), tokens)
    return str(directory / "train_*.bin")


class DpRun:
    """A training run over the stream: sharded over ``comm`` with ``reduce``,
    or (comm None) one process whose slicer accumulates in order."""

    def __init__(self, pattern, precision, comm=None, reduce=None, seed=77, steps=20,
                 **placement):
        self.ctx = llmt.Context(num_threads=1, seed=seed)
        self.model = llmt.Model(self.ctx, precision=precision, **TINY)
        self.opt = llmt.Optimizer(self.model, comm=comm, reduce=reduce, **OPTIMIZER, **placement)
        self.slicer = llmt.Slicer(self.model, MICRO)
        if comm is None:
            self.slicer.accumulation = "ordered"
        self.loader = llmt.Loader(self.ctx, pattern, batch_size=BATCH, seq_len=SEQ,
                                  vocab_size=VOCAB)
        self.trainer = llmt.Trainer(self.model, self.opt, self.loader, slicer=self.slicer,
                                    total_steps=steps, adaptive=False)

    def train(self, steps):
        return [self.trainer.step().loss for _ in range(steps)]

    def close(self):
        self.ctx.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def state_of(run):
    """Every weight and optimizer state tensor, by (kind, name); get_state is
    collective for a sharded optimizer, so every rank calls this in step."""
    out = {}
    for name, _, _ in run.model.tensors():
        out["weight", name] = run.model.get_param(name)
        for kind in ("exp_avg", "exp_avg_sq", "master"):
            if run.opt.state_dtype(kind) is not None:
                out[kind, name] = run.opt.get_state(kind, name)
    return out


def assert_bitwise(a, b, what):
    assert a.keys() == b.keys()
    differ = [k for k in a if a[k].tobytes() != b[k].tobytes()]
    assert not differ, f"{what}: {len(differ)} tensors differ, first {differ[0]}"


def test_comm_over_a_python_engine(tmp_path):
    engine = LocalEngine()
    with llmt.Comm(engine) as comm:
        assert (comm.rank, comm.size, comm.engine) == (0, 1, engine)
        assert engine.calls["allreduce_i64"] >= 1  # creation checks the membership
        comm.check_same("a value", 3)
        comm.check_same("a text", "tiny.yaml")
        comm.agree(0)
    assert comm.closed
    with pytest.raises(llmt.StateError, match="closed"):
        comm.rank


def test_sharded_training_over_python_callbacks_matches_one_ordered_process(tmp_path):
    """A world of one through every callback (the gradient exchange, the
    in-place weight all-gather, the collective get_state) gives the bits
    of a plain optimizer with an ordered slicer."""
    pattern = write_stream(tmp_path)
    engine = LocalEngine()
    with llmt.Comm(engine) as comm, DpRun(pattern, "bf16_mixed", comm) as dp, \
            DpRun(pattern, "bf16_mixed") as ref:
        assert dp.opt.shard == (0, dp.model.num_params)
        assert ref.opt.shard == (0, ref.model.num_params)
        losses, ref_losses = dp.train(4), ref.train(4)
        assert engine.calls["alltoallv"] >= 4 and engine.calls["allgatherv_in_place"] >= 4
        assert losses == ref_losses
        assert_bitwise(state_of(dp), state_of(ref), "one sharded rank vs one process")


def test_sharded_gradient_offload_over_python_callbacks_matches_one_process(tmp_path):
    """The same world of one with the state and gradients of the embedding
    and layer 0 offloaded (the gradients reach their owner from host memory
    through the engine's alltoallv), then of every layer (in host memory:
    12 bytes of state a parameter and the bf16 gradients of every whole
    4096-element granule): the bits of a plain optimizer with an ordered
    slicer."""
    pattern = write_stream(tmp_path)
    with llmt.Comm(LocalEngine()) as comm, \
            DpRun(pattern, "bf16_mixed", comm, offload_parts="optimizer+grads",
                  offload_layers=1) as dp, DpRun(pattern, "bf16_mixed") as ref:
        assert dp.opt.offload == ("optimizer+grads", 1)
        losses, ref_losses = dp.train(2), ref.train(2)
        dp.opt.set_offload("optimizer+grads")
        n = dp.model.num_params
        assert dp.ctx.memory_stats()["host_state"]["current"] == 12 * n + 2 * (n // 4096 * 4096)
        losses += dp.train(2)
        ref_losses += ref.train(2)
        assert losses == ref_losses
        assert_bitwise(state_of(dp), state_of(ref), "one sharded rank, offloaded, vs one process")


def test_the_callbacks_live_as_long_as_what_uses_them(tmp_path):
    """Neither the Comm nor its engine is referenced here but through the
    optimizer: collected thunks would crash the steps and get_state."""
    pattern = write_stream(tmp_path)
    run = DpRun(pattern, "fp32", llmt.Comm(LocalEngine()))
    gc.collect()
    run.train(2)
    assert np.isfinite(state_of(run)["exp_avg", "lm_head.weight"]).all()
    run.close()


def test_closing_the_comm_closes_what_was_made_over_it(ctx):
    comm = llmt.Comm(LocalEngine())
    model = llmt.Model(ctx, **TINY)
    opt = llmt.Optimizer(model, comm=comm, reduce="fast")
    comm.close()
    assert opt.closed and not model.closed


def test_a_callback_exception_becomes_a_chained_comm_error():
    engine = LocalEngine()
    comm = llmt.Comm(engine)

    def broken(send, recv, counts, offsets):
        raise RuntimeError("the network is down")

    engine.allgatherv = broken
    with pytest.raises(llmt.CommError) as caught:
        comm.check_same("a value", 1)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert "the network is down" in str(caught.value)
    assert "a value" in str(caught.value)  # the library names the collective
    del engine.allgatherv  # the class's method again: the communicator still works
    comm.check_same("a value", 1)
    with pytest.raises(llmt.IOFailure) as later:  # a later failure has no stale cause
        comm.agree(llmt.errors.EIO)
    assert later.value.__cause__ is None
    comm.close()


def test_keyboard_interrupt_in_a_callback_is_raised_as_itself():
    engine = LocalEngine()
    comm = llmt.Comm(engine)

    def interrupted(values, op):
        raise KeyboardInterrupt

    engine.allreduce_i64 = interrupted
    with pytest.raises(KeyboardInterrupt):
        comm.agree(0)
    comm.close()


def test_engine_and_argument_errors(ctx):
    class Ranked(LocalEngine):
        def __init__(self, rank, size):
            super().__init__()
            self.rank, self.size = rank, size

    with pytest.raises(llmt.InvalidArgument, match="rank = 1, ops->size = 1"):
        llmt.Comm(Ranked(1, 1))
    with pytest.raises(llmt.InvalidArgument, match="engine.size"):
        llmt.Comm(Ranked(0, 2**32 + 1))  # would wrap to 1 in an int32
    with pytest.raises(TypeError, match="engine.rank"):
        llmt.Comm(Ranked("0", 1))
    bare = LocalEngine()
    bare.barrier = None
    with pytest.raises(TypeError, match="barrier"):
        llmt.Comm(bare)
    comm = llmt.Comm(LocalEngine())
    with pytest.raises(llmt.InvalidArgument, match="out of range"):
        comm.check_same("x", -1)
    with pytest.raises(TypeError, match="value"):
        comm.check_same("x", 1.5)
    with pytest.raises(llmt.InvalidArgument, match="status 5"):
        comm.agree(5)
    model = llmt.Model(ctx, **TINY)
    with pytest.raises(ValueError, match="reduce: 'sum' is not one of deterministic, fast"):
        llmt.Optimizer(model, comm=comm, reduce="sum")
    with pytest.raises(llmt.InvalidArgument, match="sharded optimizer only"):
        llmt.Optimizer(model, reduce="fast")
    with pytest.raises(TypeError, match="Optimizer: comm: expected an llmt.Comm"):
        llmt.Optimizer(model, comm=LocalEngine())
    comm.close()


def test_slicer_accumulation(ctx):
    slicer = llmt.Slicer(llmt.Model(ctx, **TINY), 2)
    assert slicer.accumulation == "in_place"
    slicer.accumulation = "ordered"
    assert slicer.accumulation == "ordered"
    slicer.accumulation = 0
    assert slicer.accumulation == "in_place"
    with pytest.raises(ValueError, match="accumulation: 'sorted' is not one of in_place, ordered"):
        slicer.accumulation = "sorted"
    with pytest.raises(llmt.InvalidArgument):
        slicer.accumulation = 7
    assert slicer.accumulation == "in_place"


def test_dist_reduce_key_and_from_config_with_a_comm(tmp_path):
    cfg = llmt.TrainConfig()
    assert cfg.struct.dist_reduce == 0
    cfg.set("dist.reduce", "fast")
    assert cfg.struct.dist_reduce == 1
    assert "reduce: fast" in cfg.to_yaml()
    with pytest.raises(llmt.InvalidArgument, match="dist.reduce"):
        cfg.set("dist.reduce", "sloppy")
    assert cfg.struct.dist_reduce == 1
    cfg.update({"model": TINY, "batch": {"batch_size": 4, "micro_batch": 2, "seq_len": SEQ},
                "data": {"train": write_stream(tmp_path)},
                "train": {"steps": 2, "seed": 5, "threads": 1}, "memory": {"adaptive": False}})
    engine = LocalEngine()
    comm = llmt.Comm(engine)
    tr = llmt.Trainer.from_config(None, cfg, comm=comm)
    reports = [tr.step() for _ in range(2)]
    assert [r.step for r in reports] == [1, 2] and all(np.isfinite(r.loss) for r in reports)
    assert engine.calls["alltoallv"] >= 2
    comm.close()
    assert tr.closed
    with pytest.raises(TypeError, match="Trainer.from_config: comm"):
        llmt.Trainer.from_config(None, cfg, comm=engine)
