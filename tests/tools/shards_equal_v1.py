#!/usr/bin/env python3
"""Decodes, by hand, a sharded checkpoint's per-rank optimizer files and a
single-file checkpoint's optimizer.safetensors (docs/checkpoint-format.md)
and says whether the state is the same bytes: each section of the v1 file
(exp_avg, exp_avg_sq, master) must be the ranks' 1-D tensors of that name
laid end to end in rank order. Usage: shards_equal_v1.py SHARDED_DIR V1_DIR"""
import glob
import json
import os
import struct
import sys


def read(path):
    """(header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        return header, f.read()


def tensor(header, data, name):
    start, end = header[name]["data_offsets"]
    return data[start:end]


def main(sharded, single):
    shards = sorted(glob.glob(os.path.join(sharded, "optimizer-*-of-*.safetensors")))
    worlds = {os.path.basename(p).split("-of-")[1] for p in shards}
    if not shards or len(worlds) != 1 or int(worlds.pop().split(".")[0]) != len(shards):
        sys.exit(f"{sharded}: not one complete set of optimizer-R-of-N.safetensors: {shards}")
    h1, d1 = read(os.path.join(single, "optimizer.safetensors"))
    names = [k for k in h1 if k != "__metadata__"]
    kinds = [k for k in ("exp_avg", "exp_avg_sq", "master") if any(n.endswith("." + k) for n in names)]
    if "exp_avg" not in kinds or "exp_avg_sq" not in kinds:
        sys.exit(f"{single}: no moments in optimizer.safetensors")
    # A v1 section is the flat buffer of one kind: its tensors in file order.
    sections = {}
    for kind in kinds:
        parts = sorted((h1[n]["data_offsets"] for n in names if n.endswith("." + kind)))
        sections[kind] = b"".join(d1[a:b] for a, b in parts)
    joined = {kind: b"" for kind in kinds}
    for path in shards:
        h, d = read(path)
        for kind in kinds:
            joined[kind] += tensor(h, d, kind)
    for kind in kinds:
        if joined[kind] != sections[kind]:
            sys.exit(f"{kind}: the {len(shards)} shards ({len(joined[kind])} bytes) differ from "
                     f"the single file's section ({len(sections[kind])} bytes)")
    print(f"{len(shards)} shards equal the single file's {', '.join(kinds)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
