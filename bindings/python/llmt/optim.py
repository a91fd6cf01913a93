"""AdamW (llmt_optimizer) and the loss scaler (llmt_loss_scaler)."""
import ctypes
from collections import namedtuple

import numpy as np

from . import _structs as S
from ._convert import (OPT_PARAMS, OPT_STATES, SCHEDULES, dtype_name, enum, fill_struct,
                       float32_in, init_struct, ptr, struct_dict)
from ._handle import Handle
from ._lib import lib
from .comm import comm_handle
from .errors import InvalidArgument

# llmt_reduce_mode, by name.
REDUCE_MODES = ("deterministic", "fast")
# llmt_offload_part bits, and the names of the values they may take.
OFFLOAD_NONE, OFFLOAD_OPTIMIZER, OFFLOAD_GRADS = 0, 1, 2
OFFLOAD_PARTS = {"none": OFFLOAD_NONE, "optimizer": OFFLOAD_OPTIMIZER,
                 "optimizer+grads": OFFLOAD_OPTIMIZER | OFFLOAD_GRADS}
ALL_LAYERS = -1                       # LLMT_OFFLOAD_ALL_LAYERS


def offload_parts(value, what):
    """llmt_offload_part bits from a name of OFFLOAD_PARTS (case-insensitive)
    or an int (checked by the library)."""
    if isinstance(value, str):
        bits = OFFLOAD_PARTS.get(value.lower())
        if bits is None:
            raise ValueError(f"{what}: {value!r} is not one of {', '.join(OFFLOAD_PARTS)}")
        return bits
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{what}: expected one of {', '.join(OFFLOAD_PARTS)}, got {value!r}")


def offload_name(bits):
    """The name of llmt_offload_part bits (a value the library accepts)."""
    return next(name for name, b in OFFLOAD_PARTS.items() if b == bits)

UpdateReport = namedtuple("UpdateReport", "step skipped grad_norm lr loss_scale")
UpdateReport.__doc__ = "What one optimizer step did (llmt_update_report)."

LossScalerState = namedtuple("LossScalerState", "scale clean_steps skipped_steps")
LossScalerState.__doc__ = "The changing state of a loss scaler (llmt_loss_scaler_state)."


class LossScaler(Handle):
    """The loss scale of mixed precision (llmt_loss_scaler).

    Keyword arguments are the fields of llmt_loss_scaler_config over its
    defaults: dynamic, init_scale, growth_factor, backoff_factor,
    growth_interval, min_scale, max_scale.
    """

    def __init__(self, **config):
        cfg = init_struct(S.llmt_loss_scaler_config, lib.llmt_loss_scaler_config_init)
        fill_struct(cfg, config, "LossScaler", {"dynamic": int})
        out = ctypes.POINTER(S.llmt_loss_scaler)()
        lib.llmt_loss_scaler_create(ctypes.byref(out), ctypes.byref(cfg))
        self._attach(out, lib.llmt_loss_scaler_free, ())

    @property
    def scale(self):
        """The scale to multiply the next step's loss by."""
        return lib.llmt_loss_scaler_scale(self._ptr)

    def update(self, found_overflow):
        """Records a step's outcome (the optimizer step does this itself)."""
        lib.llmt_loss_scaler_update(self._ptr, int(bool(found_overflow)))

    @property
    def state(self):
        """LossScalerState(scale, clean_steps, skipped_steps); assignable."""
        st = S.new(S.llmt_loss_scaler_state)
        lib.llmt_loss_scaler_get_state(self._ptr, ctypes.byref(st))
        return LossScalerState(st.scale, st.clean_steps, st.skipped_steps)

    @state.setter
    def state(self, value):
        st = S.new(S.llmt_loss_scaler_state)
        st.scale, st.clean_steps, st.skipped_steps = value
        lib.llmt_loss_scaler_set_state(self._ptr, ctypes.byref(st))

    @property
    def config(self):
        """The configuration as a dict of llmt_loss_scaler_config fields."""
        cfg = S.new(S.llmt_loss_scaler_config)
        lib.llmt_loss_scaler_get_config(self._ptr, ctypes.byref(cfg))
        return struct_dict(cfg)


class Optimizer(Handle):
    """AdamW over a Model (llmt_optimizer).

    Keyword arguments are the fields of llmt_optimizer_config over its
    defaults: lr, beta1, beta2, eps, weight_decay, decay_norms, grad_clip,
    schedule ("constant", "cosine", "linear"), warmup_steps, total_steps,
    min_lr, offload_parts ("none", "optimizer", "optimizer+grads"),
    offload_layers (-1: all).
    State kinds are "exp_avg", "exp_avg_sq", "master" (or 0..2).

    With ``comm`` (a Comm), a ZeRO-1 optimizer sharded over its ranks
    (llmt_optimizer_create_sharded; collective: the ranks' models must
    agree): this rank keeps the state of ``shard`` only, and a Trainer over
    it runs each step's micro-batches across the ranks. ``reduce`` says how
    the ranks' gradients are summed: "deterministic" (the default: bitwise
    one process's result with a Slicer in "ordered" accumulation) or "fast"
    (equal within rounding). get_state is then collective. The optimizer is
    closed before the Comm.
    """

    def __init__(self, model, *, comm=None, reduce=None, **config):
        cfg = init_struct(S.llmt_optimizer_config, lib.llmt_optimizer_config_init)
        fill_struct(cfg, config, "Optimizer",
                    {"schedule": lambda v: enum(v, SCHEDULES, "schedule"), "decay_norms": int,
                     "offload_parts": lambda v: offload_parts(v, "offload_parts")})
        out = ctypes.POINTER(S.llmt_optimizer)()
        if comm is None:
            if reduce is not None:
                raise InvalidArgument(f"Optimizer: reduce={reduce!r} applies to a sharded "
                                      "optimizer only (pass comm)")
            lib.llmt_optimizer_create(ctypes.byref(out), model._ptr, ctypes.byref(cfg))
            parents = (model,)
        else:
            mode = enum("deterministic" if reduce is None else reduce, REDUCE_MODES, "reduce")
            lib.llmt_optimizer_create_sharded(ctypes.byref(out), model._ptr, ctypes.byref(cfg),
                                              comm_handle(comm, "Optimizer: comm"), mode)
            parents = (model, comm)
        self._attach(out, lib.llmt_optimizer_free, parents)
        self.model = model

    @property
    def shard(self):
        """(first, end): the range of the flat parameter buffer whose state
        this rank keeps; all of it, (0, model.num_params), unless sharded."""
        first, end = ctypes.c_int64(), ctypes.c_int64()
        lib.llmt_optimizer_shard(self._ptr, ctypes.byref(first), ctypes.byref(end))
        return first.value, end.value

    def set_offload(self, parts, layers=ALL_LAYERS):
        """Moves the state of the flat prefix chosen by layers (-1: all; k:
        the embedding and layers 0..k-1) to host memory ("optimizer"), with
        its gradients too ("optimizer+grads"), or all of it to the device
        ("none"); results stay bitwise the same (llmt_optimizer_set_offload)."""
        lib.llmt_optimizer_set_offload(self._ptr, offload_parts(parts, "parts"), layers)

    @property
    def offload(self):
        """(parts, layers) as set_offload took them; ("none", 0) without offload."""
        parts, layers = ctypes.c_int32(), ctypes.c_int32()
        lib.llmt_optimizer_get_offload(self._ptr, ctypes.byref(parts), ctypes.byref(layers))
        return offload_name(parts.value), layers.value

    def get(self, param):
        """A setting by name ("lr", "beta1", ..., "min_lr") as a float."""
        value = ctypes.c_double()
        lib.llmt_optimizer_get(self._ptr, enum(param, OPT_PARAMS, "param"), ctypes.byref(value))
        return value.value

    def set(self, param, value):
        """Changes a setting (validated by the library)."""
        if param == "schedule":
            value = enum(value, SCHEDULES, "schedule")
        lib.llmt_optimizer_set(self._ptr, enum(param, OPT_PARAMS, "param"), float(value))

    def set_settings(self, **settings):
        """Changes the named settings ("lr", ..., "min_lr") at once, the
        others staying, all or none: checked together, so a lower lr with a
        lower min_lr is taken (llmt_optimizer_set_settings). The state, the
        step count and the placement stay."""
        unknown = set(settings) - set(OPT_PARAMS)
        if unknown:
            raise TypeError(f"Optimizer.set_settings: not a setting: {', '.join(sorted(unknown))} "
                            f"(known: {', '.join(OPT_PARAMS)})")
        cfg = S.new(S.llmt_optimizer_config)
        lib.llmt_optimizer_get_config(self._ptr, ctypes.byref(cfg))
        fill_struct(cfg, settings, "Optimizer.set_settings",
                    {"schedule": lambda v: enum(v, SCHEDULES, "schedule"), "decay_norms": int})
        lib.llmt_optimizer_set_settings(self._ptr, ctypes.byref(cfg))

    @property
    def config(self):
        """The current configuration as a dict of llmt_optimizer_config fields."""
        cfg = S.new(S.llmt_optimizer_config)
        lib.llmt_optimizer_get_config(self._ptr, ctypes.byref(cfg))
        return struct_dict(cfg, {"schedule": lambda v: SCHEDULES[v]})

    @property
    def lr(self):
        """The learning rate the next step will use."""
        return lib.llmt_optimizer_lr(self._ptr)

    def step(self, scaler=None):
        """One update from the accumulated gradients; returns an UpdateReport."""
        r = S.new(S.llmt_update_report)
        lib.llmt_optimizer_step(self._ptr, scaler._ptr if scaler is not None else None,
                                ctypes.byref(r))
        return UpdateReport(r.step, bool(r.skipped), r.grad_norm, r.lr, r.loss_scale)

    @property
    def step_count(self):
        """Optimizer steps taken (skipped ones not counted); assignable."""
        return lib.llmt_optimizer_step_count(self._ptr)

    @step_count.setter
    def step_count(self, steps):
        lib.llmt_optimizer_set_step_count(self._ptr, steps)

    def state_dtype(self, kind):
        """The storage dtype name of a state kind, or None when this precision
        mode has none (the master weights of FP32 and BF16_PURE)."""
        dtype = lib.llmt_optimizer_state_dtype(self._ptr, enum(kind, OPT_STATES, "kind"))
        return None if dtype < 0 else dtype_name(dtype)

    def get_state(self, kind, name):
        """The state of ``kind`` for parameter ``name`` as a float32 array of
        the parameter's shape (exact: every stored dtype widens to fp32).
        Collective when sharded: every rank asks for the same state."""
        out = np.empty(self.model._shape(name), dtype=np.float32)
        lib.llmt_optimizer_get_state(self._ptr, enum(kind, OPT_STATES, "kind"), name.encode(),
                                     ptr(out, ctypes.c_float), out.size)
        return out

    def set_state(self, kind, name, values):
        """Sets the state of ``kind`` for parameter ``name`` from float32
        values (sharded: this rank keeps its part; not collective)."""
        a = float32_in(values, self.model._shape(name), name)
        lib.llmt_optimizer_set_state(self._ptr, enum(kind, OPT_STATES, "kind"), name.encode(),
                                     ptr(a, ctypes.c_float), a.size)
