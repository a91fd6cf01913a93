"""CheckpointStore: save and load round trips of the full state."""
import numpy as np
import pytest

import llmt
from conftest import SMALL_MODEL


def train(model, opt, loader, steps, scaler=None):
    for _ in range(steps):
        model.zero_grads()
        tokens, targets = loader.next()
        model.forward_backward(tokens, targets)
        opt.step(scaler)


def snapshot(model, opt):
    return {name: (model.get_param(name), opt.get_state("exp_avg", name),
                   opt.get_state("exp_avg_sq", name)) for name, _, _ in model.tensors()}


def test_save_and_load_round_trip(ctx, shards, tmp_path):
    model = llmt.Model(ctx, **SMALL_MODEL)
    opt = llmt.Optimizer(model, lr=1e-3)
    scaler = llmt.LossScaler(dynamic=False, init_scale=1.0)
    loader = llmt.Loader(ctx, shards["train"], batch_size=2, seq_len=32, vocab_size=260)
    train(model, opt, loader, 3, scaler)
    store = llmt.CheckpointStore(ctx, tmp_path / "ckpt", keep=2)
    saved, position, rng = snapshot(model, opt), loader.state, ctx.rng_state
    store.save(3, model, opt, scaler, loader, tokens_seen=192, user_blob=b"\x00blob\xff",
               config_yaml="train:\n  steps: 3\n")
    next_batch = loader.next()

    train(model, opt, loader, 2, scaler)  # move everything on
    ctx.uniform(10)
    assert opt.step_count == 5
    loaded = store.load(3, model, opt, scaler, loader)
    assert loaded == llmt.Loaded(3, 192, b"\x00blob\xff")
    for name, arrays in snapshot(model, opt).items():
        for got, want in zip(arrays, saved[name]):
            np.testing.assert_array_equal(got, want)
    assert opt.step_count == 3 and loader.state == position and ctx.rng_state == rng
    np.testing.assert_array_equal(loader.next()[0], next_batch[0])

    store.save_async(5, model, opt)
    store.wait()
    assert store.list() == [3, 5]
    store.verify(5)
    assert store.latest() == llmt.Latest(5, "durable", "")
    assert store.path(5) == str(tmp_path / "ckpt" / "step-00000005")
    assert store.load(5, llmt.Model(ctx, **SMALL_MODEL)).user_blob == b""


def test_corruption_is_detected_and_skipped(ctx, tmp_path):
    model = llmt.Model(ctx, **SMALL_MODEL)
    store = llmt.CheckpointStore(ctx, tmp_path / "ckpt", fast_dir=tmp_path / "fast",
                                 sync=False)
    store.save(1, model)
    store.save(2, model, tier="fast")
    assert (store.list("durable"), store.list("fast")) == ([1], [2])
    weights = tmp_path / "fast" / "step-00000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(llmt.CorruptData, match="model.safetensors"):
        store.verify(2, "fast")
    latest = store.latest()
    assert (latest.step, latest.tier) == (1, "durable")
    assert latest.notes.startswith("checkpoint step-00000002 (fast): file model.safetensors: "
                                   "checksum mismatch")
    with pytest.raises(llmt.InvalidArgument, match="hidden_size = 64, this model 32"):
        store.load(1, llmt.Model(ctx, **dict(SMALL_MODEL, hidden_size=32)))


def test_reader_beside_writer_and_set_aside(ctx, tmp_path):
    model = llmt.Model(ctx, **SMALL_MODEL)
    writer = llmt.CheckpointStore(ctx, tmp_path / "ckpt", sync=False)
    writer.save(1, model)
    writer.save(2, model)
    # A reader opens beside the writer (a second writer may not) and cannot save.
    reader = llmt.CheckpointStore(ctx, tmp_path / "ckpt", read_only=True)
    with pytest.raises(llmt.Busy):
        llmt.CheckpointStore(ctx, tmp_path / "ckpt")
    assert reader.latest().step == 2
    with pytest.raises(llmt.IOFailure, match="read_only"):
        reader.save(3, model)
    with pytest.raises(llmt.NotFound):
        llmt.CheckpointStore(ctx, tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()
    reader.close()
    # Damage step 2: set aside (kept under another name), step 1 stays.
    (tmp_path / "ckpt" / "step-00000002" / "MANIFEST").write_text("damaged")
    done = writer.set_aside_invalid()
    assert done.count == 1
    assert len(done.notes) == 1 and "step-00000002" in done.notes[0]
    assert writer.list() == [1]
    assert [p.name.split(".")[0] for p in (tmp_path / "ckpt").glob("step-00000002.refused-*")] \
        == ["step-00000002"]


def test_set_aside_counts_and_keeps_every_note(ctx, tmp_path):
    # 30 damaged checkpoints under a long path: over 8 KiB of notes, each
    # naming the missing file by its path.
    model = llmt.Model(ctx, **SMALL_MODEL)
    directory = tmp_path / ("d" * 200)
    store = llmt.CheckpointStore(ctx, directory, sync=False, keep=40)
    for step in range(1, 31):
        store.save(step, model)
        (directory / f"step-{step:08d}" / "model.safetensors").unlink()
    done = store.set_aside_invalid()
    assert done.count == 30
    assert len(done.notes) == 30
    assert sum(len(line) + 1 for line in done.notes) > 8192
    assert all(line.endswith(": set aside") for line in done.notes)
    assert store.list() == []
