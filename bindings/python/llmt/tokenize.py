"""Text files to token shards with a Hugging Face tokenizer (docs/data.md).

    python -m llmt.tokenize --tokenizer DIR_OR_TOKENIZER_JSON FILE... --out DIR
        [--prefix NAME] [--val-fraction F] [--shard-tokens N] [--workers N]
        [--eot-id N] [--vocab-size N]

The byte tokenizer (llmt-tokenize) needs nothing; this tool needs the
``tokenizers`` package (``pip install tokenizers``). Each FILE (a directory:
its regular files, sorted by byte-wise name) is one document, UTF-8 text,
encoded without the tokenizer's added BOS/EOS (its post-processor) and with
special-token strings in the text encoded as plain text; each document is
followed by the end-of-text id. The stream is cut like llmt-tokenize's:
shards of at most N tokens, DIR/NAME_train_000000.bin, ..., the last
ceil(F * total) tokens in DIR/NAME_val_000000.bin, ...; version 1 (uint16)
shards when every id of the tokenizer fits, else version 2 (uint32). Workers
encode whole files in parallel; the output does not depend on their number.
Exit status: 0 done, 1 failed (nothing is written before all inputs are
encoded), 2 bad usage.
"""
import argparse
import collections
import itertools
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from . import _structs as S
from .data import shard_write
from .errors import LlmtError

PROG = "python -m llmt.tokenize"
#: Special tokens that end a document, in the order they are looked for when
#: neither --eot-id nor tokenizer_config.json's eos_token names one.
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
INT32_MAX = 2**31 - 1


class TokenizeError(Exception):
    """A failure, reported as one line naming the file or option; exit 1."""


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise TokenizeError("needs the Hugging Face tokenizers package: pip install tokenizers")
    return tokenizers


def tokenizer_json(path):
    """The tokenizer.json that --tokenizer PATH names (the file, or the one in
    the directory PATH)."""
    if os.path.isdir(path):
        found = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(found):
            raise TokenizeError(f"--tokenizer {path}: the directory has no tokenizer.json")
        return found
    if not os.path.isfile(path):
        raise TokenizeError(f"--tokenizer {path}: no such file or directory")
    return path


def load_tokenizer(path):
    """The tokenizer of a tokenizer.json, encoding special-token strings found
    in text as plain text (so only this tool places end-of-text ids)."""
    tokenizer_class = _tokenizers().Tokenizer
    try:
        tok = tokenizer_class.from_file(path)
    except Exception as e:  # the package raises plain Exception on a bad file
        raise TokenizeError(f"{path}: not a tokenizer the tokenizers package reads: {e}")
    tok.encode_special_tokens = True
    return tok


def id_range(tok):
    """One more than the largest id the tokenizer has (added tokens included):
    the smallest vocab_size of a model that can embed all of them."""
    return max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1


def end_of_text(tok, path, eot_id):
    """(id, token, where it came from): --eot-id, else the eos_token of the
    tokenizer_config.json beside path, else the first of EOT_NAMES that is a
    special token."""
    if eot_id is not None:
        if tok.id_to_token(eot_id) is None:
            raise TokenizeError(f"--eot-id {eot_id}: not an id of {path}")
        return eot_id, tok.id_to_token(eot_id), "--eot-id"
    config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if os.path.isfile(config):
        try:
            with open(config, encoding="utf-8") as f:
                eos = json.load(f).get("eos_token")
        except (OSError, ValueError, AttributeError) as e:
            raise TokenizeError(f"{config}: cannot read its eos_token: {e}")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            found = tok.token_to_id(eos)
            if found is None:
                raise TokenizeError(f"{config}: eos_token {eos!r} is not a token of {path}")
            return found, eos, f"eos_token of {config}"
    special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    for name in EOT_NAMES:
        if name in special:
            return special[name], name, f"special token of {path}"
    raise TokenizeError(f"{path}: no end-of-text token found (no eos_token in a "
                        f"tokenizer_config.json beside it, none of {' '.join(EOT_NAMES)} is a "
                        "special token): pass --eot-id")


def input_files(paths):
    """The documents: each path, a directory standing for its regular files
    sorted by byte-wise name (not recursively)."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            names = sorted(os.listdir(p), key=os.fsencode)
            files += [q for q in (os.path.join(p, n) for n in names) if os.path.isfile(q)]
        elif os.path.isfile(p):
            files.append(p)
        elif os.path.exists(p):
            raise TokenizeError(f"{p}: not a regular file or a directory")
        else:
            raise TokenizeError(f"{p}: no such file or directory")
    if not files:
        raise TokenizeError("no input files (the directories given hold no regular file)")
    return files


def encode_document(tok, path, eot, dtype):
    """(the tokens of one file followed by eot as a dtype array, its bytes)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TokenizeError(f"{path}: cannot read: {e.strerror}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizeError(f"{path}: not UTF-8 text (byte offset {e.start})")
    try:
        ids = tok.encode(text, add_special_tokens=False).ids
    except Exception as e:  # the package raises plain Exception
        raise TokenizeError(f"{path}: the tokenizer failed: {e}")
    out = np.empty(len(ids) + 1, dtype=dtype)
    out[:-1] = ids
    out[-1] = eot
    return out, len(data)


# One tokenizer per worker process, loaded once by _start_worker.
_worker = {}


def _start_worker(path, eot, dtype):
    _worker.update(tok=load_tokenizer(path), eot=eot, dtype=dtype)


def _encode_in_worker(path):
    return encode_document(_worker["tok"], path, _worker["eot"], _worker["dtype"])


def encoded(files, tok, path, eot, dtype, workers):
    """Yields (tokens, bytes) of each file in order. With workers > 1 the
    files are encoded by that many spawned processes (a worker that dies or
    fails to start raises rather than hangs), at most 2 x workers files
    submitted and not yet yielded, so finished results waiting for an earlier
    file stay few."""
    if workers == 1:
        for f in files:
            yield encode_document(tok, f, eot, dtype)
        return
    pool = ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"), _start_worker,
                               (path, eot, dtype))
    try:
        waiting, later = collections.deque(), iter(files)
        for f in itertools.islice(later, 2 * workers):
            waiting.append(pool.submit(_encode_in_worker, f))
        while waiting:
            done = waiting.popleft().result()
            for f in itertools.islice(later, 1):  # the next file, before the caller's turn
                waiting.append(pool.submit(_encode_in_worker, f))
            yield done
    finally:  # after a failure, the files not yet started are dropped
        pool.shutdown(cancel_futures=True)


class Progress:
    """Lines on stderr, at most one a second and a last one."""

    def __init__(self, n_files):
        self.n_files, self.start, self.last = n_files, time.monotonic(), 0.0

    def show(self, files, nbytes, tokens, last=False):
        now = time.monotonic()
        if not last and now - self.last < 1.0:
            return
        self.last = now
        rate = tokens / max(now - self.start, 1e-9)
        print(f"{PROG}: {files}/{self.n_files} files, {nbytes / 1e6:.1f} MB, {tokens} tokens "
              f"({rate:,.0f} tokens/s)", file=sys.stderr, flush=True)


def write_split(spill, dtype, start, count, out, split, shard_tokens, version):
    """Writes tokens [start, start + count) of the spill file as shards
    <out>_<split>_NNNNNN.bin; prints each and returns how many it wrote."""
    width = np.dtype(dtype).itemsize
    k = 0
    for k, first in enumerate(range(0, count, shard_tokens)):
        n = min(shard_tokens, count - first)
        spill.seek((start + first) * width)
        name = f"{out}_{split}_{k:06d}.bin"
        shard_write(name, np.fromfile(spill, dtype=dtype, count=n), version)
        print(f"wrote {name}: {n} tokens")
    shards = k + 1 if count else 0
    stale = f"{out}_{split}_{shards:06d}.bin"
    if os.path.exists(stale):  # a shard of an earlier run would follow the last one
        print(f"{PROG}: warning: {stale} is left from an earlier run and is not part of this "
              f"output; remove it before loading {out}_{split}_*.bin", file=sys.stderr)
    return shards


def _int_in(lo, hi):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not in {lo}..{hi}")
        return value
    return parse


def _fraction(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1)")
    return value


def _prefix(text):
    if not text or "/" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: a file name prefix, not a path")
    return text


def parser():
    p = argparse.ArgumentParser(
        prog=PROG, description="Encodes text files (each a document, followed by the "
        "end-of-text id) with a Hugging Face tokenizer into llm.c token shards.")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="a UTF-8 text file, or a directory: its regular files, sorted")
    p.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="a tokenizer.json, or a directory holding one")
    p.add_argument("--out", required=True, metavar="DIR", help="created if missing (one level)")
    p.add_argument("--prefix", type=_prefix, default="data", metavar="NAME",
                   help="shards are DIR/NAME_train_NNNNNN.bin, DIR/NAME_val_NNNNNN.bin "
                   "(default data)")
    p.add_argument("--val-fraction", type=_fraction, default=0.0, metavar="F",
                   help="the last ceil(F * total) tokens go to validation shards (default 0)")
    p.add_argument("--shard-tokens", type=_int_in(1, INT32_MAX), default=10_000_000,
                   metavar="N", help="tokens per shard at most (default 10000000)")
    p.add_argument("--workers", type=_int_in(1, 1024), default=len(os.sched_getaffinity(0)),
                   metavar="N", help="encoding processes (default: the CPUs this process may "
                   "use)")
    p.add_argument("--eot-id", type=_int_in(0, INT32_MAX), metavar="N",
                   help="the id after each document (default: the eos_token of "
                   "tokenizer_config.json beside the tokenizer, else the first special token of "
                   + ", ".join(EOT_NAMES) + ")")
    p.add_argument("--vocab-size", type=_int_in(1, INT32_MAX), metavar="N",
                   help="the model's vocab_size: refuse a tokenizer with ids at or above it")
    return p


def run(args):
    """Tokenizes as the parsed arguments say; raises TokenizeError."""
    path = tokenizer_json(args.tokenizer)
    tok = load_tokenizer(path)
    n_ids = id_range(tok)
    if args.vocab_size is not None and n_ids > args.vocab_size:
        raise TokenizeError(f"--vocab-size {args.vocab_size}: {path} has ids up to {n_ids - 1}, "
                            f"which a model of vocab_size {args.vocab_size} cannot embed")
    eot, eot_token, source = end_of_text(tok, path, args.eot_id)
    files = input_files(args.files)
    version = S.SHARD_VERSION_U16 if n_ids <= 65536 else S.SHARD_VERSION_U32
    dtype = "<u2" if version == S.SHARD_VERSION_U16 else "<u4"
    print(f"{PROG}: {path}: ids 0..{n_ids - 1}, end of text {eot} {eot_token!r} ({source}), "
          f"shard version {version} ({'uint16' if version == 1 else 'uint32'})", file=sys.stderr)
    try:
        os.mkdir(args.out)
    except FileExistsError:
        pass
    except OSError as e:
        raise TokenizeError(f"--out {args.out}: cannot create: {e.strerror}")
    out = os.path.join(args.out, args.prefix)
    workers = min(args.workers, len(files))
    progress = Progress(len(files))
    total = nbytes = 0
    # The whole stream goes to an unnamed temporary file first: the split
    # point is known only at the end, and memory stays one shard.
    with tempfile.TemporaryFile(dir=args.out) as spill:
        for done, (tokens, size) in enumerate(encoded(files, tok, path, eot, dtype, workers), 1):
            tokens.tofile(spill)
            total += tokens.size
            nbytes += size
            progress.show(done, nbytes, total)
        progress.show(len(files), nbytes, total, last=True)
        n_val = min(math.ceil(args.val_fraction * total), total) if args.val_fraction else 0
        if n_val == total:
            raise TokenizeError(f"--val-fraction {args.val_fraction} of {total} tokens leaves "
                                "none to train on")
        try:
            train = write_split(spill, dtype, 0, total - n_val, out, "train", args.shard_tokens,
                                version)
            val = write_split(spill, dtype, total - n_val, n_val, out, "val", args.shard_tokens,
                              version)
        except LlmtError as e:
            raise TokenizeError(str(e))
    print(f"{len(files)} files, {nbytes} bytes, {total} tokens: train {total - n_val} tokens in "
          f"{train} shards, val {n_val} tokens in {val} shards; load with vocab_size >= {n_ids}")


def main(argv=None):
    """The command line; returns the exit status."""
    args = parser().parse_args(argv)
    try:
        run(args)
    except TokenizeError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
