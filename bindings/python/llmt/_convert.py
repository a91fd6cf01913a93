"""Conversions between Python values and the C API's: enum names, keyword
arguments onto config structs, numpy arrays in and out."""
import ctypes
import os

import numpy as np

from ._lib import lib

BACKENDS = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16_mixed", "fp16_mixed", "bf16_pure")
SCHEDULES = ("constant", "cosine", "linear")
DTYPES = ("F32", "F16", "BF16", "I32")
TIERS = ("durable", "fast")
OPT_STATES = ("exp_avg", "exp_avg_sq", "master")
OPT_PARAMS = ("lr", "beta1", "beta2", "eps", "weight_decay", "decay_norms", "grad_clip",
              "schedule", "warmup_steps", "total_steps", "min_lr")
RECOMPUTE_FLAGS = {"attn_core": 1, "ffn_act": 2, "ffn": 4, "full": 8}


def enum(value, names, what):
    """The index of ``value`` (a name of ``names``, case-insensitive, or an int)."""
    if isinstance(value, str):
        try:
            return [n.lower() for n in names].index(value.lower())
        except ValueError:
            raise ValueError(f"{what}: {value!r} is not one of {', '.join(names)}") from None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{what}: expected one of {', '.join(names)}, got {value!r}")


def recompute_policy(value):
    """Recompute flags from an int, "none", or names joined by '+'
    ("ffn_act+attn_core"), or a sequence of names."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    parts = value.split("+") if isinstance(value, str) else list(value)
    flags = 0
    for part in parts:
        if part == "none":
            continue
        if part not in RECOMPUTE_FLAGS:
            raise ValueError(f"recompute: {part!r} is not none or one of "
                             f"{', '.join(RECOMPUTE_FLAGS)}")
        flags |= RECOMPUTE_FLAGS[part]
    return flags


def recompute_policy_name(policy):
    """The library's name of recompute flags ("none", "attn_core+ffn_act", ...)."""
    return lib.llmt_recompute_policy_name(policy).decode()


def dtype_name(dtype):
    """The library's name of an llmt_dtype ("F32", "BF16", ...)."""
    return lib.llmt_dtype_name(dtype).decode()


def tier(value):
    """LLMT_CKPT_DURABLE / LLMT_CKPT_FAST from "durable" / "fast" or 0 / 1."""
    return enum(value, TIERS, "tier")


def path_bytes(path):
    """A path (str, bytes or os.PathLike) as bytes for the C API."""
    return os.fsencode(path)


def init_struct(cls, init_fn):
    """A struct filled with the C defaults by its _init function."""
    s = cls()
    init_fn(ctypes.byref(s))
    return s


def fill_struct(struct, kwargs, what, converters=None):
    """Sets the fields of ``struct`` named by ``kwargs`` (the C field names),
    converting with ``converters[name]`` where given. An unknown name is a
    TypeError listing the known ones; ``version`` cannot be set."""
    converters = converters or {}
    fields = [name for name, _ in type(struct)._fields_ if name != "version"]
    for key, value in kwargs.items():
        if key not in fields:
            raise TypeError(f"{what}() got an unexpected keyword argument {key!r} "
                            f"(known: {', '.join(fields)})")
        setattr(struct, key, converters[key](value) if key in converters else value)
    return struct


def struct_dict(struct, converters=None):
    """The fields of ``struct`` (but version) as a dict, converted with
    ``converters[name]`` where given."""
    converters = converters or {}
    out = {}
    for name, _ in type(struct)._fields_:
        if name != "version":
            value = getattr(struct, name)
            out[name] = converters[name](value) if name in converters else value
    return out


def tokens_array(tokens, what="tokens"):
    """A C-contiguous int32 array of shape (B, T) from an integer array-like;
    values that do not fit int32 are refused."""
    a = np.asarray(tokens)
    if a.dtype != np.int32:
        if a.dtype.kind not in "iu":
            raise TypeError(f"{what}: expected an integer array, got dtype {a.dtype}")
        b = a.astype(np.int32)
        if not np.array_equal(a, b):
            raise ValueError(f"{what}: values do not fit int32")
        a = b
    if a.ndim != 2:
        raise ValueError(f"{what}: expected shape (batch, seq_len), got {a.shape}")
    return np.ascontiguousarray(a)


def float32_in(values, shape, what):
    """A C-contiguous float32 array of exactly ``shape`` from an array-like."""
    a = np.ascontiguousarray(values, dtype=np.float32)
    if a.shape != tuple(shape):
        raise ValueError(f"{what}: expected shape {tuple(shape)}, got {a.shape}")
    return a


def ptr(array, ctype):
    """A ctypes pointer to the data of a contiguous numpy array."""
    return array.ctypes.data_as(ctypes.POINTER(ctype))
