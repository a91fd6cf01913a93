"""Optimizer offload through the binding: Optimizer(offload_parts=...),
set_offload, the offload property, and the host_state accounting; the
state and weights stay bitwise those of an optimizer without offload."""
import numpy as np
import pytest

import llmt
from conftest import SMALL_MODEL, THREADS

B, T = 2, 16


def train(steps, moves=(), **offload):
    """Weights and state after `steps` steps; moves[i] = (step, parts, layers)."""
    with llmt.Context(num_threads=THREADS, seed=3) as ctx:
        model = llmt.Model(ctx, **SMALL_MODEL, precision="bf16_pure")
        opt = llmt.Optimizer(model, lr=1e-2, **offload)
        rng = np.random.default_rng(0)
        for step in range(steps):
            for at, parts, layers in moves:
                if at == step:
                    opt.set_offload(parts, layers)
            tokens = rng.integers(0, 260, size=(B, T), dtype=np.int32)
            model.zero_grads()
            model.forward_backward(tokens, np.roll(tokens, -1, axis=1))
            opt.step()
        names = [t[0] for t in model.tensors()]
        out = {n: model.get_param(n).copy() for n in names}
        out.update({(k, n): opt.get_state(k, n).copy() for k in ("exp_avg", "exp_avg_sq")
                    for n in names})
        return out, opt.offload, ctx.memory_stats()


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


def test_offload_bitwise_and_accounted():
    ref, placement, stats = train(4)
    assert placement == ("none", 0) and stats["host_state"]["current"] == 0
    whole, placement, stats = train(4, offload_parts="optimizer")
    assert placement == ("optimizer", -1)
    assert_same(ref, whole)
    # bf16_pure: two bf16 moments per parameter, all of them on the host.
    n = sum(v.size for k, v in ref.items() if isinstance(k, str))
    assert stats["host_state"]["current"] == 4 * n and stats["optimizer"]["current"] == 0
    device = sum(stats[c]["current"] for c in llmt.CATEGORIES if c != "host_state")
    assert stats["total"]["current"] == device  # host_state is left out
    moved, placement, _ = train(4, moves=((1, "optimizer", 1), (3, "none", 0)))
    assert placement == ("none", 0)
    assert_same(ref, moved)


def test_offload_refusals():
    with llmt.Context(num_threads=THREADS) as ctx:
        model = llmt.Model(ctx, **SMALL_MODEL)
        opt = llmt.Optimizer(model)
        with pytest.raises(llmt.InvalidArgument, match="layers"):
            opt.set_offload("optimizer", 3)
        with pytest.raises(ValueError, match="parts"):
            opt.set_offload("grads")
        ctx.set_host_budget(1000)
        assert ctx.memory_stats()["host_budget"] == 1000
        with pytest.raises(llmt.OutOfMemory, match="host budget"):
            opt.set_offload("optimizer")
        assert opt.offload == ("none", 0)


def test_grads_offload_bitwise_and_named():
    """offload_parts="optimizer+grads" reaches the library as OPTIMIZER |
    GRADS and comes back by name; the gradients below the split (the
    parameters in whole 4096-element granules) are host memory too, and the
    results stay bitwise."""
    assert (llmt.optim.OFFLOAD_OPTIMIZER | llmt.optim.OFFLOAD_GRADS) == 3
    ref, _, _ = train(3)
    both, placement, stats = train(3, offload_parts="optimizer+grads")
    assert placement == ("optimizer+grads", -1)
    assert_same(ref, both)
    n = sum(v.size for k, v in ref.items() if isinstance(k, str))
    split = n // 4096 * 4096
    # bf16_pure: two bf16 moments and a bf16 gradient per offloaded element.
    assert stats["host_state"]["current"] == 4 * n + 2 * split
    moved, placement, _ = train(3, moves=((1, "optimizer+grads", 1), (2, "optimizer", -1)))
    assert placement == ("optimizer", -1)
    assert_same(ref, moved)
