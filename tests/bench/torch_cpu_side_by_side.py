#!/usr/bin/env python3
"""libllmt's CPU training step against PyTorch's on the same model and batch,
interleaved in one run, for docs/PERFORMANCE.md (issue 18).

Model: the `small` config of tests/bench/bench_step.c (dim 512, 8 layers, 8
heads, SwiGLU ffn 1408, vocab 8192, untied head, RMSNorm eps 1e-5, RoPE
theta 1e4), batch 4 x 512 with bench_step's tokens; step: zero grads,
forward, backward, clipping at global norm 1, AdamW (lr 3e-4, betas
0.9/0.95, weight decay 0.1). Same thread count for both.

PyTorch runs eager fp32 and bf16 autocast (fp32 weights, matmuls in bf16,
oneDNN) with its fused CPU AdamW, attention by scaled_dot_product_attention.
libllmt runs through bench_step (fp32 and bf16 = BF16_MIXED, their steps
interleaved) in a child process, so the two libraries' OpenMP runtimes never
share the cores. Each round runs bench_step for `--steps` steps of each mode,
then as many PyTorch steps of each mode; the ratios are taken per round
(min against min), and their min and median over the rounds are printed,
then the ratios of the best steps of all rounds.

Needs PyTorch, which the project does not depend on; for example
  python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch
  /work/venv-torch/bin/python tests/bench/torch_cpu_side_by_side.py \\
      --bench build/tests/bench/bench_step [--rounds 3] [--steps 3] [--threads 2]
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from torch_llama import batch, build_model  # noqa: E402 (after the path)

CFG = dict(vocab=8192, d=512, layers=8, heads=8, kv_heads=8, ffn=1408, batch=4, seq=512,
           eps=1e-5, theta=10000.0)


class TorchRun:
    """One PyTorch mode ('fp32' or 'bf16' autocast), its model kept across rounds."""

    def __init__(self, torch, mode):
        self.torch, self.mode = torch, mode
        torch.manual_seed(0)
        self.model = build_model(torch, CFG)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                                     eps=1e-8, weight_decay=0.1, fused=True)
        self.tokens, self.targets = batch(torch, CFG)
        self.step()  # warm-up

    def step(self):
        torch = self.torch
        t = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.mode == "bf16"):
            loss = self.model(self.tokens, self.targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        loss.item()
        return time.perf_counter() - t


def ours(bench, steps, threads):
    """min step seconds of fp32 and bf16 from one bench_step run, and its header."""
    out = subprocess.run([bench, "small", str(steps), str(threads), "fp32,bf16"], check=True,
                         capture_output=True, text=True).stdout
    mins = {}
    for line in out.splitlines():
        m = re.match(r"small\s+(fp32|bf16)\s+([0-9.]+)\s+([0-9.]+)", line)
        if m:
            mins[m.group(1)] = float(m.group(2))
    if set(mins) != {"fp32", "bf16"}:
        raise SystemExit(f"torch_cpu_side_by_side: unexpected bench_step output:\n{out}")
    return mins, out.splitlines()[:2]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default="build/tests/bench/bench_step")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch  # noqa: E402 (optional dependency: imported only here)

    torch.set_num_threads(args.threads)
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, {args.threads} threads, "
          f"load average {os.getloadavg()[0]:.2f}; PyTorch {torch.__version__}")
    runs = {m: TorchRun(torch, m) for m in ("fp32", "bf16")}
    ratios = {k: [] for k in ("ours bf16 vs ours fp32", "ours fp32 vs torch fp32",
                              "ours bf16 vs torch bf16", "torch bf16 vs torch fp32")}
    steps = {k: [] for k in ("ours fp32", "ours bf16", "torch fp32", "torch bf16")}
    print("round  ours fp32  ours bf16  torch fp32  torch bf16   (min step s)")
    for r in range(args.rounds):
        mine, header = ours(args.bench, args.steps, args.threads)
        if r == 0:
            print("  " + "\n  ".join(header))
        theirs = {m: min(run.step() for _ in range(args.steps)) for m, run in runs.items()}
        print(f"{r:5d} {mine['fp32']:10.3f} {mine['bf16']:10.3f} {theirs['fp32']:11.3f} "
              f"{theirs['bf16']:11.3f}")
        for k, v in (("ours fp32", mine["fp32"]), ("ours bf16", mine["bf16"]),
                     ("torch fp32", theirs["fp32"]), ("torch bf16", theirs["bf16"])):
            steps[k].append(v)
        ratios["ours bf16 vs ours fp32"].append(mine["fp32"] / mine["bf16"])
        ratios["ours fp32 vs torch fp32"].append(theirs["fp32"] / mine["fp32"])
        ratios["ours bf16 vs torch bf16"].append(theirs["bf16"] / mine["bf16"])
        ratios["torch bf16 vs torch fp32"].append(theirs["fp32"] / theirs["bf16"])
    print("speed-up (their step time / our step time), per round:")
    for k, v in ratios.items():
        print(f"  {k:<26} min {min(v):.2f}  median {statistics.median(v):.2f}")
    best = {k: min(v) for k, v in steps.items()}
    print("best step of all rounds (s): " + ", ".join(f"{k} {v:.3f}" for k, v in best.items()))
    print(f"  from those: ours bf16 vs ours fp32 {best['ours fp32'] / best['ours bf16']:.2f}, "
          f"ours fp32 vs torch fp32 {best['torch fp32'] / best['ours fp32']:.2f}, "
          f"ours bf16 vs torch bf16 {best['torch bf16'] / best['ours bf16']:.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
