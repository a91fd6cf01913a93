"""The checkpoint store (llmt_ckpt_store): full training state, written
atomically, checksummed, verified before use, newest K kept."""
import ctypes
import os
from collections import namedtuple

from . import _structs as S
from ._convert import (PRECISIONS, TIERS, fill_struct, init_struct, path_bytes, struct_dict,
                       tier as tier_index)
from ._handle import Handle
from ._lib import lib
from .model import ROPE_SCALINGS

Loaded = namedtuple("Loaded", "step tokens_seen user_blob")
Loaded.__doc__ = "What CheckpointStore.load restored besides the objects."

SetAside = namedtuple("SetAside", "count notes")
SetAside.__doc__ = ("What CheckpointStore.set_aside_invalid did: how many checkpoints it set "
                    "aside and a line for each, with why.")

# The most one note of llmt_ckpt_set_aside_invalid takes: the reason (under
# 1 KiB, as the library keeps it) and ": set aside\n".
_NOTE_BYTES = 1024 + 16

Latest = namedtuple("Latest", "step tier notes")
Latest.__doc__ = ("The newest checkpoint that verifies: its step, its tier (\"durable\" or "
                  "\"fast\") and a line per checkpoint passed over.")

CheckpointInfo = namedtuple("CheckpointInfo", "step epoch tokens_seen format_version "
                            "library_version model has_optimizer has_scaler has_data "
                            "optimizer_steps world_size num_files total_bytes")
CheckpointInfo.__doc__ = ("What a checkpoint's MANIFEST says of it (llmt_ckpt_info): model is "
                          "a dict of llmt_model_config fields as Model.config gives them "
                          "(precision included); world_size is 0 for a single-file checkpoint; "
                          "num_files and total_bytes count the files the MANIFEST lists.")


def _state(model, optimizer, scaler, loader, step=0, tokens_seen=0):
    st = S.new(S.llmt_train_state)
    st.model = model._ptr
    st.optimizer = optimizer._ptr if optimizer is not None else None
    st.scaler = scaler._ptr if scaler is not None else None
    st.loader = loader._ptr if loader is not None else None
    st.step, st.tokens_seen = step, tokens_seen
    return st


class CheckpointStore(Handle):
    """A directory of committed checkpoints, with an optional fast tier.

    Keyword arguments are the fields of llmt_ckpt_store_config over its
    defaults: keep (5), sync (True), fast_dir (None: no fast tier),
    fast_keep (2), read_only (False: open for listing, verifying and loading
    only, without a lock, beside a process training into the directory).
    Tiers are "durable" (the default) and "fast" (or 0 / 1).
    Objects passed to save/load: a Model (required), and optionally an
    Optimizer, a LossScaler and a Loader.
    """

    def __init__(self, context, directory, **config):
        cfg = init_struct(S.llmt_ckpt_store_config, lib.llmt_ckpt_store_config_init)
        fill_struct(cfg, config, "CheckpointStore",
                    {"fast_dir": lambda v: None if v is None else path_bytes(v),
                     "sync": int, "read_only": int})
        out = ctypes.POINTER(S.llmt_ckpt_store)()
        lib.llmt_ckpt_store_open(ctypes.byref(out), context._ptr, path_bytes(directory),
                                 ctypes.byref(cfg))
        self._attach(out, lib.llmt_ckpt_store_free, (context,))
        self.directory = os.fspath(directory)
        self._has_fast = config.get("fast_dir") is not None

    def _save(self, fn, step, model, optimizer, scaler, loader, tokens_seen, user_blob,
              config_yaml, tier_):
        st = _state(model, optimizer, scaler, loader, step, tokens_seen)
        blob = bytes(user_blob or b"")
        buf = ctypes.create_string_buffer(blob, len(blob))  # alive through the call
        if blob:
            st.user_blob, st.user_blob_size = ctypes.addressof(buf), len(blob)
        st.config_yaml = config_yaml.encode() if config_yaml is not None else None
        fn(self._ptr, ctypes.byref(st), tier_index(tier_))

    def save(self, step, model, optimizer=None, scaler=None, loader=None, *, tokens_seen=0,
             user_blob=None, config_yaml=None, tier="durable"):
        """Saves the objects' state as checkpoint ``step`` of ``tier`` and
        returns once it is committed."""
        self._save(lib.llmt_ckpt_save, step, model, optimizer, scaler, loader, tokens_seen,
                   user_blob, config_yaml, tier)

    def save_async(self, step, model, optimizer=None, scaler=None, loader=None, *,
                   tokens_seen=0, user_blob=None, config_yaml=None, tier="durable"):
        """Like save, but returns once the state is staged; a thread of the
        store writes it. wait() (or the next save, or close()) joins it."""
        self._save(lib.llmt_ckpt_save_async, step, model, optimizer, scaler, loader,
                   tokens_seen, user_blob, config_yaml, tier)

    def wait(self):
        """Waits for an async save in flight; raises its error if it failed."""
        lib.llmt_ckpt_wait(self._ptr)

    def list(self, tier="durable"):
        """The steps of the committed checkpoints of a tier, ascending (not verified)."""
        count = ctypes.c_size_t()
        lib.llmt_ckpt_list(self._ptr, tier_index(tier), None, 0, ctypes.byref(count))
        steps = (ctypes.c_int64 * max(count.value, 1))()
        lib.llmt_ckpt_list(self._ptr, tier_index(tier), steps, len(steps), ctypes.byref(count))
        return list(steps[:count.value])

    def verify(self, step, tier="durable"):
        """Checks a checkpoint completely; raises CorruptData (or IOFailure)
        naming the file when it does not verify."""
        lib.llmt_ckpt_verify(self._ptr, step, tier_index(tier))

    def latest(self):
        """The newest checkpoint over both tiers that verifies, as Latest(step,
        tier, notes); raises NotFound when the store holds no checkpoint,
        CorruptData naming every one refused and why when none verifies."""
        step, tier_ = ctypes.c_int64(), ctypes.c_int32()
        notes = ctypes.create_string_buffer(8192)
        lib.llmt_ckpt_latest(self._ptr, ctypes.byref(step), ctypes.byref(tier_), notes,
                             len(notes))
        return Latest(step.value, TIERS[tier_.value], notes.value.decode(errors="replace"))

    def set_aside_invalid(self):
        """Renames every checkpoint that does not verify (damage, not a failed
        read) to step-N.refused-XXXXXX, where nothing takes it for a
        checkpoint; returns SetAside(count, notes): how many, and one line
        per checkpoint set aside, with why. Every checkpoint is judged first:
        when one is a node's intact copy of a checkpoint saved with a fast
        tier local to each node (a data-parallel resume may load it), nothing
        is renamed and StateError names it."""
        # The library cannot be asked for the size first (the call acts), so
        # the buffer holds a note for every checkpoint there is: the store
        # holds the lock, so none appears meanwhile.
        tiers = ["durable"] + (["fast"] if self._has_fast else [])
        listed = sum(len(self.list(t)) for t in tiers)
        count = ctypes.c_size_t()
        notes = ctypes.create_string_buffer(_NOTE_BYTES * listed + 1)
        lib.llmt_ckpt_set_aside_invalid(self._ptr, ctypes.byref(count), notes, len(notes))
        lines = [line for line in notes.value.decode(errors="replace").splitlines() if line]
        return SetAside(count.value, lines)

    def info(self, step, tier="durable"):
        """What the MANIFEST of checkpoint ``step`` of ``tier`` says, as a
        CheckpointInfo; the manifest's checksum is checked, the other files
        are not (see verify). Raises NotFound when there is no such
        checkpoint, CorruptData naming the file for a damaged manifest."""
        info = S.new(S.llmt_ckpt_info)
        lib.llmt_ckpt_get_info(self._ptr, step, tier_index(tier), ctypes.byref(info))
        fields = struct_dict(info, {
            "library_version": bytes.decode,
            "model": lambda m: struct_dict(m, {"precision": lambda v: PRECISIONS[v],
                                               "rope_scaling": lambda v: ROPE_SCALINGS[v]}),
            "has_optimizer": bool, "has_scaler": bool, "has_data": bool})
        return CheckpointInfo(**fields)

    def path(self, step, tier="durable"):
        """The directory of checkpoint ``step`` of ``tier``."""
        needed = ctypes.c_size_t()
        lib.llmt_ckpt_path(self._ptr, step, tier_index(tier), None, 0, ctypes.byref(needed))
        out = ctypes.create_string_buffer(needed.value)
        lib.llmt_ckpt_path(self._ptr, step, tier_index(tier), out, len(out), ctypes.byref(needed))
        return os.fsdecode(out.value)

    def load(self, step, model, optimizer=None, scaler=None, loader=None, *, tier="durable"):
        """Loads checkpoint ``step`` of ``tier`` into the objects (which must
        match what was saved) and returns Loaded(step, tokens_seen, user_blob)."""
        st = _state(model, optimizer, scaler, loader)
        # The blob's size is not asked of the library (that would load the
        # checkpoint twice) but read from the file the format specifies; the
        # library checks it against the manifest.
        user_file = os.path.join(self.path(step, tier), "user.bin")
        cap = os.path.getsize(user_file) if os.path.exists(user_file) else 0
        buf = ctypes.create_string_buffer(cap) if cap else None
        size = ctypes.c_size_t()
        lib.llmt_ckpt_load(self._ptr, step, tier_index(tier), ctypes.byref(st), buf, cap,
                           ctypes.byref(size))
        return Loaded(st.step, st.tokens_seen, buf.raw[:size.value] if cap else b"")

