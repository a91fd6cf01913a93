"""libllmt from Python: train LLaMA-family models when memory is the limit.

A ctypes binding over the C library (found as described in ``llmt._lib``).
Objects over C handles (Context, Model, ...) free their C object on
``close()``, at the end of a ``with`` block, or when collected, always after
the objects made from them. Failures raise LlmtError subclasses carrying the
library's message.

    import llmt
    with llmt.Context(backend="cpu") as ctx:
        tr = llmt.Trainer.from_yaml(ctx, "tiny.yaml")
        tr.resume_latest()
        for report in tr.run(steps=1000):
            print(report.step, report.loss, report.memory["activations"])
"""
from ._convert import recompute_policy_name
from ._lib import lib as _c
from ._lib import path as library_path
from ._structs import BYTE_VOCAB, TOKEN_EOT
from .checkpoint import CheckpointInfo, CheckpointStore, Latest, Loaded
from .comm import Comm
from .config import TrainConfig
from .context import CATEGORIES, Context, RngState
from .data import (Loader, LoaderState, TokenizeReport, byte_decode, byte_encode, shard_write,
                   tokenize_files)
from .errors import (Busy, CommError, ConfigWarning, CorruptData, CudaError, InvalidArgument, IOFailure,
                     LlmtError, NotFound, OutOfMemory, StateError, Unsupported, VersionError)
from .generate import Generator, decode_bytes, generate
from .model import Model, Recompute, Slicer
from .optim import LossScaler, LossScalerState, Optimizer, UpdateReport
from .plan import Plan, plan, plan_fit, plan_fit_offload
from .trainer import StepReport, Trainer

__version__ = "0.1.0"
#: The path (or name) libllmt was loaded from, and its version string.
library_version = _c.llmt_version_string().decode()

__all__ = [
    "BYTE_VOCAB", "Busy", "CATEGORIES", "Comm", "CommError", "CheckpointInfo", "CheckpointStore", "ConfigWarning", "Context", "CorruptData",
    "CudaError", "Generator", "IOFailure", "InvalidArgument", "Latest", "LlmtError", "Loaded", "Loader",
    "LoaderState", "LossScaler", "LossScalerState", "Model", "NotFound", "Optimizer",
    "OutOfMemory", "Plan", "Recompute", "RngState", "Slicer", "StateError", "StepReport",
    "TOKEN_EOT", "TokenizeReport", "TrainConfig", "Trainer", "Unsupported", "UpdateReport",
    "VersionError", "byte_decode", "byte_encode", "decode_bytes", "generate", "library_path", "library_version", "plan",
    "plan_fit", "plan_fit_offload", "recompute_policy_name", "shard_write", "tokenize_files",
]
