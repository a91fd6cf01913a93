"""CheckpointStore.info (llmt_ckpt_get_info): the MANIFEST's fields, checked
against what was saved and the file sizes on disk."""
import ctypes
import os

import pytest

import llmt
from llmt import _structs as S
from llmt._lib import lib
from conftest import SMALL_MODEL


def listed_bytes(directory):
    """The bytes of a checkpoint's files, its MANIFEST not counted."""
    return sum(os.path.getsize(os.path.join(directory, name))
               for name in os.listdir(directory) if name != "MANIFEST")


def test_info_gives_what_was_saved(ctx, shards, tmp_path):
    model = llmt.Model(ctx, **SMALL_MODEL)
    opt = llmt.Optimizer(model, lr=1e-3)
    scaler = llmt.LossScaler(dynamic=False, init_scale=1.0)
    loader = llmt.Loader(ctx, shards["train"], batch_size=2, seq_len=32, vocab_size=260)
    for _ in range(2):
        model.zero_grads()
        model.forward_backward(*loader.next())
        opt.step(scaler)
    store = llmt.CheckpointStore(ctx, tmp_path / "ckpt")
    store.save(7, model, opt, scaler, loader, tokens_seen=448, user_blob=b"blob")
    store.save(9, model)

    info = store.info(7)
    assert info == llmt.CheckpointInfo(
        step=7, epoch=loader.state.epoch, tokens_seen=448, format_version=1,
        library_version=llmt.library_version, model=model.config, has_optimizer=True,
        has_scaler=True, has_data=True, optimizer_steps=2, world_size=0, num_files=3,
        total_bytes=listed_bytes(store.path(7)))
    assert info.model["precision"] == "fp32"
    bare = store.info(9)
    assert (bare.has_optimizer, bare.has_scaler, bare.has_data, bare.optimizer_steps,
            bare.tokens_seen, bare.num_files) == (False, False, False, 0, 0, 1)
    assert bare.total_bytes == os.path.getsize(os.path.join(store.path(9), "model.safetensors"))


def test_info_refuses_a_missing_step_a_damaged_manifest_and_a_bad_version(ctx, tmp_path):
    store = llmt.CheckpointStore(ctx, tmp_path / "ckpt")
    store.save(1, llmt.Model(ctx, **SMALL_MODEL))
    with pytest.raises(llmt.NotFound, match="no checkpoint step-00000004 in"):
        store.info(4)
    with pytest.raises(llmt.InvalidArgument, match="tier"):
        store.info(1, "fast")  # a store without a fast tier
    manifest = os.path.join(store.path(1), "MANIFEST")
    with open(manifest, "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(llmt.CorruptData, match=r"step-00000001 \(durable\): file MANIFEST"):
        store.info(1)
    info = S.llmt_ckpt_info()
    info.version = S.llmt_ckpt_info.VERSION + 1
    with pytest.raises(llmt.VersionError, match="info->version"):
        lib.llmt_ckpt_get_info(store._ptr, 1, 0, ctypes.byref(info))
    with pytest.raises(llmt.InvalidArgument, match="info is NULL"):
        lib.llmt_ckpt_get_info(store._ptr, 1, 0, None)
