"""The trainer from Python: identical to llmt-train, the sketch of
ARCHITECTURE.md, callbacks, logs, evaluation, checkpoints and resume."""
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import llmt
from llmt.config import dict_to_yaml
from conftest import SMALL_MODEL, THREADS, small_config


def write_config(path, cfg):
    path.write_text(dict_to_yaml(cfg))
    return path


def test_losses_are_bit_identical_to_llmt_train(shards, tmp_path, llmt_train):
    cfg = small_config(shards, {"train.steps": 12, "train.eval_every": 6,
                                "schedule": {"kind": "cosine", "warmup_steps": 3,
                                             "total_steps": 12},
                                "precision": "bf16_mixed", "batch.micro_batch": 2})
    config = write_config(tmp_path / "run.yaml", cfg)
    subprocess.run([llmt_train, "--config", str(config), "--out", str(tmp_path / "out"),
                    "--steps", "12"], check=True, capture_output=True)
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    c_steps = [m for m in map(json.loads, lines) if "event" not in m]
    assert [m["step"] for m in c_steps] == list(range(1, 13))

    with llmt.Trainer.from_yaml(None, config) as tr:
        reports = tr.run()
    assert len(reports) == 12
    for m, r in zip(c_steps, reports):
        assert (r.step, r.loss, r.grad_norm, r.lr, r.tokens_seen) == \
               (m["step"], m["loss"], m["grad_norm"], m["lr"], m["tokens_seen"])
        assert r.eval_loss == m["eval_loss"]
        assert {c: r.memory[c] for c in llmt.CATEGORIES} == \
               {c: m["memory"][c] for c in llmt.CATEGORIES}
    assert reports[5].eval_loss is not None and reports[4].eval_loss is None


def test_the_architecture_sketch(shards, tmp_path):
    cfg = small_config(shards, {"checkpoint": {"dir": str(tmp_path / "ckpt"), "every": 2}})
    del cfg["train"]["seed"], cfg["train"]["threads"]  # the context's apply
    config = write_config(tmp_path / "tiny.yaml", cfg)
    seen = []
    with llmt.Context(backend="cpu") as ctx:
        tr = llmt.Trainer.from_yaml(ctx, config)
        assert tr.resume_latest() is None
        for report in tr.run(steps=1000):
            seen.append((report.step, report.loss, report.memory["activations"]))
    assert tr.closed and [s for s, _, _ in seen] == list(range(1, 9))
    assert all(math.isfinite(loss) and act > 0 for _, loss, act in seen)
    with llmt.Context(backend="cpu") as ctx:
        tr = llmt.Trainer.from_yaml(ctx, config)
        assert tr.resume_latest() == 8 and tr.run() == []


def test_a_context_that_differs_from_the_configuration_is_warned_about(shards, ctx):
    with pytest.warns(llmt.ConfigWarning, match="seed is 1 but train.seed is 7"):
        llmt.Trainer.from_config(ctx, small_config(shards)).close()
    with llmt.Context(num_threads=THREADS, seed=7) as same, warnings.catch_warnings():
        warnings.simplefilter("error")
        llmt.Trainer.from_config(same, small_config(shards)).close()


def test_memory_host_budget_is_the_contexts(shards):
    """memory.host_budget becomes the context's host budget: the offloaded
    optimizer state fits one of exactly its bytes and is refused by one a
    byte smaller, naming the host budget."""
    offload = {"optimizer": {"lr": 3e-3, "offload": "optimizer"}}
    with llmt.Context(num_threads=THREADS, seed=7) as ctx:
        llmt.Trainer.from_config(ctx, small_config(shards, offload)).close()
        need = ctx.memory_stats()["host_state"]["peak"]
    assert need > 0
    for budget, fits in ((need, True), (need - 1, False)):
        cfg = small_config(shards, dict(offload, memory={"host_budget": budget}))
        with llmt.Context(num_threads=THREADS, seed=7) as ctx:
            if fits:
                llmt.Trainer.from_config(ctx, cfg).close()
                assert ctx.memory_stats()["host_budget"] == need
            else:
                with pytest.raises(llmt.OutOfMemory, match="host budget"):
                    llmt.Trainer.from_config(ctx, cfg)


def test_the_configured_settings_after_a_resume(shards, tmp_path):
    """A resume makes the optimizer's settings the checkpoint's; the
    trainer's optimizer (borrowed from a trainer made from a configuration)
    takes the configured ones again with set_settings, as llmt-train's
    --optimizer-settings config does, and the next step uses them."""
    ckpt = {"checkpoint": {"dir": str(tmp_path / "ckpt"), "every": 2}}
    with llmt.Trainer.from_config(None, small_config(shards, dict(ckpt, **{"train.steps": 2}))) \
            as first:
        first.run()
    changed = small_config(shards, dict(ckpt, optimizer={"lr": 1e-3}))
    with llmt.Trainer.from_config(None, changed) as tr:
        assert tr.resume_latest() == 2
        opt = tr.optimizer
        assert opt is tr.optimizer and opt.get("lr") == 3e-3  # the checkpoint's
        opt.set_settings(lr=1e-3)
        assert tr.run(steps=1)[0].lr == 1e-3
        assert opt.model.num_params == tr.model.num_params
    assert opt.closed  # borrowed: closed with the trainer


def test_resume_continues_the_same_run(shards, tmp_path):
    straight = llmt.Trainer.from_config(None, small_config(shards))
    expected = [r.loss for r in straight.run()]
    straight.close()

    cfg = small_config(shards, {"checkpoint": {"dir": str(tmp_path / "ckpt"), "every": 3,
                                               "async": True}})
    first = llmt.Trainer.from_config(None, cfg)
    assert first.resume_latest() is None
    losses = [r.loss for r in first.run(steps=4)]
    first.close()  # steps 1-4 done, checkpoint at 3
    second = llmt.Trainer.from_config(None, cfg)
    assert second.resume_latest() == 3 and second.step_index == 3
    losses = losses[:3] + [r.loss for r in second.iter_steps()]
    assert losses == expected
    second.save("durable")
    # The trainer's store holds the directory's lock until it is closed.
    with pytest.raises(llmt.Busy, match="locked by this process"):
        llmt.CheckpointStore(second.context, tmp_path / "ckpt")
    second.save("durable")  # step 8 again: already committed, nothing written
    second.close()
    with llmt.Context(num_threads=THREADS) as ctx:
        assert llmt.CheckpointStore(ctx, tmp_path / "ckpt").list() == [3, 6, 8]


def test_callbacks_stop_and_exceptions_are_re_raised(shards):
    tr = llmt.Trainer.from_config(None, small_config(shards, {"train.steps": 20}))
    assert [r.step for r in tr.run(callback=lambda r: r.step >= 2)] == [1, 2]

    def fails(report):
        if report.step == 4:
            raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        tr.run(callback=fails)
    assert tr.step_index == 4  # stopped at the end of the step that raised

    def closes(report):
        tr.context.close()
    with pytest.raises(llmt.StateError, match="cannot close the Trainer while it runs"):
        tr.run(callback=closes)
    with pytest.raises(llmt.StateError, match="the trainer is running"):
        tr.run(callback=lambda r: tr.step())
    assert tr.step_index == 6 and not tr.closed
    reports = list(tr.iter_steps(3))
    assert [r.step for r in reports] == [7, 8, 9]
    assert [r.step for r in tr.run(steps=2)] == [10, 11]
    tr.close()


def test_log_lines_reach_python(shards, tmp_path):
    cfg = small_config(shards, {"batch.micro_batch": 4})
    with llmt.Context(num_threads=THREADS, seed=7) as ctx:
        p = llmt.plan(ctx, model=dict(SMALL_MODEL, tie_embeddings=True), micro_batch=4,
                      seq_len=32)
        cfg["memory"] = {"budget": p.peak - 1}  # micro-batch 4 without recompute does not fit
        lines = []
        tr = llmt.Trainer.from_config(ctx, cfg)
        tr.on_log(lines.append)
        report = tr.step()
        assert report.retries == 1
        assert lines and "out of memory" in lines[0] and "retrying the same batch" in lines[0]

        def broken(line):
            raise RuntimeError("log callback")
        tr.on_log(broken)
        tr.close()
        tr = llmt.Trainer.from_config(ctx, cfg)
        tr.on_log(broken)
        with pytest.raises(RuntimeError, match="log callback"):
            tr.step()
        tr.on_log(None)
        tr.step()


def test_trainer_over_parts(ctx, shards, tmp_path):
    model = llmt.Model(ctx, **SMALL_MODEL)
    opt = llmt.Optimizer(model, lr=1e-3)
    loader = llmt.Loader(ctx, shards["train"], batch_size=4, seq_len=32, vocab_size=260)
    eval_loader = llmt.Loader(ctx, shards["val"], batch_size=4, seq_len=32, vocab_size=260,
                              shuffle=False)
    store = llmt.CheckpointStore(ctx, tmp_path / "ckpt")
    tr = llmt.Trainer(model, opt, loader, recompute=llmt.Recompute(model),
                      slicer=llmt.Slicer(model, 2), eval_loader=eval_loader, store=store,
                      total_steps=3, eval_every=3, eval_batches=1,
                      metrics_path=tmp_path / "m.jsonl")
    assert tr.model is model and tr.context is ctx
    reports = tr.run()
    assert [r.step for r in reports] == [1, 2, 3] and reports[0].micro_batch == 2
    assert reports[0].memory["params"] == 4 * model.num_params
    assert reports[-1].eval_loss == pytest.approx(tr.evaluate())
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 3
    tr.save("durable")
    assert store.list() == [3]
    opt.close()  # a part: the trainer goes first
    assert tr.closed and not model.closed
    with pytest.raises(TypeError, match="'steps'"):
        llmt.Trainer(model, llmt.Optimizer(model), loader, steps=3)


def test_borrowed_model_of_a_configured_trainer(shards):
    tr = llmt.Trainer.from_config(None, small_config(shards))
    model = tr.model
    assert model is tr.model and model.config["hidden_size"] == 64
    before = model.get_param("model.norm.weight")
    tr.step()
    assert not np.array_equal(model.get_param("model.norm.weight"), before)
    ctx = tr.context
    tr.close()
    assert model.closed and ctx.closed


CTRL_C_SCRIPT = """
import os, signal, sys, llmt
sys.path.insert(0, {tests!r})
from conftest import small_config
tr = llmt.Trainer.from_config(None, small_config({shards!r}, {{"train.steps": 100000}}))
def press_ctrl_c(report):
    if report.step == 3:
        os.kill(os.getpid(), signal.SIGINT)
try:
    tr.run(callback=press_ctrl_c)
except KeyboardInterrupt:
    print("interrupted after step", tr.step_index)
print("then", [r.step for r in tr.run(steps=2)])
"""


def test_ctrl_c_stops_a_run_at_the_end_of_a_step(shards):
    script = CTRL_C_SCRIPT.format(tests=os.path.dirname(__file__),
                                  shards={"train": shards["train"], "val": shards["val"]})
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, cwd=os.path.dirname(os.path.dirname(llmt.__file__)))
    assert result.returncode == 0 and result.stderr == ""
    first, then = result.stdout.splitlines()
    step = int(first.split()[-1])
    assert first.startswith("interrupted after step") and step in (3, 4)
    assert then == f"then {[step + 1, step + 2]}"
