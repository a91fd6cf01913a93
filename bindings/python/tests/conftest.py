"""Fixtures of the binding's tests. The package under test is the source
tree's (bindings/python/llmt); the library is $LLMT_LIBRARY, else what the
package finds. LLMT_INCLUDE_DIR (the public headers) and LLMT_TRAIN (the
llmt-train executable) default to the repository's include/llmt and the
llmt-train next to the library's build tree."""
import glob
import os
import sys
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_ROOT.parents[1]
sys.path.insert(0, str(PACKAGE_ROOT))

import llmt  # noqa: E402

#: A small model: fast enough for many steps in the suite.
SMALL_MODEL = dict(vocab_size=260, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   ffn_size=128, max_seq_len=64)
THREADS = 2


def corpus_files():
    """Regular text files to tokenize: a few licence texts (else the docs)."""
    files = sorted(p for p in glob.glob("/usr/share/common-licenses/*")
                   if os.path.isfile(p) and not os.path.islink(p))[:8]
    return files or sorted(glob.glob(str(REPO_ROOT / "docs" / "*.md")))


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    """Byte-token shards: {"dir", "train" (glob), "val" (glob), "report"}."""
    out = tmp_path_factory.mktemp("shards")
    report = llmt.tokenize_files(corpus_files(), out, prefix="text", shard_tokens=40000,
                                 val_fraction=0.05)
    return {"dir": out, "train": str(out / "text_train_*.bin"),
            "val": str(out / "text_val_*.bin"), "report": report}


@pytest.fixture
def ctx():
    """A CPU context with 2 threads and seed 1, closed after the test."""
    with llmt.Context(num_threads=THREADS, seed=1) as c:
        yield c


@pytest.fixture(scope="session")
def include_dir():
    return Path(os.environ.get("LLMT_INCLUDE_DIR", REPO_ROOT / "include" / "llmt"))


@pytest.fixture(scope="session")
def llmt_train():
    """The llmt-train executable."""
    path = os.environ.get("LLMT_TRAIN") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.realpath(llmt.library_path))),
        "examples", "llmt-train")
    if not os.access(path, os.X_OK):
        pytest.skip(f"llmt-train not found (set LLMT_TRAIN): {path}")
    return path


def small_config(shards, overrides=None):
    """A training configuration dict over the small model and the shards,
    with ``overrides`` (dotted keys: {"train.steps": 4}) applied."""
    cfg = {"model": dict(SMALL_MODEL, tie_embeddings=True),
           "optimizer": {"lr": 3e-3},
           "batch": {"batch_size": 4, "micro_batch": 4, "seq_len": 32},
           "data": {"train": shards["train"], "val": shards["val"]},
           "train": {"steps": 8, "seed": 7, "threads": THREADS, "eval_batches": 2}}
    cfg.update(overrides or {})
    return cfg
