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
import time

CFG = dict(vocab=8192, d=512, layers=8, heads=8, kv_heads=8, ffn=1408, batch=4, seq=512,
           eps=1e-5, theta=10000.0)


def batch(torch):
    """bench_step's tokens and targets: (i * 2654435761) mod 2^32 mod vocab."""
    n = CFG["batch"] * CFG["seq"]
    i = torch.arange(n, dtype=torch.int64)
    tok = ((i * 2654435761) & 0xFFFFFFFF) % CFG["vocab"]
    tgt = (((i + 1) * 2654435761) & 0xFFFFFFFF) % CFG["vocab"]
    shape = (CFG["batch"], CFG["seq"])
    return tok.view(shape), tgt.view(shape)


def build_model(torch):
    nn, F = torch.nn, torch.nn.functional
    d, hd = CFG["d"], CFG["d"] // CFG["heads"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + CFG["eps"])
            return (y * self.weight).to(x.dtype)

    def rope(x, cos, sin):  # x [b, h, t, hd], rotate-half pairing
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            kv = CFG["kv_heads"] * hd
            self.attn_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.q = nn.Linear(d, d, bias=False)
            self.k = nn.Linear(d, kv, bias=False)
            self.v = nn.Linear(d, kv, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.gate = nn.Linear(d, CFG["ffn"], bias=False)
            self.up = nn.Linear(d, CFG["ffn"], bias=False)
            self.down = nn.Linear(CFG["ffn"], d, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q = self.q(h).view(b, t, CFG["heads"], hd).transpose(1, 2)
            k = self.k(h).view(b, t, CFG["kv_heads"], hd).transpose(1, 2)
            v = self.v(h).view(b, t, CFG["kv_heads"], hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            h = self.ffn_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class LLaMA(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(CFG["vocab"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(CFG["layers"]))
            self.norm = RMSNorm()
            self.head = nn.Linear(d, CFG["vocab"], bias=False)
            inv = 1.0 / CFG["theta"] ** (torch.arange(0, hd, 2).float() / hd)
            ang = torch.outer(torch.arange(CFG["seq"]).float(), inv)
            self.register_buffer("cos", ang.cos(), persistent=False)  # [T, hd / 2]
            self.register_buffer("sin", ang.sin(), persistent=False)

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for blk in self.blocks:
                x = blk(x, self.cos, self.sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, CFG["vocab"]), targets.view(-1))

    return LLaMA()


class TorchRun:
    """One PyTorch mode ('fp32' or 'bf16' autocast), its model kept across rounds."""

    def __init__(self, torch, mode):
        self.torch, self.mode = torch, mode
        torch.manual_seed(0)
        self.model = build_model(torch)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                                     eps=1e-8, weight_decay=0.1, fused=True)
        self.tokens, self.targets = batch(torch)
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
