"""Text generation with the KV-cache generator (include/llmt/generate.h)."""
import ctypes

import numpy as np

from . import _structs as S
from ._convert import fill_struct, init_struct, ptr
from ._handle import Handle
from ._lib import lib
from .data import byte_encode


def _ids(tokens, what):
    """A C-contiguous 1-D int32 array of token ids; values outside int32 and
    an empty sequence refused."""
    a = np.asarray(tokens)
    if a.size == 0:
        raise ValueError(f"{what} is empty: expected at least one token id")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what}: expected integer token ids, got dtype {a.dtype}")
    b = a.astype(np.int32).reshape(-1)
    if a.ndim != 1 or not np.array_equal(a, b):
        raise ValueError(f"{what}: expected a 1-D sequence of int32 token ids")
    return np.ascontiguousarray(b)


class Generator(Handle):
    """A generator (llmt_generator) over a Model: its KV cache of
    ``max_context`` positions (0: the model's max_seq_len) and its sampling:
    ``temperature`` (0: greedy), ``top_k`` (0: off), ``top_p`` (1: off) and
    ``seed``, as Hugging Face generate samples. Closed with its model."""

    def __init__(self, model, **config):
        cfg = init_struct(S.llmt_generator_config, lib.llmt_generator_config_init)
        fill_struct(cfg, config, "Generator")
        out = ctypes.POINTER(S.llmt_generator)()
        lib.llmt_generator_create(ctypes.byref(out), model._ptr, ctypes.byref(cfg))
        self._attach(out, lib.llmt_generator_free, (model,))
        self.model = model
        self._vocab = model.config["vocab_size"]

    @property
    def position(self):
        """The number of positions in the cache."""
        n = ctypes.c_int32()
        lib.llmt_generator_position(self._ptr, ctypes.byref(n))
        return n.value

    def reset(self):
        """Empties the cache."""
        lib.llmt_generator_reset(self._ptr)

    def feed(self, tokens):
        """Appends tokens to the cache; returns the float32 logits that follow
        the last of them, shape (vocab_size,)."""
        t = _ids(tokens, "tokens")
        out = np.empty(self._vocab, dtype=np.float32)
        lib.llmt_generator_feed(self._ptr, ptr(t, ctypes.c_int32), t.size,
                                ptr(out, ctypes.c_float), out.size)
        return out

    def generate(self, prompt, max_new_tokens, stop_token=None):
        """Up to ``max_new_tokens`` token ids (int32 array) sampled after the
        ``prompt`` ids, from an empty cache and the start of the seed's
        stream; ends after ``stop_token`` when it is drawn (included)."""
        p = _ids(prompt, "prompt")
        out = np.empty(max(int(max_new_tokens), 1), dtype=np.int32)
        n = ctypes.c_int32()
        lib.llmt_generator_generate(self._ptr, ptr(p, ctypes.c_int32), p.size,
                                    int(max_new_tokens), -1 if stop_token is None else stop_token,
                                    ptr(out, ctypes.c_int32), out.size, ctypes.byref(n))
        return out[:n.value].copy()


def _escape_run(run):
    """A run of bytes as UTF-8 text: a byte of no valid sequence as ``\\xNN``
    and a backslash as ``\\\\`` (so neither can be mistaken for the other:
    llmt-generate's rule, examples/text_escape.c)."""
    text = bytes(run).decode("utf-8", errors="surrogateescape")
    return "".join("\\\\" if c == "\\" else
                   f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c
                   for c in text)


def decode_bytes(tokens):
    """Text of byte tokens as llmt-generate prints it, but with valid text
    (control characters included) as it is: each run of byte tokens decoded
    as UTF-8 with invalid bytes as ``\\xNN`` and a backslash as ``\\\\``,
    the end-of-text token as nothing, other ids as ``<|N|>``."""
    parts, run = [], bytearray()
    for t in list(tokens) + [None]:
        if t is not None and 0 <= t < 256:
            run.append(t)
            continue
        parts.append(_escape_run(run))
        run.clear()
        if t is not None and t != S.TOKEN_EOT:
            parts.append(f"<|{t}|>")
    return "".join(parts)


def generate(model, prompt, max_new_tokens=64, *, temperature=1.0, top_k=0, top_p=1.0, seed=0,
             stop_token=None, tokenizer=None, max_context=None):
    """Samples up to ``max_new_tokens`` tokens after ``prompt`` with a
    Generator of these settings. A str prompt is encoded with ``tokenizer``
    (a Hugging Face ``tokenizers.Tokenizer``, or anything with
    ``encode(text).ids`` and ``decode(ids)``) or, without one, the byte
    tokenizer, and the new tokens come back decoded the same way (str); a
    sequence of ids comes back as an int32 array of ids. The cache holds
    ``max_context`` positions: by default the prompt's and the new tokens'
    (at most the model's max_seq_len), 0 for the model's whole context."""
    text = isinstance(prompt, str)
    if text:
        ids = tokenizer.encode(prompt).ids if tokenizer is not None else byte_encode(prompt)
    else:
        ids = prompt
    ids = _ids(ids, "prompt")
    if max_context is None:
        max_context = max(1, min(ids.size + int(max_new_tokens), model.config["max_seq_len"]))
    with Generator(model, max_context=max_context, temperature=temperature, top_k=top_k,
                   top_p=top_p, seed=seed) as g:
        out = g.generate(ids, max_new_tokens, stop_token)
    if not text:
        return out
    return tokenizer.decode(out.tolist()) if tokenizer is not None else decode_bytes(out.tolist())
