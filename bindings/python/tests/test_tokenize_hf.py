"""python -m llmt.tokenize (docs/data.md) with tokenizers trained here by the
tokenizers package: shards decoded by hand from their bytes give back the
input text through tokenizer.decode, split where the end-of-text ids are;
the output does not depend on the worker count; uint32 shards for ids over
65535; the end-of-text id from the flag, tokenizer_config.json or the
special tokens; refusals (vocab size, files, options) that name what is
wrong and write nothing. Skipped where tokenizers is not installed, except
under LLMT_REQUIRE_TOKENIZERS=1 (tools/test.sh, so CI runs it)."""
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import llmt
from conftest import PACKAGE_ROOT

if os.environ.get("LLMT_REQUIRE_TOKENIZERS") == "1":
    import tokenizers  # CI: a missing package fails the suite
else:
    tokenizers = pytest.importorskip(
        "tokenizers", reason="llmt.tokenize needs the tokenizers package (pip install tokenizers, "
        "or tools/install-deps.sh)")
from llmt import tokenize  # noqa: E402

LINES = ["hello world, the quick brown fox", "jumps over the lazy dog\n", "héllo wörld ünïcode",
         "the end <|endoftext|> is only text here"]
#: The documents, by file name; a directory serves them sorted by byte-wise
#: name: B.txt, a.txt, c.txt, empty.txt.
DOCS = {"a.txt": "the quick brown fox jumps over the lazy dog\n" * 3,
        "B.txt": "héllo wörld, hello world\n\n  indented line\ttab\n",
        "c.txt": "a literal <|endoftext|> and </s> stay text",
        "empty.txt": ""}
ORDER = ["B.txt", "a.txt", "c.txt", "empty.txt"]


def _bpe(directory, specials=("<|endoftext|>",)):
    """A byte-level BPE tokenizer trained on LINES, saved as directory/tokenizer.json."""
    t = tokenizers.Tokenizer(tokenizers.models.BPE())
    t.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=list(specials),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(LINES, trainer)
    os.makedirs(directory, exist_ok=True)
    t.save(os.path.join(directory, "tokenizer.json"))
    return t


def _corpus(directory):
    os.makedirs(directory)
    for name, text in DOCS.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write(text)
    return str(directory)


def _shard(path):
    """(version, tokens) of a shard file, decoded from its bytes."""
    raw = open(path, "rb").read()
    magic, version, count = np.frombuffer(raw[:12], dtype="<i4")
    assert magic == 20240520 and version in (1, 2)
    assert not np.frombuffer(raw[12:1024], dtype=np.uint8).any()
    width = 2 if version == 1 else 4
    assert len(raw) == 1024 + count * width
    return int(version), np.frombuffer(raw[1024:], dtype="<u2" if width == 2 else "<u4")


def _shards(out, split):
    names = sorted(n for n in os.listdir(out) if n.startswith(f"data_{split}_"))
    return [_shard(os.path.join(out, n)) for n in names]


def _run(capsys, *argv):
    """main(argv) in this process: (status, stdout, stderr)."""
    try:
        status = tokenize.main([str(a) for a in argv])
    except SystemExit as e:  # argparse's usage errors
        status = e.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_shards_decode_back_to_the_files(tmp_path, ctx):
    tok = _bpe(tmp_path / "tok")
    corpus = _corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    run = subprocess.run([sys.executable, "-m", "llmt.tokenize", "--tokenizer", tmp_path / "tok",
                          corpus, "--out", out, "--val-fraction", "0.2", "--shard-tokens", "17",
                          "--workers", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "end of text 0 '<|endoftext|>'" in run.stderr
    train, val = _shards(out, "train"), _shards(out, "val")
    assert {v for v, _ in train + val} == {1}
    sizes = [t.size for _, t in train]
    assert sizes[:-1] == [17] * (len(sizes) - 1) and 0 < sizes[-1] <= 17
    stream = np.concatenate([t for _, t in train + val]).astype(np.int64)
    assert sum(t.size for _, t in val) == math.ceil(0.2 * stream.size)
    # One end-of-text id after each document and nowhere else (the literal
    # "<|endoftext|>" in c.txt is text).
    ends = np.flatnonzero(stream == 0)
    assert ends.size == len(ORDER) and ends[-1] == stream.size - 1
    docs = np.split(stream, ends + 1)[:-1]
    assert [tok.decode(d[:-1].tolist(), skip_special_tokens=False) for d in docs] == \
        [DOCS[n] for n in ORDER]
    assert f"{stream.size} tokens" in run.stdout
    # The library's loader serves the same tokens.
    loader = llmt.Loader(ctx, str(out / "data_train_*.bin"), vocab_size=tok.get_vocab_size(),
                         batch_size=1, seq_len=8, shuffle=False)
    x, y = loader.next()
    assert x[0].tolist() == stream[:8].tolist() and y[0].tolist() == stream[1:9].tolist()


def test_output_does_not_depend_on_workers(tmp_path, capsys):
    _bpe(tmp_path / "tok")
    corpus = _corpus(tmp_path / "corpus")
    files = {}
    for workers in (1, 3):
        out = tmp_path / f"out{workers}"
        start = time.monotonic()
        status, stdout, stderr = _run(capsys, "--tokenizer", tmp_path / "tok" / "tokenizer.json",
                                      corpus, tmp_path / "corpus" / "a.txt", "--out", out,
                                      "--shard-tokens", "20", "--workers", workers)
        elapsed = time.monotonic() - start
        assert status == 0, stderr
        # Progress: the first file, at most one line a second, the last.
        lines = [line for line in stderr.splitlines() if " files, " in line]
        assert "5/5 files" in lines[-1] and len(lines) <= 2 + elapsed
        files[workers] = {n: (out / n).read_bytes() for n in sorted(os.listdir(out))}
    assert len(files[1]) > 2 and files[1] == files[3]


def test_uint32_shards_and_vocab_size(tmp_path, capsys):
    vocab = {"[UNK]": 0, "<eot>": 1, "alpha": 65535, "beta": 65536, "gamma": 70000}
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in.txt").write_text("alpha beta gamma delta")
    argv = ["--tokenizer", tmp_path, tmp_path / "in.txt", "--out", tmp_path / "out", "--eot-id", 1]
    status, _, stderr = _run(capsys, *argv, "--vocab-size", 70000)
    assert status == 1
    assert "--vocab-size 70000" in stderr and "ids up to 70000" in stderr
    assert not (tmp_path / "out").exists()
    status, _, stderr = _run(capsys, *argv, "--vocab-size", 70001)
    assert status == 0, stderr
    [(version, tokens)] = _shards(tmp_path / "out", "train")
    assert version == 2 and tokens.tolist() == [65535, 65536, 70000, 0, 1]


def test_end_of_text_id(tmp_path, capsys):
    tok = _bpe(tmp_path, specials=("<|endoftext|>", "</s>"))
    (tmp_path / "in.txt").write_text("hello")
    ends = {}
    for case in ("specials", "config", "flag"):
        if case == "config":
            (tmp_path / "tokenizer_config.json").write_text(
                json.dumps({"eos_token": {"content": "</s>", "special": True}}))
        flag = ["--eot-id", tok.token_to_id("h")] if case == "flag" else []
        status, _, stderr = _run(capsys, "--tokenizer", tmp_path, tmp_path / "in.txt", "--out",
                                 tmp_path / case, *flag)
        assert status == 0, stderr
        [(_, tokens)] = _shards(tmp_path / case, "train")
        ends[case] = int(tokens[-1])
    assert ends == {"specials": 0, "config": 1, "flag": tok.token_to_id("h")}


@pytest.mark.parametrize("case", ["no_tokenizer", "dir_without_json", "bad_json", "no_input",
                                  "not_utf8", "no_eot", "eot_not_an_id", "val_leaves_none",
                                  "shard_tokens", "val_fraction", "prefix", "workers"])
def test_refusals(tmp_path, capsys, case):
    _bpe(tmp_path / "tok")
    text = tmp_path / "in.txt"
    text.write_text("hello world")
    tok, inputs, extra = tmp_path / "tok", [text], []
    if case == "no_tokenizer":
        tok = tmp_path / "missing.json"
        want = (1, [str(tok), "no such file"])
    elif case == "dir_without_json":
        tok = tmp_path
        want = (1, [str(tmp_path), "no tokenizer.json"])
    elif case == "bad_json":
        tok = tmp_path / "bad.json"
        tok.write_text("{")
        want = (1, [str(tok), "not a tokenizer"])
    elif case == "no_input":
        inputs = [tmp_path / "nothing.txt"]
        want = (1, [str(inputs[0]), "no such file"])
    elif case == "not_utf8":
        (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
        inputs = [text, tmp_path / "latin1.txt"]
        extra = ["--workers", 2]  # the failure comes from a worker process
        want = (1, [str(inputs[1]), "not UTF-8", "byte offset 3"])
    elif case == "no_eot":
        t = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        t.save(str(tmp_path / "plain.json"))
        tok = tmp_path / "plain.json"
        want = (1, [str(tok), "no end-of-text token", "--eot-id"])
    elif case == "eot_not_an_id":
        extra = ["--eot-id", 100000]
        want = (1, ["--eot-id 100000", "not an id"])
    elif case == "val_leaves_none":
        text.write_text("")  # one token: its end of text
        extra = ["--val-fraction", 0.5]
        want = (1, ["--val-fraction 0.5 of 1 tokens", "none to train on"])
    elif case == "shard_tokens":
        extra = ["--shard-tokens", 0]
        want = (2, ["--shard-tokens", "0 is not in 1..2147483647"])
    elif case == "val_fraction":
        extra = ["--val-fraction", 1]
        want = (2, ["--val-fraction", "not in [0, 1)"])
    elif case == "prefix":
        extra = ["--prefix", "a/b"]
        want = (2, ["--prefix", "not a path"])
    else:
        extra = ["--workers", 0]
        want = (2, ["--workers", "0 is not in 1..1024"])
    out = tmp_path / "out"
    status, stdout, stderr = _run(capsys, "--tokenizer", tok, *inputs, "--out", out, *extra)
    assert status == want[0], stderr
    for needle in want[1]:
        assert needle in stderr
    assert not out.exists() or not os.listdir(out)  # nothing written


class _CountingPool(concurrent.futures.Executor):
    """A stand-in for ProcessPoolExecutor that encodes in this process when a
    future's result is asked for, and counts the futures submitted."""

    def __init__(self, workers, mp_context, initializer, initargs):
        initializer(*initargs)
        self.submitted = 0
        _CountingPool.last = self

    def submit(self, fn, arg):
        self.submitted += 1
        future = concurrent.futures.Future()
        future.result = lambda timeout=None: fn(arg)
        return future

    def shutdown(self, cancel_futures=False):
        pass


def test_workers_hold_a_bounded_queue(tmp_path, monkeypatch):
    """Files in flight (submitted, not yet yielded) stay at most 2 x workers
    (the next file is submitted before the caller's turn), in order."""
    _bpe(tmp_path / "tok")
    path = str(tmp_path / "tok" / "tokenizer.json")
    files = []
    for i in range(20):
        files.append(tmp_path / f"doc{i:02d}.txt")
        files[-1].write_text(f"document {i} the quick fox", encoding="utf-8")
    monkeypatch.setattr(tokenize, "ProcessPoolExecutor", _CountingPool)
    tok = tokenize.load_tokenizer(path)
    want = [tokenize.encode_document(tok, f, 0, "<u2")[0].tolist() for f in files]
    got = []
    for tokens, _ in tokenize.encoded(files, tok, path, 0, "<u2", 3):
        got.append(tokens.tolist())
        assert _CountingPool.last.submitted - len(got) <= 2 * 3, \
            f"{_CountingPool.last.submitted} submitted after {len(got)} yielded"
    assert got == want and _CountingPool.last.submitted == 20


def test_stale_shard_warning_on_stderr(tmp_path, capsys):
    """A shard of an earlier, longer run numbered after the last one written
    is named in a warning on stderr (docs/data.md), not on stdout."""
    _bpe(tmp_path / "tok")
    corpus = _corpus(tmp_path / "corpus")
    argv = ["--tokenizer", tmp_path / "tok", corpus, "--out", tmp_path / "out"]
    status, _, stderr = _run(capsys, *argv, "--shard-tokens", 20)
    assert status == 0, stderr
    status, stdout, stderr = _run(capsys, *argv, "--shard-tokens", 100000)
    assert status == 0, stderr
    stale = f"{tmp_path / 'out' / 'data'}_train_000001.bin is left from an earlier run"
    assert f"warning: {stale}" in stderr and "earlier run" not in stdout
