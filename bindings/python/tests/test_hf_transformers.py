"""The interoperability check (docs/interop.md): transformers'
LlamaForCausalLM.from_pretrained on our export, and our import of its
save_pretrained output (with llama3 rope_scaling), give the same logits as
llmt within 1e-5 (relative to the largest logit when that is over 1). Runs
wherever torch and transformers are installed; elsewhere it is reported as
skipped with the reason."""
import numpy as np
import pytest

import llmt
from conftest import THREADS
from test_hf import CONFIG, ROPE, TOKENS, TOL, _randomize

_WHY = "the interoperability check needs torch and transformers (pip install torch transformers)"
torch = pytest.importorskip("torch", reason=_WHY)
transformers = pytest.importorskip("transformers", reason=_WHY)


def _hf_logits(model, tokens):
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.double().numpy()


def _close(got, ref):
    assert np.abs(got - ref).max() < TOL * max(1.0, np.abs(ref).max())


def test_from_pretrained_on_our_export(tmp_path):
    with llmt.Context(num_threads=THREADS, seed=5) as ctx:
        m = llmt.Model(ctx, **CONFIG)
        _randomize(m, 1)
        m.export_hf(tmp_path / "hf", dtype="F32", max_shard_bytes=8000)
        hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf",
                                                           torch_dtype=torch.float32)
        assert hf.config.rms_norm_eps == pytest.approx(1e-6)
        _close(m.logits(TOKENS), _hf_logits(hf, TOKENS))


def test_our_import_of_save_pretrained(tmp_path, ctx):
    cfg = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=24,
        rms_norm_eps=1e-5, rope_theta=100.0, rope_scaling=dict(ROPE),
        tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if p.dim() == 1 else 0.25 * torch.randn_like(p))
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    m = llmt.Model.from_hf(ctx, tmp_path / "hf", precision="fp32")
    assert m.config["rope_scaling"] == "llama3"
    _close(m.logits(TOKENS), _hf_logits(hf, TOKENS))
