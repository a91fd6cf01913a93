"""Generator and llmt.generate: cached logits and greedy ids against
Model.logits of the whole prefix (an independent path), seeds, the byte
text round trip, a tokenizer object, and the errors as Python exceptions."""
import numpy as np
import pytest

import llmt
from conftest import THREADS

TINY = dict(vocab_size=llmt.BYTE_VOCAB, hidden_size=32, num_layers=2, num_heads=4,
            num_kv_heads=2, ffn_size=48, max_seq_len=24)


@pytest.fixture
def model(ctx):
    """A tiny byte-vocab model with weights spread out (N(0, 0.25^2)), so
    that greedy choices are far from ties."""
    m = llmt.Model(ctx, **TINY)
    rng = np.random.default_rng(5)
    for name, shape, _ in m.tensors():
        values = rng.normal(0, 0.25, shape) if len(shape) == 2 else 1 + rng.normal(0, 0.1, shape)
        m.set_param(name, values.astype(np.float32))
    return m


def test_feed_logits_and_greedy_ids_match_recompute(model):
    g = llmt.Generator(model, temperature=0)
    prompt = [104, 105, 32]
    seq = list(prompt)
    logits = g.feed(prompt)
    for _ in range(TINY["max_seq_len"] - len(prompt)):
        full = model.logits(np.array([seq], dtype=np.int32))[0, -1]
        np.testing.assert_allclose(logits, full, rtol=0, atol=1e-5 * np.abs(full).max())
        seq.append(int(np.argmax(full)))
        if len(seq) < TINY["max_seq_len"]:
            logits = g.feed([seq[-1]])
    assert g.position == TINY["max_seq_len"] - 1
    ids = g.generate(prompt, TINY["max_seq_len"] - len(prompt))
    assert ids.dtype == np.int32
    assert ids.tolist() == seq[len(prompt):]
    g.reset()
    assert g.position == 0


def test_seed_repeats_and_text_round_trip(model):
    a = llmt.generate(model, [104, 105], 10, temperature=1.5, seed=4)
    b = llmt.generate(model, [104, 105], 10, temperature=1.5, seed=4)
    np.testing.assert_array_equal(a, b)
    text = llmt.generate(model, "hi", 10, temperature=1.5, seed=4)
    assert text == llmt.decode_bytes(a.tolist())
    greedy = llmt.generate(model, [104, 105], 10, temperature=0)
    np.testing.assert_array_equal(llmt.generate(model, [104, 105], 10, top_k=1, seed=9), greedy)
    stop = int(greedy[2])
    first = greedy.tolist().index(stop)
    np.testing.assert_array_equal(
        llmt.generate(model, [104, 105], 10, temperature=0, stop_token=stop), greedy[:first + 1])


def test_decode_bytes():
    # "é" whole, a lone continuation byte, end of text, an id past the bytes.
    assert llmt.decode_bytes([0xC3, 0xA9, 0x80, 256, 65, 300]) == "é\\x80A<|300|>"
    # A literal backslash before "x80" is doubled: it cannot read as the byte 0x80.
    assert llmt.decode_bytes(list(b"\\x80") + [0x80]) == "\\\\x80\\x80"
    # A surrogate's bytes (ED A0 80) and a cut sequence (E2 82) byte by byte, as C does.
    assert llmt.decode_bytes([0xED, 0xA0, 0x80, 0xE2, 0x82, 0x41]) == \
        "\\xed\\xa0\\x80\\xe2\\x82A"


def test_default_cache_is_what_the_call_needs(ctx):
    """generate() sizes the cache for the prompt and the new tokens: with 1
    MiB left in the budget, which a whole 4096-position context exceeds (1
    MiB of cache and 3 MiB of attention scratch at 2 threads), it runs; with
    max_context=0, the model's whole context, the budget refuses it."""
    assert ctx.num_threads == THREADS == 2
    m = llmt.Model(ctx, **dict(TINY, max_seq_len=4096))
    ctx.set_budget(ctx.memory_stats()["total"]["current"] + (1 << 20))
    greedy = llmt.generate(m, [104, 105], 5, temperature=0)
    assert greedy.size == 5
    with pytest.raises(llmt.OutOfMemory, match="budget"):
        llmt.generate(m, [104, 105], 5, temperature=0, max_context=0)


class _Encoding:
    def __init__(self, ids):
        self.ids = ids


class _LetterTokenizer:
    """A stand-in for tokenizers.Tokenizer: letter a-z is id 1-26."""
    def encode(self, text):
        return _Encoding([ord(c) - 96 for c in text])

    def decode(self, ids):
        return "".join(chr(96 + i) if 1 <= i <= 26 else f"[{i}]" for i in ids)


def test_tokenizer_object(model):
    tok = _LetterTokenizer()
    ids = llmt.generate(model, [8, 9], 6, temperature=0)
    assert llmt.generate(model, "hi", 6, temperature=0, tokenizer=tok) == tok.decode(ids.tolist())


def test_errors(model):
    with pytest.raises(llmt.InvalidArgument, match="temperature = -1"):
        llmt.Generator(model, temperature=-1)
    with pytest.raises(llmt.InvalidArgument, match="top_p = 0"):
        llmt.Generator(model, top_p=0)
    with pytest.raises(TypeError, match="top_q"):
        llmt.Generator(model, top_q=0.5)
    g = llmt.Generator(model, max_context=8)
    with pytest.raises(llmt.InvalidArgument, match="max_new = 7"):
        g.generate([1, 2], 7)
    with pytest.raises(llmt.InvalidArgument, match=r"prompt\[1\] = 257"):
        g.generate([1, 257], 1)
    with pytest.raises(ValueError, match="1-D"):
        g.feed([[1, 2]])
    with pytest.raises(ValueError, match="tokens is empty"):
        g.feed([])
    for empty in ([], ""):
        with pytest.raises(ValueError, match="prompt is empty"):
            llmt.generate(model, empty, 3)
    model.close()
    assert g.closed


def test_hugging_face_tokenizer(model):
    tokenizers = pytest.importorskip("tokenizers")  # optional: pip install tokenizers
    vocab = {w: i for i, w in enumerate(["[UNK]"] + [chr(97 + i) for i in range(26)])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    ids = llmt.generate(model, [8, 9], 6, temperature=0)
    text = llmt.generate(model, "h i", 6, temperature=0, tokenizer=tok)
    assert text == tok.decode(ids.tolist())
