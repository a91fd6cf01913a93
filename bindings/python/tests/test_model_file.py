"""Model.from_file: a model created from a safetensors file or a checkpoint
directory has the saved configuration, bit-identical weights and logits; a
file without its configuration is refused. The loader's getters and the
store's lock as the binding shows them."""
import numpy as np
import pytest

import llmt
from conftest import SMALL_MODEL, THREADS


def _same(a, b):
    assert b.config == a.config
    for name, _, _ in a.tensors():
        np.testing.assert_array_equal(b.get_param(name), a.get_param(name))
    tokens = np.arange(32, dtype=np.int32).reshape(2, 16) * 7 % 260
    np.testing.assert_array_equal(b.logits(tokens), a.logits(tokens))


def test_from_safetensors_and_checkpoint(tmp_path):
    with llmt.Context(num_threads=THREADS, seed=3) as ctx, \
            llmt.Context(num_threads=THREADS, seed=4) as other:
        a = llmt.Model(ctx, **SMALL_MODEL, precision="bf16_mixed")
        a.save_safetensors(tmp_path / "m.safetensors", dtype="BF16")
        _same(a, llmt.Model.from_file(other, tmp_path / "m.safetensors"))
        as_fp32 = llmt.Model.from_file(other, tmp_path / "m.safetensors", precision="fp32")
        assert as_fp32.config["precision"] == "fp32"
        np.testing.assert_array_equal(as_fp32.get_param("lm_head.weight"),
                                      a.get_param("lm_head.weight"))

        store = llmt.CheckpointStore(ctx, tmp_path / "ckpt", sync=False)
        store.save(5, a)
        _same(a, llmt.Model.from_file(other, store.path(5)))


def test_refusals(tmp_path, ctx):
    with pytest.raises(llmt.IOFailure, match="nope"):
        llmt.Model.from_file(ctx, tmp_path / "nope")
    with pytest.raises(ValueError, match="precision"):
        llmt.Model.from_file(ctx, tmp_path, precision="fp8")


def test_loader_getters_and_store_lock(ctx, shards, tmp_path):
    loader = llmt.Loader(ctx, shards["train"], batch_size=2, seq_len=16, vocab_size=260)
    assert loader.epoch == 0 and loader.num_shards >= 1
    loader.close()
    with pytest.raises(llmt.StateError):
        loader.epoch
    store = llmt.CheckpointStore(ctx, tmp_path / "ckpt")
    with pytest.raises(llmt.Busy, match="locked by this process"):
        llmt.CheckpointStore(ctx, tmp_path / "ckpt")
    store.close()
    llmt.CheckpointStore(ctx, tmp_path / "ckpt").close()
