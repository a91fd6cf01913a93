#!/usr/bin/env python3
"""torch_side_by_side.py's model, shrunk, trained one step on the CPU: it
must build, run forward and backward, and give a finite loss, so a shape
error (as its RoPE once had) shows here, not in the GPU machine's few
minutes. Skipped (77) where PyTorch is not installed, as in CI."""
import importlib.util
import math
import os
import sys

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("side", os.path.join(here, "torch_side_by_side.py"))
side = importlib.util.module_from_spec(spec)
spec.loader.exec_module(side)
side.CFG.update(vocab=64, d=32, layers=2, heads=4, kv_heads=2, ffn=48, batch=2, seq=8)
torch.manual_seed(0)
model = side.build_model(torch, side.CFG)
tokens, targets = side.batch(torch, side.CFG)
loss = model(tokens, targets)
loss.backward()
grads = [p.grad for p in model.parameters()]
assert math.isfinite(loss.item()), loss
assert all(g is not None and torch.isfinite(g).all() for g in grads)
print(f"ok: loss {loss.item():.4f}, {len(grads)} gradients finite")
