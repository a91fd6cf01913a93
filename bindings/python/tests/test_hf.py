"""Hugging Face directories from Python: our export read back with an
independent reader (hf_reference: safetensors decoded by hand, a float64
LLaMA forward) gives Model.logits within 1e-5, and its config.json is the
dictionary written here; a synthetic sharded directory written here with
numpy (BF16 shards, rotary_emb.inv_freq tensors, llama3 rope_scaling in the
4.x and 5.x spellings) is imported with the same logits as the reference."""
import json

import numpy as np
import pytest

import llmt
from conftest import THREADS
from hf_reference import inv_freq, llama_logits, read_hf_dir, write_safetensors

TOL = 1e-5
CONFIG = dict(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
              ffn_size=48, max_seq_len=24, rms_norm_eps=1e-6, rope_theta=500000.0)
TOKENS = (np.arange(48, dtype=np.int32).reshape(2, 24) * 11 + 3) % 50


def _randomize(model, seed):
    """Weights far from the initialisation (attention far from uniform)."""
    rng = np.random.default_rng(seed)
    for name, shape, _ in model.tensors():
        noise = rng.standard_normal(shape).astype(np.float32)
        model.set_param(name, 1 + 0.1 * noise if len(shape) == 1 else 0.25 * noise)


def test_export_read_back_by_hand(tmp_path):
    with llmt.Context(num_threads=THREADS, seed=5) as ctx:
        m = llmt.Model(ctx, **CONFIG)
        _randomize(m, 1)
        m.export_hf(tmp_path / "hf", dtype="F32", max_shard_bytes=8000, eos_token_id=0)
        index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) >= 3
        config, weights = read_hf_dir(tmp_path / "hf")
        assert config == {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 50,
            "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 24, "rms_norm_eps": 1e-06, "rope_theta": 500000,
            "rope_scaling": None, "tie_word_embeddings": False, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "attention_dropout": 0,
            "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
            "bos_token_id": None, "eos_token_id": 0, "torch_dtype": "float32"}
        assert index["metadata"]["total_size"] == sum(a.nbytes for a in weights.values())
        for name, _, _ in m.tensors():
            np.testing.assert_array_equal(weights[name], m.get_param(name))
        ref = llama_logits(config, weights, TOKENS)
        got = m.logits(TOKENS)
        assert np.abs(got - ref).max() < TOL * max(1.0, np.abs(ref).max())
        # The reference can tell: theta 10000 (llmt's old default) is far off.
        wrong = llama_logits(dict(config, rope_theta=10000.0), weights, TOKENS)
        assert np.abs(got - wrong).max() > 100 * TOL
        back = llmt.Model.from_hf(ctx, tmp_path / "hf")
        assert back.config == m.config
        np.testing.assert_array_equal(back.logits(TOKENS), got)


# head_dim 16, theta 100, original length 64, low 1, high 8: wavelengths
# 6.3 (under 8: kept), 11 to 63 (blended) and over 64 (divided by factor).
ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
        "original_max_position_embeddings": 64}


def _synthetic_dir(path, spelling, tied):
    """A sharded HF directory written by hand, as transformers would."""
    rng = np.random.default_rng(2)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 40,
              "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "hidden_act": "silu",
              "torch_dtype": "bfloat16", "transformers_version": "4.46.0"}
    if spelling == "rope_scaling":
        config.update(rope_theta=100.0, rope_scaling=ROPE)
    else:
        config["rope_parameters"] = dict(ROPE, rope_theta=100.0)
    shapes = {"model.embed_tokens.weight": (40, 32), "model.norm.weight": (32,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (32,), p + "self_attn.q_proj.weight": (32, 32),
            p + "self_attn.k_proj.weight": (16, 32), p + "self_attn.v_proj.weight": (16, 32),
            p + "self_attn.o_proj.weight": (32, 32),
            p + "post_attention_layernorm.weight": (32,),
            p + "mlp.gate_proj.weight": (40, 32), p + "mlp.up_proj.weight": (40, 32),
            p + "mlp.down_proj.weight": (32, 40)})
    if not tied:
        shapes["lm_head.weight"] = (40, 32)
    weights = {}
    for name, shape in shapes.items():
        a = (1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
             else 0.25 * rng.standard_normal(shape)).astype(np.float32)
        weights[name] = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)  # exactly bf16
    extra = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": inv_freq(config).astype(np.float32)
             for i in range(2)}
    names = list(weights) + list(extra)
    shards = [names[0::3], names[1::3], names[2::3]]
    path.mkdir()
    weight_map = {}
    for k, group in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(path / file, {n: {**weights, **extra}[n] for n in group}, "BF16")
        weight_map.update({n: file for n in group})
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 2 * sum(a.size for a in weights.values())},
         "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(config))
    return config, weights


@pytest.mark.parametrize("spelling,tied", [("rope_scaling", False), ("rope_parameters", True)])
def test_import_synthetic_sharded_llama3(tmp_path, ctx, spelling, tied):
    config, weights = _synthetic_dir(tmp_path / "hf", spelling, tied)
    m = llmt.Model.from_hf(ctx, tmp_path / "hf", precision="fp32")
    cfg = m.config
    assert (cfg["rope_scaling"], cfg["rope_factor"], cfg["rope_original_max_len"]) == \
        ("llama3", 4.0, 64)
    assert cfg["rope_theta"] == 100.0 and cfg["rms_norm_eps"] == np.float32(1e-5)
    assert sorted(m.import_notes) == [
        f'ignored tensor "model.layers.{i}.self_attn.rotary_emb.inv_freq" in '
        f'model-0000{1 + (len(weights) + i) % 3}-of-00003.safetensors: RoPE frequencies are '
        'computed from config.json' for i in range(2)]
    tokens = (np.arange(64, dtype=np.int32).reshape(2, 32) * 7 + 1) % 40
    ref = llama_logits(config, weights, tokens)
    got = m.logits(tokens)
    assert np.abs(got - ref).max() < TOL * max(1.0, np.abs(ref).max())
    # Without the scaling the reference differs: the test can tell.
    plain = 1.0 / 100.0 ** (np.arange(0, 16, 2) / 16)
    assert np.abs(got - llama_logits(config, weights, tokens, plain)).max() > 100 * TOL
    # As saved: BF16 weights give bf16_mixed.
    assert llmt.Model.from_hf(ctx, tmp_path / "hf").config["precision"] == "bf16_mixed"


def test_refusals(tmp_path, ctx):
    m = llmt.Model(ctx, **CONFIG)
    m.export_hf(tmp_path / "hf")
    with pytest.raises(llmt.InvalidArgument, match="exists and is not empty"):
        m.export_hf(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(path.read_text().replace('"rope_scaling":null',
                                             '"rope_scaling":{"rope_type":"dynamic","factor":2}'))
    with pytest.raises(llmt.Unsupported, match=r'config.json: key "rope_scaling".*"dynamic"'):
        llmt.Model.from_hf(ctx, tmp_path / "hf")
    with pytest.raises(llmt.IOFailure, match="config.json"):
        llmt.Model.from_hf(ctx, tmp_path)
