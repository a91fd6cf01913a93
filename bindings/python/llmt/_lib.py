"""Finds and loads libllmt, checks its version, and declares the argument and
result types of every function of the C API (the LLMT_API declarations of
include/llmt/*.h; tests/test_sync.py holds the two sets equal).

The library is looked for, in order:

1. ``$LLMT_LIBRARY``, a path to the shared library (an error if it fails);
2. ``libllmt.so.0`` next to this package (a copy bundled into it);
3. the installed prefix: ``cmake --install`` writes ``_installed.py`` into the
   package it installs, recording the library directory relative to it;
4. a build tree: walking up from this package, the first directory that has
   ``build*/lib/libllmt.so.0``; of those, the newest whose build is not
   sanitized (its CMakeCache.txt does not say ``LLMT_SANITIZE:BOOL=ON``);
5. the system: ``libllmt.so.0`` through the dynamic loader's search path, then
   in ``pkg-config --variable=libdir llmt``, then
   ``ctypes.util.find_library("llmt")``.
"""
import ctypes
import ctypes.util
import glob
import os
import subprocess
import threading
from ctypes import (POINTER, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t,
                    c_uint32, c_uint64, c_void_p)

from . import _structs as S
from .errors import error_for

SONAME = "libllmt.so.0"


def _sanitized(build_dir):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8",
                  errors="replace") as f:
            return any(line.strip() == "LLMT_SANITIZE:BOOL=ON" for line in f)
    except OSError:
        return False


def _build_tree_library(start):
    """The newest unsanitized build*/lib/libllmt.so.0 of the nearest ancestor
    of ``start`` that has any, or None."""
    here = os.path.abspath(start)
    while True:
        found = [p for p in glob.glob(os.path.join(here, "build*", "lib", SONAME))
                 if os.path.exists(p) and not _sanitized(os.path.dirname(os.path.dirname(p)))]
        if found:
            return max(found, key=lambda p: os.stat(p).st_mtime)
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _installed_library(package_dir):
    """The library of the prefix this package was installed into by
    ``cmake --install`` (recorded in _installed.py), or None."""
    try:
        from . import _installed
    except ImportError:
        return None
    return os.path.join(package_dir, _installed.LIBDIR, SONAME)


def _pkg_config_library():
    """libllmt.so.0 in the libdir pkg-config gives for llmt, or None."""
    try:
        result = subprocess.run(["pkg-config", "--variable=libdir", "llmt"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = result.stdout.strip()
    return os.path.join(libdir, SONAME) if result.returncode == 0 and libdir else None


def _candidates():
    """(path or name, is_explicit) in search order; lazily, so pkg-config runs
    only when the earlier candidates failed."""
    env = os.environ.get("LLMT_LIBRARY")
    if env:
        yield env, True
        return
    package_dir = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(package_dir, SONAME)
    if os.path.exists(bundled):
        yield bundled, False
    installed = _installed_library(package_dir)
    if installed:
        yield installed, False
    built = _build_tree_library(package_dir)
    if built:
        yield built, False
    yield SONAME, False
    configured = _pkg_config_library()
    if configured:
        yield configured, False
    system = ctypes.util.find_library("llmt")
    if system:
        yield system, False


def _load():
    errors = []
    for name, explicit in _candidates():
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            if explicit:
                raise ImportError(f"llmt: cannot load LLMT_LIBRARY={name}: {e}") from None
            errors.append(f"{name}: {e}")
    raise ImportError("llmt: libllmt not found; set LLMT_LIBRARY to the path of libllmt.so.0 "
                      "(tried " + "; ".join(errors) + ")")


_cdll, path = _load()
_cdll.llmt_version_number.restype = c_uint32
_cdll.llmt_version_number.argtypes = []
_cdll.llmt_version_string.restype = c_char_p
_cdll.llmt_version_string.argtypes = []
if _cdll.llmt_version_number() != S.VERSION_NUMBER:
    raise ImportError(
        f"llmt: {path} is libllmt {_cdll.llmt_version_string().decode()} "
        f"(version number {_cdll.llmt_version_number()}); this binding was written for 0.1.0 "
        f"(version number {S.VERSION_NUMBER})")


def _p(t):
    return POINTER(t)


def _pp(t):
    return POINTER(POINTER(t))


# Marks a function that returns an llmt status code (or a non-negative value
# and a negative status on failure): a negative result raises LlmtError.
STATUS = object()

# Handle and array pointer types.
CTX, MODEL, SCALER, OPT = (_p(S.llmt_context), _p(S.llmt_model), _p(S.llmt_loss_scaler),
                           _p(S.llmt_optimizer))
RC, SLICER, LOADER, STORE, TRAINER = (_p(S.llmt_recompute), _p(S.llmt_slicer), _p(S.llmt_loader),
                                      _p(S.llmt_ckpt_store), _p(S.llmt_trainer))
COMM = _p(S.llmt_comm)
I32P, I64P, F32P, F64P, SIZEP = _p(c_int32), _p(c_int64), _p(c_float), _p(c_double), _p(c_size_t)

# name: (result, [arguments]), in the order of the headers.
FUNCTIONS = {
    # common.h
    "llmt_status_string": (c_char_p, [c_int]),
    "llmt_error_last": (c_char_p, []),
    "llmt_error_clear": (None, []),
    "llmt_error_set": (c_int, [c_int, c_char_p]),
    "llmt_dtype_size": (c_size_t, [c_int]),
    "llmt_dtype_name": (c_char_p, [c_int]),
    "llmt_version_number": (c_uint32, []),
    "llmt_version_string": (c_char_p, []),
    # comm.h
    "llmt_comm_ops_init": (None, [_p(S.llmt_comm_ops)]),
    "llmt_comm_create": (STATUS, [_pp(S.llmt_comm), _p(S.llmt_comm_ops)]),
    "llmt_comm_free": (None, [COMM]),
    "llmt_comm_rank": (c_int32, [COMM]),
    "llmt_comm_size": (c_int32, [COMM]),
    "llmt_comm_bytes_sent": (c_int64, [COMM]),
    "llmt_comm_check_same": (STATUS, [COMM, c_char_p, c_uint64]),
    "llmt_comm_agree": (STATUS, [COMM, c_int]),
    "llmt_comm_nccl_unique_id": (STATUS, [CTX, c_void_p]),
    "llmt_comm_create_nccl": (STATUS, [_pp(S.llmt_comm), CTX, c_void_p, c_int32, c_int32]),
    # context.h
    "llmt_mem_category_name": (c_char_p, [c_int]),
    "llmt_context_config_init": (None, [_p(S.llmt_context_config)]),
    "llmt_context_create": (STATUS, [_pp(S.llmt_context), _p(S.llmt_context_config)]),
    "llmt_context_free": (None, [CTX]),
    "llmt_context_backend": (c_int, [CTX]),
    "llmt_context_num_threads": (c_int, [CTX]),
    "llmt_context_memory_stats": (STATUS, [CTX, _p(S.llmt_memory_stats)]),
    "llmt_context_reset_peak": (STATUS, [CTX]),
    "llmt_context_set_budget": (STATUS, [CTX, c_uint64]),
    "llmt_context_set_host_budget": (STATUS, [CTX, c_uint64]),
    "llmt_context_rng_get": (STATUS, [CTX, _p(S.llmt_rng_state)]),
    "llmt_context_rng_set": (STATUS, [CTX, _p(S.llmt_rng_state)]),
    "llmt_context_rng_uniform": (STATUS, [CTX, F32P, c_size_t]),
    # model.h
    "llmt_model_config_init": (None, [_p(S.llmt_model_config)]),
    "llmt_model_create": (STATUS, [_pp(S.llmt_model), CTX, _p(S.llmt_model_config)]),
    "llmt_model_create_from_file": (STATUS, [_pp(S.llmt_model), CTX, c_char_p, c_int32]),
    "llmt_model_create_from_hf": (STATUS, [_pp(S.llmt_model), CTX, c_char_p, c_int32,
                                           c_char_p, c_size_t]),
    "llmt_hf_export_options_init": (None, [_p(S.llmt_hf_export_options)]),
    "llmt_model_export_hf": (STATUS, [MODEL, c_char_p, _p(S.llmt_hf_export_options)]),
    "llmt_model_free": (None, [MODEL]),
    "llmt_model_get_config": (STATUS, [MODEL, _p(S.llmt_model_config)]),
    "llmt_model_num_params": (c_int64, [MODEL]),
    "llmt_model_forward_backward": (STATUS, [MODEL, I32P, I32P, c_int32, c_int32, c_double,
                                             c_double, F64P]),
    "llmt_model_forward": (STATUS, [MODEL, I32P, I32P, c_int32, c_int32, F64P]),
    "llmt_model_logits": (STATUS, [MODEL, I32P, c_int32, c_int32, F32P, c_size_t]),
    "llmt_model_reserve_activations": (STATUS, [MODEL, c_int32, c_int32]),
    "llmt_model_release_activations": (STATUS, [MODEL]),
    "llmt_model_zero_grads": (STATUS, [MODEL]),
    "llmt_model_num_tensors": (c_int32, [MODEL]),
    "llmt_model_tensor_info": (STATUS, [MODEL, c_int32, _p(S.llmt_tensor_info)]),
    "llmt_model_tensor_find": (STATUS, [MODEL, c_char_p, I32P]),
    "llmt_model_get_param": (STATUS, [MODEL, c_char_p, F32P, c_size_t]),
    "llmt_model_set_param": (STATUS, [MODEL, c_char_p, F32P, c_size_t]),
    "llmt_model_get_grad": (STATUS, [MODEL, c_char_p, F32P, c_size_t]),
    "llmt_model_set_grad": (STATUS, [MODEL, c_char_p, F32P, c_size_t]),
    "llmt_model_save_safetensors": (STATUS, [MODEL, c_char_p, c_int]),
    "llmt_model_load_safetensors": (STATUS, [MODEL, c_char_p]),
    # generate.h
    "llmt_generator_config_init": (None, [_p(S.llmt_generator_config)]),
    "llmt_generator_create": (STATUS, [_pp(S.llmt_generator), MODEL,
                                       _p(S.llmt_generator_config)]),
    "llmt_generator_free": (None, [_p(S.llmt_generator)]),
    "llmt_generator_reset": (STATUS, [_p(S.llmt_generator)]),
    "llmt_generator_position": (STATUS, [_p(S.llmt_generator), I32P]),
    "llmt_generator_feed": (STATUS, [_p(S.llmt_generator), I32P, c_int32, F32P, c_size_t]),
    "llmt_generator_generate": (STATUS, [_p(S.llmt_generator), I32P, c_int32, c_int32, c_int32,
                                         I32P, c_size_t, I32P]),
    # loss_scaler.h
    "llmt_loss_scaler_config_init": (None, [_p(S.llmt_loss_scaler_config)]),
    "llmt_loss_scaler_create": (STATUS, [_pp(S.llmt_loss_scaler), _p(S.llmt_loss_scaler_config)]),
    "llmt_loss_scaler_free": (None, [SCALER]),
    "llmt_loss_scaler_scale": (c_double, [SCALER]),
    "llmt_loss_scaler_update": (STATUS, [SCALER, c_int32]),
    "llmt_loss_scaler_get_state": (STATUS, [SCALER, _p(S.llmt_loss_scaler_state)]),
    "llmt_loss_scaler_set_state": (STATUS, [SCALER, _p(S.llmt_loss_scaler_state)]),
    "llmt_loss_scaler_get_config": (STATUS, [SCALER, _p(S.llmt_loss_scaler_config)]),
    # optimizer.h
    "llmt_optimizer_config_init": (None, [_p(S.llmt_optimizer_config)]),
    "llmt_optimizer_create": (STATUS, [_pp(S.llmt_optimizer), MODEL, _p(S.llmt_optimizer_config)]),
    "llmt_optimizer_create_sharded": (STATUS, [_pp(S.llmt_optimizer), MODEL,
                                               _p(S.llmt_optimizer_config), COMM, c_int32]),
    "llmt_optimizer_shard": (STATUS, [OPT, I64P, I64P]),
    "llmt_optimizer_free": (None, [OPT]),
    "llmt_optimizer_set_offload": (STATUS, [OPT, c_int32, c_int32]),
    "llmt_optimizer_get_offload": (STATUS, [OPT, I32P, I32P]),
    "llmt_optimizer_set": (STATUS, [OPT, c_int, c_double]),
    "llmt_optimizer_set_settings": (STATUS, [OPT, _p(S.llmt_optimizer_config)]),
    "llmt_optimizer_get": (STATUS, [OPT, c_int, F64P]),
    "llmt_optimizer_get_config": (STATUS, [OPT, _p(S.llmt_optimizer_config)]),
    "llmt_optimizer_lr": (c_double, [OPT]),
    "llmt_optimizer_step": (STATUS, [OPT, SCALER, _p(S.llmt_update_report)]),
    "llmt_optimizer_step_count": (c_int64, [OPT]),
    "llmt_optimizer_set_step_count": (STATUS, [OPT, c_int64]),
    "llmt_optimizer_state_dtype": (c_int32, [OPT, c_int]),
    "llmt_optimizer_get_state": (STATUS, [OPT, c_int, c_char_p, F32P, c_size_t]),
    "llmt_optimizer_set_state": (STATUS, [OPT, c_int, c_char_p, F32P, c_size_t]),
    # recompute.h
    "llmt_recompute_create": (STATUS, [_pp(S.llmt_recompute), MODEL]),
    "llmt_recompute_free": (None, [RC]),
    "llmt_recompute_set_layers": (STATUS, [RC, c_int32, c_int32, c_int32]),
    "llmt_recompute_get_layer": (STATUS, [RC, c_int32]),
    "llmt_recompute_policy_name": (c_char_p, [c_int32]),
    # slicer.h
    "llmt_slicer_create": (STATUS, [_pp(S.llmt_slicer), MODEL, c_int32]),
    "llmt_slicer_free": (None, [SLICER]),
    "llmt_slicer_set_micro_batch": (STATUS, [SLICER, c_int32]),
    "llmt_slicer_micro_batch": (c_int32, [SLICER]),
    "llmt_slicer_set_accumulation": (STATUS, [SLICER, c_int32]),
    "llmt_slicer_accumulation": (c_int32, [SLICER]),
    "llmt_slicer_forward_backward": (STATUS, [SLICER, I32P, I32P, c_int32, c_int32, c_double,
                                              F64P]),
    # plan.h
    "llmt_plan_config_init": (None, [_p(S.llmt_plan_config)]),
    "llmt_plan_compute": (STATUS, [CTX, _p(S.llmt_plan_config), _p(S.llmt_plan)]),
    "llmt_plan_compute_backend": (STATUS, [c_int32, c_int32, _p(S.llmt_plan_config),
                                           _p(S.llmt_plan)]),
    "llmt_plan_fit": (STATUS, [CTX, _p(S.llmt_plan_config), c_uint64, I32P, I32P]),
    "llmt_plan_fit_backend": (STATUS, [c_int32, c_int32, _p(S.llmt_plan_config), c_uint64,
                                       I32P, I32P]),
    "llmt_plan_fit_offload": (STATUS, [CTX, _p(S.llmt_plan_config), c_uint64, I32P, I32P,
                                       I32P]),
    "llmt_plan_fit_offload_backend": (STATUS, [c_int32, c_int32, _p(S.llmt_plan_config),
                                               c_uint64, I32P, I32P, I32P]),
    # config.h
    "llmt_train_config_init": (None, [_p(S.llmt_train_config)]),
    "llmt_train_config_parse_yaml": (STATUS, [_p(S.llmt_train_config), c_char_p, c_size_t,
                                              c_char_p]),
    "llmt_train_config_load_yaml": (STATUS, [_p(S.llmt_train_config), c_char_p]),
    "llmt_train_config_set": (STATUS, [_p(S.llmt_train_config), c_char_p, c_char_p]),
    "llmt_train_config_check": (STATUS, [_p(S.llmt_train_config)]),
    "llmt_train_config_to_yaml": (STATUS, [_p(S.llmt_train_config), c_char_p, c_size_t, SIZEP]),
    # trainer.h
    "llmt_trainer_config_init": (None, [_p(S.llmt_trainer_config)]),
    "llmt_trainer_create": (STATUS, [_pp(S.llmt_trainer), _p(S.llmt_trainer_parts),
                                     _p(S.llmt_trainer_config)]),
    "llmt_trainer_create_from_config": (STATUS, [_pp(S.llmt_trainer), CTX,
                                                 _p(S.llmt_train_config)]),
    "llmt_trainer_create_from_config_dist": (STATUS, [_pp(S.llmt_trainer), CTX,
                                                      _p(S.llmt_train_config), COMM]),
    "llmt_trainer_free": (None, [TRAINER]),
    "llmt_trainer_step": (STATUS, [TRAINER, _p(S.llmt_step_report)]),
    "llmt_trainer_set_callback": (STATUS, [TRAINER, S.llmt_step_callback, c_void_p]),
    "llmt_trainer_set_log": (STATUS, [TRAINER, S.llmt_log_callback, c_void_p]),
    "llmt_trainer_run": (STATUS, [TRAINER, c_int64]),
    "llmt_trainer_resume_latest": (STATUS, [TRAINER, I64P]),
    "llmt_trainer_save": (STATUS, [TRAINER, c_int32]),
    "llmt_trainer_evaluate": (STATUS, [TRAINER, F64P]),
    "llmt_trainer_step_index": (c_int64, [TRAINER]),
    "llmt_trainer_model": (MODEL, [TRAINER]),
    "llmt_trainer_context": (CTX, [TRAINER]),
    "llmt_trainer_optimizer": (OPT, [TRAINER]),
    # data.h
    "llmt_shard_write": (STATUS, [c_char_p, I32P, c_size_t, c_int32]),
    "llmt_byte_encode": (STATUS, [c_void_p, c_size_t, I32P, c_size_t, SIZEP]),
    "llmt_byte_decode": (STATUS, [I32P, c_size_t, c_void_p, c_size_t, SIZEP]),
    "llmt_byte_tokenize_files": (STATUS, [_p(c_char_p), c_size_t, c_char_p, c_char_p, c_uint64,
                                          c_double, _p(S.llmt_tokenize_report)]),
    "llmt_loader_config_init": (None, [_p(S.llmt_loader_config)]),
    "llmt_loader_open": (STATUS, [_pp(S.llmt_loader), CTX, _p(c_char_p), c_size_t,
                                  _p(S.llmt_loader_config)]),
    "llmt_loader_open_glob": (STATUS, [_pp(S.llmt_loader), CTX, c_char_p,
                                       _p(S.llmt_loader_config)]),
    "llmt_loader_free": (None, [LOADER]),
    "llmt_loader_next": (STATUS, [LOADER, I32P, I32P, c_size_t]),
    "llmt_loader_get_state": (STATUS, [LOADER, _p(S.llmt_loader_state)]),
    "llmt_loader_set_state": (STATUS, [LOADER, _p(S.llmt_loader_state)]),
    "llmt_loader_epoch": (STATUS, [LOADER, _p(c_uint64)]),
    "llmt_loader_windows_per_epoch": (STATUS, [LOADER, _p(c_uint64)]),
    "llmt_loader_tokens_per_epoch": (STATUS, [LOADER, _p(c_uint64)]),
    "llmt_loader_num_shards": (STATUS, [LOADER, _p(c_uint64)]),
    # checkpoint.h
    "llmt_ckpt_store_config_init": (None, [_p(S.llmt_ckpt_store_config)]),
    "llmt_ckpt_store_open": (STATUS, [_pp(S.llmt_ckpt_store), CTX, c_char_p,
                                      _p(S.llmt_ckpt_store_config)]),
    "llmt_ckpt_store_free": (None, [STORE]),
    "llmt_ckpt_save": (STATUS, [STORE, _p(S.llmt_train_state), c_int32]),
    "llmt_ckpt_save_async": (STATUS, [STORE, _p(S.llmt_train_state), c_int32]),
    "llmt_ckpt_wait": (STATUS, [STORE]),
    "llmt_ckpt_list": (STATUS, [STORE, c_int32, I64P, c_size_t, SIZEP]),
    "llmt_ckpt_verify": (STATUS, [STORE, c_int64, c_int32]),
    "llmt_ckpt_latest": (STATUS, [STORE, I64P, I32P, c_char_p, c_size_t]),
    "llmt_ckpt_load": (STATUS, [STORE, c_int64, c_int32, _p(S.llmt_train_state), c_void_p,
                                c_size_t, SIZEP]),
    "llmt_ckpt_set_aside_invalid": (STATUS, [STORE, SIZEP, c_char_p, c_size_t]),
    "llmt_ckpt_path": (STATUS, [STORE, c_int64, c_int32, c_char_p, c_size_t, SIZEP]),
    "llmt_ckpt_consolidate": (STATUS, [STORE, c_int64, c_int32, c_char_p]),
    "llmt_ckpt_get_info": (STATUS, [STORE, c_int64, c_int32, _p(S.llmt_ckpt_info)]),
}


def last_error():
    """The calling thread's libllmt message for its last failure ("" if none)."""
    return _cdll.llmt_error_last().decode("utf-8", errors="replace")


# The first exception a Python communicator callback (llmt.comm) caught on
# this thread since the last checked call: the cause of the error that call
# returns (callbacks must not raise through C). Cleared by every checked call.
_callback_error = threading.local()


def note_callback_error(error):
    """Keeps ``error`` for the checked call in progress on this thread."""
    if getattr(_callback_error, "value", None) is None:
        _callback_error.value = error


def _check(result, func, args):
    cause = getattr(_callback_error, "value", None)
    if cause is not None:
        _callback_error.value = None
    if result < 0:
        message = last_error() or _cdll.llmt_status_string(result).decode()
        if cause is not None and not isinstance(cause, Exception):
            raise cause  # KeyboardInterrupt, SystemExit: as they were raised
        if cause is not None:
            message = f"{message} (in the callback: {type(cause).__name__}: {cause})"
        raise error_for(result, message) from cause
    return result


class _Functions:
    """The declared C functions as attributes (``lib.llmt_model_create``)."""


def _declare():
    lib = _Functions()
    missing = []
    for name, (result, arguments) in FUNCTIONS.items():
        try:
            fn = getattr(_cdll, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.argtypes = arguments
        if result is STATUS:
            fn.restype = c_int
            fn.errcheck = _check
        else:
            fn.restype = result
        setattr(lib, name, fn)
    if missing:
        raise ImportError(f"llmt: {path} lacks functions this binding declares: "
                          + ", ".join(missing))
    return lib


lib = _declare()
