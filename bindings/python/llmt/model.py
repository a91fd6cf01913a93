"""The model, and the recompute and slicer handles on it."""
import ctypes

import numpy as np

from . import _structs as S
from ._convert import (DTYPES, PRECISIONS, dtype_name, enum, fill_struct, float32_in,
                       init_struct, path_bytes, ptr, recompute_policy, struct_dict,
                       tokens_array)
from ._handle import Handle
from ._lib import lib

# llmt_rope_scaling, by name.
ROPE_SCALINGS = ("none", "llama3")
# llmt_accumulation, by name.
ACCUMULATIONS = ("in_place", "ordered")

_MODEL_CONVERTERS = {"precision": lambda v: enum(v, PRECISIONS, "precision"),
                     "tie_embeddings": int,
                     "rope_scaling": lambda v: enum(v, ROPE_SCALINGS, "rope_scaling")}

# Bytes of the notes buffer of llmt_model_create_from_hf.
_HF_NOTES_BYTES = 1 << 16


def model_config(source):
    """An llmt_model_config from a dict of its fields (over the defaults), a
    Model (its configuration), or None (the defaults)."""
    if isinstance(source, Model):
        cfg = S.new(S.llmt_model_config)
        lib.llmt_model_get_config(source._ptr, ctypes.byref(cfg))
        return cfg
    cfg = init_struct(S.llmt_model_config, lib.llmt_model_config_init)
    return fill_struct(cfg, dict(source or {}), "model config", _MODEL_CONVERTERS)


def _targets_for(tokens, targets):
    t = tokens_array(targets, "targets")
    if t.shape != tokens.shape:
        raise ValueError(f"targets: shape {t.shape} differs from the tokens' {tokens.shape}")
    return t


class Model(Handle):
    """A LLaMA-family model (llmt_model) on a Context.

    Keyword arguments are the fields of llmt_model_config over its defaults:
    vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, ffn_size,
    max_seq_len, rms_norm_eps, rope_theta, tie_embeddings, precision ("fp32",
    "bf16_mixed", "fp16_mixed", "bf16_pure"), rope_scaling ("none", "llama3")
    with rope_factor, rope_low_freq_factor, rope_high_freq_factor and
    rope_original_max_len. Parameters are initialised from
    the context's seed. Tokens are int32 arrays of shape (batch, seq_len);
    parameters and gradients are float32 arrays of the tensor's shape.
    """

    def __init__(self, context, **config):
        cfg = model_config(config)
        out = ctypes.POINTER(S.llmt_model)()
        lib.llmt_model_create(ctypes.byref(out), context._ptr, ctypes.byref(cfg))
        self._attach(out, lib.llmt_model_free, (context,))
        self.context = context

    @classmethod
    def from_file(cls, context, path, precision=None):
        """A model whose configuration and weights come from ``path``: a
        safetensors file carrying its configuration in ``__metadata__``
        (``save_safetensors`` and checkpoints write it) or a checkpoint
        directory (e.g. ``CheckpointStore.path(step)``), checked against its
        manifest. ``precision`` (a name as for Model) overrides the saved one."""
        code = -1 if precision is None else enum(precision, PRECISIONS, "precision")
        out = ctypes.POINTER(S.llmt_model)()
        lib.llmt_model_create_from_file(ctypes.byref(out), context._ptr, path_bytes(path), code)
        self = cls.__new__(cls)
        self._attach(out, lib.llmt_model_free, (context,))
        self.context = context
        return self

    @classmethod
    def from_hf(cls, context, path, precision=None):
        """A model from a Hugging Face directory (LlamaForCausalLM): the
        architecture from its config.json, the weights from model.safetensors
        or the shards of model.safetensors.index.json. ``precision`` (a name
        as for Model) defaults to the weights' dtype (F32: "fp32", BF16:
        "bf16_mixed", F16: "fp16_mixed"). The lines saying which tensors were
        skipped (rotary_emb.inv_freq, ...) are in ``import_notes``."""
        code = -1 if precision is None else enum(precision, PRECISIONS, "precision")
        out = ctypes.POINTER(S.llmt_model)()
        notes = ctypes.create_string_buffer(_HF_NOTES_BYTES)
        lib.llmt_model_create_from_hf(ctypes.byref(out), context._ptr, path_bytes(path), code,
                                      notes, len(notes))
        self = cls.__new__(cls)
        self._attach(out, lib.llmt_model_free, (context,))
        self.context = context
        self.import_notes = notes.value.decode("utf-8", "replace").splitlines()
        return self

    def export_hf(self, path, dtype="BF16", max_shard_bytes=0, tokenizer_dir=None,
                  bos_token_id=None, eos_token_id=None):
        """Writes a Hugging Face directory at ``path`` (which must not exist, or
        be empty) that ``LlamaForCausalLM.from_pretrained`` loads: config.json,
        the weights in ``dtype`` ("F32", "BF16" or "F16"), in shards of at most
        ``max_shard_bytes`` tensor bytes when not 0 (with
        model.safetensors.index.json), and the tokenizer files found in
        ``tokenizer_dir``. Written in a temporary directory and renamed into
        place."""
        opts = init_struct(S.llmt_hf_export_options, lib.llmt_hf_export_options_init)
        opts.dtype = enum(dtype, DTYPES, "dtype")
        opts.max_shard_bytes = int(max_shard_bytes)
        opts.tokenizer_dir = None if tokenizer_dir is None else path_bytes(tokenizer_dir)
        opts.bos_token_id = -1 if bos_token_id is None else int(bos_token_id)
        opts.eos_token_id = -1 if eos_token_id is None else int(eos_token_id)
        lib.llmt_model_export_hf(self._ptr, path_bytes(path), ctypes.byref(opts))

    @property
    def config(self):
        """The configuration as a dict of llmt_model_config fields."""
        cfg = model_config(self)
        return struct_dict(cfg, {"precision": lambda v: PRECISIONS[v],
                                 "rope_scaling": lambda v: ROPE_SCALINGS[v]})

    @property
    def num_params(self):
        """Parameters (elements), a tied embedding counted once."""
        return lib.llmt_model_num_params(self._ptr)

    def _info(self, index):
        info = S.new(S.llmt_tensor_info)
        lib.llmt_model_tensor_info(self._ptr, index, ctypes.byref(info))
        return info

    def tensors(self):
        """The parameter tensors as (name, shape, dtype name) tuples, e.g.
        ("model.embed_tokens.weight", (256, 128), "F32")."""
        out = []
        for i in range(lib.llmt_model_num_tensors(self._ptr)):
            info = self._info(i)
            out.append((info.name.decode(), tuple(info.shape[:info.ndim]),
                        dtype_name(info.dtype)))
        return out

    def tensor_index(self, name):
        """The index of the tensor with this Hugging Face name (NotFound if none)."""
        index = ctypes.c_int32()
        lib.llmt_model_tensor_find(self._ptr, name.encode(), ctypes.byref(index))
        return index.value

    def _shape(self, name):
        info = self._info(self.tensor_index(name))
        return tuple(info.shape[:info.ndim])

    def _get(self, fn, name):
        out = np.empty(self._shape(name), dtype=np.float32)
        fn(self._ptr, name.encode(), ptr(out, ctypes.c_float), out.size)
        return out

    def _set(self, fn, name, values):
        a = float32_in(values, self._shape(name), name)
        fn(self._ptr, name.encode(), ptr(a, ctypes.c_float), a.size)

    def get_param(self, name):
        """A parameter as a float32 array (widened from its storage dtype)."""
        return self._get(lib.llmt_model_get_param, name)

    def set_param(self, name, values):
        """Sets a parameter from float32 values (rounded to nearest even in
        bf16/f16 storage)."""
        self._set(lib.llmt_model_set_param, name, values)

    def get_grad(self, name):
        """A parameter's gradient as a float32 array."""
        return self._get(lib.llmt_model_get_grad, name)

    def set_grad(self, name, values):
        """Sets a parameter's gradient from float32 values."""
        self._set(lib.llmt_model_set_grad, name, values)

    def forward_backward(self, tokens, targets, grad_scale=1.0, normaliser=0.0):
        """Forward, cross-entropy and backward of one micro-batch, ADDING the
        gradient of grad_scale * sum(loss) / normaliser (<= 0: this batch's
        count of targets; -1 targets are ignored). Returns the mean loss."""
        tok = tokens_array(tokens)
        tgt = _targets_for(tok, targets)
        loss = ctypes.c_double()
        lib.llmt_model_forward_backward(self._ptr, ptr(tok, ctypes.c_int32),
                                        ptr(tgt, ctypes.c_int32), tok.shape[0], tok.shape[1],
                                        grad_scale, normaliser, ctypes.byref(loss))
        return loss.value

    def forward(self, tokens, targets):
        """The mean loss over the counted targets; gradients untouched."""
        tok = tokens_array(tokens)
        tgt = _targets_for(tok, targets)
        loss = ctypes.c_double()
        lib.llmt_model_forward(self._ptr, ptr(tok, ctypes.c_int32), ptr(tgt, ctypes.c_int32),
                               tok.shape[0], tok.shape[1], ctypes.byref(loss))
        return loss.value

    def logits(self, tokens):
        """The fp32 logits of every position: shape (batch, seq_len, vocab_size)."""
        tok = tokens_array(tokens)
        out = np.empty(tok.shape + (self.config["vocab_size"],), dtype=np.float32)
        lib.llmt_model_logits(self._ptr, ptr(tok, ctypes.c_int32), tok.shape[0], tok.shape[1],
                              ptr(out, ctypes.c_float), out.size)
        return out

    def zero_grads(self):
        """Sets every gradient to zero."""
        lib.llmt_model_zero_grads(self._ptr)

    def reserve_activations(self, batch, seq_len):
        """Allocates the activation arena for micro-batches up to batch x seq_len."""
        lib.llmt_model_reserve_activations(self._ptr, batch, seq_len)

    def release_activations(self):
        """Frees the activation arena."""
        lib.llmt_model_release_activations(self._ptr)

    def save_safetensors(self, path, dtype="F32"):
        """Writes the weights as safetensors (dtype "F32", "BF16" or "F16")."""
        lib.llmt_model_save_safetensors(self._ptr, path_bytes(path), enum(dtype, DTYPES, "dtype"))

    def load_safetensors(self, path):
        """Reads weights from a safetensors file of the same names and shapes."""
        lib.llmt_model_load_safetensors(self._ptr, path_bytes(path))


class Recompute(Handle):
    """A handle on a model's per-layer recompute policy (llmt_recompute).

    Policies are flags: an int, or "none", "attn_core", "ffn_act", "ffn",
    "full" joined by '+'. Changes take effect at the next forward.
    """

    def __init__(self, model):
        out = ctypes.POINTER(S.llmt_recompute)()
        lib.llmt_recompute_create(ctypes.byref(out), model._ptr)
        self._attach(out, lib.llmt_recompute_free, (model,))
        self.model = model

    def set_layers(self, policy, first=0, count=-1):
        """Sets the policy of layers [first, first + count) (count -1: to the last)."""
        lib.llmt_recompute_set_layers(self._ptr, first, count, recompute_policy(policy))

    def layer(self, index):
        """The policy flags of one layer."""
        return lib.llmt_recompute_get_layer(self._ptr, index)

    def policies(self):
        """The policy flags of every layer."""
        return [self.layer(i) for i in range(self.model.config["num_layers"])]


class Slicer(Handle):
    """Runs global batches as micro-batches of at most ``micro_batch``
    sequences, accumulating into the model's gradients (llmt_slicer)."""

    def __init__(self, model, micro_batch):
        out = ctypes.POINTER(S.llmt_slicer)()
        lib.llmt_slicer_create(ctypes.byref(out), model._ptr, micro_batch)
        self._attach(out, lib.llmt_slicer_free, (model,))
        self.model = model

    @property
    def micro_batch(self):
        """Sequences per forward/backward; assignable."""
        return lib.llmt_slicer_micro_batch(self._ptr)

    @micro_batch.setter
    def micro_batch(self, value):
        lib.llmt_slicer_set_micro_batch(self._ptr, value)

    @property
    def accumulation(self):
        """How micro-batch gradients are summed, assignable: "in_place" (the
        default: each backward adds into the gradients) or "ordered" (each
        micro-batch's gradient alone, then added in order: the bits of a
        deterministic data-parallel run at any world size, for one more
        gradient buffer)."""
        return ACCUMULATIONS[lib.llmt_slicer_accumulation(self._ptr)]

    @accumulation.setter
    def accumulation(self, value):
        lib.llmt_slicer_set_accumulation(self._ptr, enum(value, ACCUMULATIONS, "accumulation"))

    def forward_backward(self, tokens, targets, grad_scale=1.0):
        """Forward and backward of a global batch in micro-batches, adding the
        gradient of grad_scale * (mean loss); returns the batch's mean loss."""
        tok = tokens_array(tokens)
        tgt = _targets_for(tok, targets)
        loss = ctypes.c_double()
        lib.llmt_slicer_forward_backward(self._ptr, ptr(tok, ctypes.c_int32),
                                         ptr(tgt, ctypes.c_int32), tok.shape[0], tok.shape[1],
                                         grad_scale, ctypes.byref(loss))
        return loss.value
