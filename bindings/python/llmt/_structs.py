"""ctypes mirrors of the public C types of libllmt (include/llmt/*.h).

Field order and types follow the headers exactly; ``tests/test_sync.py``
compiles a C program against the headers and compares every size and
offset. Each versioned struct carries its header's version as ``VERSION``.
"""
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p)

# Constants of the headers this binding was written for.
VERSION_NUMBER = 100               # LLMT_VERSION_NUMBER of 0.1.0
MEM_CATEGORY_SLOTS = 8             # LLMT_MEM_CATEGORY_SLOTS
MEM_CATEGORY_COUNT = 7             # LLMT_MEM_CATEGORY_COUNT
CONFIG_PATH_MAX = 1024             # LLMT_CONFIG_PATH_MAX
BYTE_VOCAB = 257                   # LLMT_BYTE_VOCAB
TOKEN_EOT = 256                    # LLMT_TOKEN_EOT
SHARD_VERSION_U16 = 1              # LLMT_SHARD_VERSION_U16
SHARD_VERSION_U32 = 2              # LLMT_SHARD_VERSION_U32


# ---- opaque handles

class llmt_context(Structure):
    """Opaque ``llmt_context``."""


class llmt_comm(Structure):
    """Opaque ``llmt_comm``."""


class llmt_model(Structure):
    """Opaque ``llmt_model``."""


class llmt_loss_scaler(Structure):
    """Opaque ``llmt_loss_scaler``."""


class llmt_optimizer(Structure):
    """Opaque ``llmt_optimizer``."""


class llmt_recompute(Structure):
    """Opaque ``llmt_recompute``."""


class llmt_slicer(Structure):
    """Opaque ``llmt_slicer``."""


class llmt_loader(Structure):
    """Opaque ``llmt_loader``."""


class llmt_ckpt_store(Structure):
    """Opaque ``llmt_ckpt_store``."""


class llmt_trainer(Structure):
    """Opaque ``llmt_trainer``."""


class llmt_generator(Structure):
    """Opaque ``llmt_generator``."""


# ---- context.h

class llmt_context_config(Structure):
    VERSION = 2
    _fields_ = [("version", c_uint32), ("backend", c_int32), ("device", c_int32),
                ("num_threads", c_int32), ("memory_budget", c_uint64), ("seed", c_uint64),
                ("host_memory_budget", c_uint64)]


class llmt_memory_stats(Structure):
    VERSION = 2
    _fields_ = [("version", c_uint32), ("category_count", c_uint32),
                ("current", c_uint64 * MEM_CATEGORY_SLOTS),
                ("peak", c_uint64 * MEM_CATEGORY_SLOTS),
                ("total_current", c_uint64), ("total_peak", c_uint64), ("budget", c_uint64),
                ("device_total", c_uint64), ("device_free", c_uint64),
                ("host_budget", c_uint64)]


class llmt_rng_state(Structure):
    _fields_ = [("seed", c_uint64), ("stream", c_uint64), ("offset", c_uint64)]


# ---- model.h

class llmt_model_config(Structure):
    VERSION = 2
    _fields_ = [("version", c_uint32), ("vocab_size", c_int32), ("hidden_size", c_int32),
                ("num_layers", c_int32), ("num_heads", c_int32), ("num_kv_heads", c_int32),
                ("ffn_size", c_int32), ("max_seq_len", c_int32), ("rms_norm_eps", c_float),
                ("rope_theta", c_float), ("tie_embeddings", c_int32), ("precision", c_int32),
                ("rope_scaling", c_int32), ("rope_factor", c_float),
                ("rope_low_freq_factor", c_float), ("rope_high_freq_factor", c_float),
                ("rope_original_max_len", c_int32)]


# ---- generate.h

class llmt_generator_config(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("max_context", c_int32), ("temperature", c_float),
                ("top_k", c_int32), ("top_p", c_float), ("seed", c_uint64)]


class llmt_hf_export_options(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("dtype", c_int32), ("max_shard_bytes", c_uint64),
                ("tokenizer_dir", c_char_p), ("bos_token_id", c_int32),
                ("eos_token_id", c_int32)]


class llmt_tensor_info(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("name", c_char_p), ("ndim", c_int32),
                ("shape", c_int64 * 4), ("numel", c_int64), ("dtype", c_int32)]


# ---- loss_scaler.h

class llmt_loss_scaler_config(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("dynamic", c_int32), ("init_scale", c_double),
                ("growth_factor", c_double), ("backoff_factor", c_double),
                ("growth_interval", c_int64), ("min_scale", c_double), ("max_scale", c_double)]


class llmt_loss_scaler_state(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("scale", c_double), ("clean_steps", c_int64),
                ("skipped_steps", c_int64)]


# ---- optimizer.h

class llmt_optimizer_config(Structure):
    VERSION = 2
    _fields_ = [("version", c_uint32), ("lr", c_double), ("beta1", c_double),
                ("beta2", c_double), ("eps", c_double), ("weight_decay", c_double),
                ("decay_norms", c_int32), ("grad_clip", c_double), ("schedule", c_int32),
                ("warmup_steps", c_int64), ("total_steps", c_int64), ("min_lr", c_double),
                ("offload_parts", c_int32), ("offload_layers", c_int32)]


class llmt_update_report(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("step", c_int64), ("skipped", c_int32),
                ("grad_norm", c_double), ("lr", c_double), ("loss_scale", c_double)]


# ---- plan.h

class llmt_plan_config(Structure):
    VERSION = 5
    _fields_ = [("version", c_uint32), ("model", llmt_model_config), ("recompute", c_int32),
                ("layer_recompute", POINTER(c_int32)), ("micro_batch", c_int32),
                ("seq_len", c_int32), ("with_optimizer", c_int32), ("world_size", c_int32),
                ("rank", c_int32), ("batch_size", c_int32), ("ordered_accumulation", c_int32),
                ("offload_parts", c_int32), ("offload_layers", c_int32),
                ("host_budget", c_uint64), ("reduce_mode", c_int32)]


class llmt_plan(Structure):
    VERSION = 3
    _fields_ = [("version", c_uint32), ("bytes", c_uint64 * MEM_CATEGORY_SLOTS),
                ("peak", c_uint64), ("num_params", c_int64), ("rank", c_int32),
                ("shard_first", c_int64), ("shard_end", c_int64), ("host_peak", c_uint64)]


# ---- config.h

class llmt_train_config(Structure):
    VERSION = 4
    _fields_ = [("version", c_uint32),
                ("model", llmt_model_config), ("optimizer", llmt_optimizer_config),
                ("loss_scale", llmt_loss_scaler_config), ("recompute", c_int32),
                ("batch_size", c_int32), ("micro_batch", c_int32), ("seq_len", c_int32),
                ("train_data", c_char * CONFIG_PATH_MAX), ("val_data", c_char * CONFIG_PATH_MAX),
                ("shuffle", c_int32),
                ("steps", c_int64), ("eval_every", c_int64), ("eval_batches", c_int32),
                ("log_every", c_int64), ("metrics", c_char * CONFIG_PATH_MAX),
                ("seed", c_uint64), ("threads", c_int32), ("backend", c_int32),
                ("device", c_int32),
                ("checkpoint_dir", c_char * CONFIG_PATH_MAX), ("checkpoint_every", c_int64),
                ("checkpoint_keep", c_int32), ("checkpoint_async", c_int32),
                ("fast_checkpoint_dir", c_char * CONFIG_PATH_MAX),
                ("fast_checkpoint_every", c_int64), ("fast_checkpoint_keep", c_int32),
                ("memory_budget", c_uint64), ("memory_threshold", c_double),
                ("adaptive", c_int32), ("dist_reduce", c_int32),
                ("accumulation", c_int32), ("memory_host_budget", c_uint64)]


# ---- data.h

class llmt_tokenize_report(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("files", c_uint64), ("bytes", c_uint64),
                ("train_tokens", c_uint64), ("val_tokens", c_uint64),
                ("train_shards", c_uint32), ("val_shards", c_uint32)]


class llmt_loader_config(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("batch_size", c_int32), ("seq_len", c_int32),
                ("vocab_size", c_int32), ("shuffle", c_int32)]


class llmt_loader_state(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("epoch", c_uint64), ("shard_cursor", c_uint64),
                ("window_cursor", c_uint64), ("windows_consumed", c_uint64),
                ("seed", c_uint64), ("fingerprint", c_uint64)]


# ---- checkpoint.h

class llmt_ckpt_store_config(Structure):
    VERSION = 2
    _fields_ = [("version", c_uint32), ("keep", c_int32), ("sync", c_int32),
                ("fast_dir", c_char_p), ("fast_keep", c_int32), ("read_only", c_int32)]


class llmt_train_state(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("model", POINTER(llmt_model)),
                ("optimizer", POINTER(llmt_optimizer)), ("scaler", POINTER(llmt_loss_scaler)),
                ("loader", POINTER(llmt_loader)), ("step", c_int64), ("tokens_seen", c_int64),
                ("user_blob", c_void_p), ("user_blob_size", c_size_t),
                ("config_yaml", c_char_p)]


class llmt_ckpt_info(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("step", c_int64), ("epoch", c_int64),
                ("tokens_seen", c_int64), ("format_version", c_int32),
                ("library_version", c_char * 32), ("model", llmt_model_config),
                ("has_optimizer", c_int32), ("has_scaler", c_int32), ("has_data", c_int32),
                ("optimizer_steps", c_int64), ("world_size", c_int32), ("num_files", c_int32),
                ("total_bytes", c_uint64)]


# ---- trainer.h

class llmt_trainer_parts(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("model", POINTER(llmt_model)),
                ("optimizer", POINTER(llmt_optimizer)), ("scaler", POINTER(llmt_loss_scaler)),
                ("recompute", POINTER(llmt_recompute)), ("slicer", POINTER(llmt_slicer)),
                ("loader", POINTER(llmt_loader)), ("eval_loader", POINTER(llmt_loader)),
                ("store", POINTER(llmt_ckpt_store))]


class llmt_trainer_config(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("batch_size", c_int32), ("seq_len", c_int32),
                ("total_steps", c_int64), ("eval_every", c_int64), ("eval_batches", c_int32),
                ("checkpoint_every", c_int64), ("fast_checkpoint_every", c_int64),
                ("checkpoint_async", c_int32), ("metrics_path", c_char_p),
                ("config_yaml", c_char_p), ("adaptive", c_int32),
                ("memory_threshold", c_double), ("hysteresis", c_double),
                ("relax_window", c_int32), ("capacity", c_uint64)]


class llmt_step_report(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("step", c_int64), ("loss", c_double),
                ("grad_norm", c_double), ("lr", c_double), ("loss_scale", c_double),
                ("skipped", c_int32), ("seconds", c_double), ("tokens_per_second", c_double),
                ("micro_batch", c_int32), ("recompute", c_int32),
                ("recompute_layers", c_int32), ("retries", c_int32),
                ("mem_current", c_uint64 * MEM_CATEGORY_SLOTS), ("mem_peak", c_uint64),
                ("mem_ratio", c_double), ("capacity", c_uint64), ("eval_loss", c_double),
                ("checkpointed", c_int32), ("tokens_seen", c_int64)]


# typedef int (*llmt_step_callback)(void *user, const llmt_step_report *report);
llmt_step_callback = CFUNCTYPE(c_int, c_void_p, POINTER(llmt_step_report))

# ---- comm.h

_SIZES = POINTER(c_size_t)
llmt_comm_alltoallv_fn = CFUNCTYPE(c_int, c_void_p, c_void_p, _SIZES, _SIZES, c_void_p, _SIZES,
                                   _SIZES)
llmt_comm_allgatherv_fn = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, _SIZES, _SIZES)
llmt_comm_broadcast_fn = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_int32)
llmt_comm_allreduce_i64_fn = CFUNCTYPE(c_int, c_void_p, POINTER(c_int64), c_size_t, c_int32)
llmt_comm_barrier_fn = CFUNCTYPE(c_int, c_void_p)


class llmt_comm_ops(Structure):
    VERSION = 1
    _fields_ = [("version", c_uint32), ("rank", c_int32), ("size", c_int32), ("user", c_void_p),
                ("alltoallv", llmt_comm_alltoallv_fn), ("allgatherv", llmt_comm_allgatherv_fn),
                ("broadcast", llmt_comm_broadcast_fn),
                ("allreduce_i64", llmt_comm_allreduce_i64_fn),
                ("barrier", llmt_comm_barrier_fn)]
# typedef void (*llmt_log_callback)(void *user, const char *line);
llmt_log_callback = CFUNCTYPE(None, c_void_p, c_char_p)

# Every struct whose layout the sync test checks against the headers.
STRUCTS = (llmt_comm_ops, llmt_context_config, llmt_memory_stats, llmt_rng_state, llmt_model_config,
           llmt_tensor_info, llmt_hf_export_options, llmt_generator_config,
           llmt_loss_scaler_config,
           llmt_loss_scaler_state,
           llmt_optimizer_config, llmt_update_report, llmt_plan_config, llmt_plan,
           llmt_train_config, llmt_tokenize_report, llmt_loader_config, llmt_loader_state,
           llmt_ckpt_store_config, llmt_train_state, llmt_ckpt_info, llmt_trainer_parts,
           llmt_trainer_config, llmt_step_report)


def new(cls):
    """A zeroed instance of struct ``cls`` with its version field set."""
    s = cls()
    s.version = cls.VERSION
    return s

