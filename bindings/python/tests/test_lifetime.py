"""Objects freed in any order (close, with, del, garbage collection,
interpreter exit) free their C objects children first, never crash, and
leave nothing open."""
import gc
import os
import random
import subprocess
import sys
import textwrap

import pytest

import llmt
from conftest import SMALL_MODEL


def build(shards, tmp_path):
    """Every kind of object, wired as a training setup, by name."""
    objs = {"ctx": llmt.Context(num_threads=2, seed=1)}
    objs["model"] = llmt.Model(objs["ctx"], **SMALL_MODEL)
    objs["opt"] = llmt.Optimizer(objs["model"])
    objs["scaler"] = llmt.LossScaler()
    objs["recompute"] = llmt.Recompute(objs["model"])
    objs["slicer"] = llmt.Slicer(objs["model"], 2)
    objs["loader"] = llmt.Loader(objs["ctx"], shards["train"], batch_size=4, seq_len=32,
                                 vocab_size=260)
    objs["store"] = llmt.CheckpointStore(objs["ctx"], tmp_path / "ckpt", sync=False)
    objs["trainer"] = llmt.Trainer(objs["model"], objs["opt"], objs["loader"],
                                   scaler=objs["scaler"], recompute=objs["recompute"],
                                   slicer=objs["slicer"], store=objs["store"],
                                   total_steps=100, checkpoint_every=1)
    objs["configured"] = llmt.Trainer.from_config(objs["ctx"], {
        "model": SMALL_MODEL, "batch": {"batch_size": 2, "micro_batch": 2, "seq_len": 16},
        "data": {"train": shards["train"]}, "train": {"seed": 1, "threads": 2}})
    objs["borrowed"] = objs["configured"].model
    objs["trainer"].step()  # an async save in flight
    return objs


def natives(objs):
    return [o._native for o in objs.values()]


def record_frees(objs):
    """Wraps every node's free function to record the order nodes are freed
    in; returns (the order, each node's parents)."""
    order, parents = [], {}
    for node in natives(objs):
        parents[node] = list(node.parents)

        def free(ptr, node=node, real=node.free):
            order.append(node)
            if real is not None:
                real(ptr)
        node.free = free
    return order, parents


def check_children_first(order, parents):
    assert len(order) == len(parents)  # every node freed exactly once
    for node, ps in parents.items():
        for p in ps:
            assert order.index(node) < order.index(p), f"{p.kind} freed before {node.kind}"


TOUCH = {llmt.Context: lambda o: o.memory_stats(), llmt.Model: lambda o: o.num_params,
         llmt.Optimizer: lambda o: o.lr, llmt.LossScaler: lambda o: o.scale,
         llmt.Recompute: lambda o: o.layer(0), llmt.Slicer: lambda o: o.micro_batch,
         llmt.Loader: lambda o: o.epoch, llmt.CheckpointStore: lambda o: o.list(),
         llmt.Trainer: lambda o: o.step_index}


def touch(obj):
    """A call on obj: works while it is open, StateError once closed."""
    if obj.closed:
        with pytest.raises(llmt.StateError):
            TOUCH[type(obj)](obj)
    else:
        TOUCH[type(obj)](obj)


def test_close_a_parent_first(ctx):
    model = llmt.Model(ctx, **SMALL_MODEL)
    opt = llmt.Optimizer(model)
    ctx.close()
    assert model.closed and opt.closed
    with pytest.raises(llmt.StateError):
        model.num_params
    with pytest.raises(llmt.StateError):
        opt.step()
    for obj in (opt, model, ctx, ctx):
        obj.close()  # idempotent
    with llmt.Context() as c:
        m = llmt.Model(c)
    assert c.closed and m.closed


@pytest.mark.parametrize("seed", range(6))
def test_random_orders_of_close_del_and_gc(shards, tmp_path, seed):
    rng = random.Random(seed)
    objs = build(shards, tmp_path)
    order, parents = record_frees(objs)
    names = list(objs)
    rng.shuffle(names)
    for name in names:
        action = rng.choice(["close", "close twice", "del", "del", "gc"])
        if action.startswith("close"):
            for _ in range(1 + action.endswith("twice")):
                objs[name].close()
        elif action == "gc":
            gc.collect()
        for other in objs.values():
            touch(other)
        del objs[name], other
    gc.collect()
    check_children_first(order, parents)


@pytest.mark.parametrize("seed", range(3))
def test_cycles_are_collected_in_any_order(shards, tmp_path, seed):
    objs = build(shards, tmp_path)
    order, parents = record_frees(objs)
    items = list(objs.values())
    random.Random(seed).shuffle(items)
    for a, b in zip(items, items[1:] + items[:1]):  # a ring of references
        a.ring = b
    del objs, items, a, b
    gc.collect()
    check_children_first(order, parents)


EXIT_SCRIPT = """
import random, sys, llmt
sys.path.insert(0, {tests!r})
from test_lifetime import build
import pathlib
objs = build({{"train": {train!r}}}, pathlib.Path({tmp!r}))
order = list(objs.values())
random.Random({seed}).shuffle(order)
keep = order           # module globals, torn down at exit in whatever order
order[0].cycle = order  # and a cycle through them
print("ok")
"""


@pytest.mark.parametrize("seed", range(3))
def test_interpreter_exit_with_everything_open(shards, tmp_path, seed):
    script = EXIT_SCRIPT.format(tests=os.path.dirname(__file__), train=shards["train"],
                                tmp=str(tmp_path), seed=seed)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                            capture_output=True, text=True, timeout=60,
                            cwd=os.path.dirname(os.path.dirname(llmt.__file__)))
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok\n", "")
    # The async save in flight at exit was completed (the store joined it).
    store = tmp_path / "ckpt" / "step-00000001"
    assert (store / "MANIFEST").exists()
