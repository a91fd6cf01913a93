"""Independent readers and a reference for the Hugging Face tests: safetensors
decoded by hand with numpy (8-byte little-endian header length, JSON header,
raw little-endian data; the `safetensors` package is not packaged for
Debian), an HF directory read through its index, and a LLaMA forward in
float64 written from the LlamaForCausalLM definition (RMSNorm, rotate-half
RoPE with the llama3 frequency scaling, grouped-query causal attention,
SwiGLU)."""
import json
import struct
from pathlib import Path

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    """{name: float32 array} and the __metadata__ dict of a safetensors file."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        chunk = data[begin:end]
        if t["dtype"] == "BF16":  # the high half of a float32
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(chunk, dtype=np.dtype(_DTYPES[t["dtype"]]).newbyteorder("<"))
        out[name] = arr.astype(np.float32).reshape(t["shape"])
    return out, meta


def write_safetensors(path, tensors, dtype="F32"):
    """Writes {name: array} as a safetensors file in dtype (F32, F16, BF16 by
    truncation of float32 values that are exactly bf16)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr, dtype=np.float32)
        if dtype == "BF16":
            blob = (a.view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            blob = a.astype(np.dtype(_DTYPES[dtype]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_hf_dir(path):
    """config.json and every tensor of an HF directory, single or sharded."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    index = path / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.exists() else ["model.safetensors"])
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(path / f)[0])
    return config, tensors


def inv_freq(config):
    """RoPE inverse frequencies from config.json (4.x rope_scaling or 5.x
    rope_parameters), with the llama3 scaling when asked."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    hd = config["hidden_size"] // config["num_attention_heads"]
    base = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    if rope.get("rope_type", rope.get("type", "default")) != "llama3":
        return base
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = np.empty_like(base)
    for i, f in enumerate(base):
        wavelen = 2 * np.pi / f
        if wavelen < old / hi:
            out[i] = f
        elif wavelen > old / lo:
            out[i] = f / factor
        else:
            s = (old / wavelen - lo) / (hi - lo)
            out[i] = (1 - s) * f / factor + s * f
    return out


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def llama_logits(config, w, tokens, freqs=None):
    """Logits [batch, seq, vocab] in float64 of LlamaForCausalLM."""
    c = config
    d, nh = c["hidden_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd, eps = d // nh, c.get("rms_norm_eps", 1e-6)
    w = {k: v.astype(np.float64) for k, v in w.items()}
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    f = inv_freq(c) if freqs is None else freqs
    ang = np.arange(t)[:, None] * f[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)
    sin = np.concatenate([np.sin(ang)] * 2, -1)
    mask = np.triu(np.full((t, t), -np.inf), 1)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(b, t, nh, hd).transpose(0, 2, 1, 3)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(b, t, nkv, hd).transpose(0, 2, 1, 3)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(b, t, nkv, hd).transpose(0, 2, 1, 3)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(0, 2, 1, 3).reshape(b, t, d) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
            w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T
