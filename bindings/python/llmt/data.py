"""Training data: token shards, the byte tokenizer, and the loader."""
import ctypes
import os
from collections import namedtuple

import numpy as np

from . import _structs as S
from ._convert import fill_struct, init_struct, path_bytes, ptr, struct_dict
from ._handle import Handle
from ._lib import lib

TokenizeReport = namedtuple("TokenizeReport",
                            "files bytes train_tokens val_tokens train_shards val_shards")
TokenizeReport.__doc__ = "What tokenize_files wrote (llmt_tokenize_report)."

LoaderState = namedtuple("LoaderState", "epoch shard_cursor window_cursor windows_consumed "
                                        "seed fingerprint")
LoaderState.__doc__ = "A loader's position (llmt_loader_state)."


def _path_array(paths):
    encoded = [path_bytes(p) for p in paths]
    return (ctypes.c_char_p * max(len(encoded), 1))(*encoded), len(encoded)


def shard_write(path, tokens, version=S.SHARD_VERSION_U16):
    """Writes tokens (a 1-D integer array-like) as a shard file atomically;
    version 1 stores uint16 tokens (llm.c), version 2 uint32."""
    a = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
    lib.llmt_shard_write(path_bytes(path), ptr(a, ctypes.c_int32), a.size, version)


def byte_encode(data):
    """The byte tokenizer: one int32 token per byte of ``data`` (bytes, or
    str encoded as UTF-8); no end-of-text token is added."""
    if isinstance(data, str):
        data = data.encode()
    out = np.empty(len(data), dtype=np.int32)
    n = ctypes.c_size_t()
    lib.llmt_byte_encode(data, len(data), ptr(out, ctypes.c_int32), out.size, ctypes.byref(n))
    return out[:n.value]


def byte_decode(tokens):
    """Bytes of byte tokens; TOKEN_EOT (256) decodes to nothing."""
    a = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
    n = ctypes.c_size_t()
    lib.llmt_byte_decode(ptr(a, ctypes.c_int32), a.size, None, 0, ctypes.byref(n))
    out = ctypes.create_string_buffer(max(n.value, 1))
    lib.llmt_byte_decode(ptr(a, ctypes.c_int32), a.size, out, len(out), ctypes.byref(n))
    return out.raw[:n.value]


def tokenize_files(paths, out_dir, prefix="text", shard_tokens=10_000_000, val_fraction=0.0):
    """Encodes text files with the byte tokenizer (each file a document ended
    by TOKEN_EOT) into out_dir/<prefix>_train_NNNNNN.bin shards, the last
    val_fraction into <prefix>_val_NNNNNN.bin. Returns a TokenizeReport."""
    array, n = _path_array(paths)
    report = S.new(S.llmt_tokenize_report)
    lib.llmt_byte_tokenize_files(array, n, path_bytes(out_dir), prefix.encode(), shard_tokens,
                                 val_fraction, ctypes.byref(report))
    return TokenizeReport(**struct_dict(report))


class Loader(Handle):
    """Serves batches of windows from token shards, shuffled per epoch, from a
    position that is read and restored exactly (llmt_loader).

    ``data`` is a glob pattern (str) or a sequence of shard paths. Keyword
    arguments are the fields of llmt_loader_config over its defaults:
    batch_size (8), seq_len (256), vocab_size (required), shuffle (True).
    The context is read for its seed only and not kept.
    """

    def __init__(self, context, data, **config):
        cfg = init_struct(S.llmt_loader_config, lib.llmt_loader_config_init)
        fill_struct(cfg, config, "Loader", {"shuffle": int})
        out = ctypes.POINTER(S.llmt_loader)()
        if isinstance(data, (str, bytes, os.PathLike)):
            lib.llmt_loader_open_glob(ctypes.byref(out), context._ptr, path_bytes(data),
                                      ctypes.byref(cfg))
        else:
            array, n = _path_array(data)
            lib.llmt_loader_open(ctypes.byref(out), context._ptr, array, n, ctypes.byref(cfg))
        self._attach(out, lib.llmt_loader_free, ())
        self.batch_size, self.seq_len = cfg.batch_size, cfg.seq_len

    def next(self):
        """The next batch as (tokens, targets), int32 arrays of shape
        (batch_size, seq_len); targets are the tokens shifted by one."""
        tokens = np.empty((self.batch_size, self.seq_len), dtype=np.int32)
        targets = np.empty_like(tokens)
        lib.llmt_loader_next(self._ptr, ptr(tokens, ctypes.c_int32),
                             ptr(targets, ctypes.c_int32), tokens.size)
        return tokens, targets

    @property
    def state(self):
        """The position as a LoaderState; assign one (from this loader or one
        over the same files, seq_len and shuffle flag) to restore it."""
        st = S.new(S.llmt_loader_state)
        lib.llmt_loader_get_state(self._ptr, ctypes.byref(st))
        return LoaderState(**struct_dict(st))

    @state.setter
    def state(self, value):
        st = S.new(S.llmt_loader_state)
        fill_struct(st, value._asdict(), "LoaderState")
        lib.llmt_loader_set_state(self._ptr, ctypes.byref(st))

    def _get(self, getter):
        value = ctypes.c_uint64()
        getter(self._ptr, ctypes.byref(value))
        return value.value

    @property
    def epoch(self):
        """The current epoch, from 0."""
        return self._get(lib.llmt_loader_epoch)

    @property
    def windows_per_epoch(self):
        """Windows in one epoch."""
        return self._get(lib.llmt_loader_windows_per_epoch)

    @property
    def tokens_per_epoch(self):
        """Input tokens served in one epoch."""
        return self._get(lib.llmt_loader_tokens_per_epoch)

    @property
    def num_shards(self):
        """The number of shards."""
        return self._get(lib.llmt_loader_num_shards)
