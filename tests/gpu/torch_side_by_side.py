#!/usr/bin/env python3
"""The ~1B LLaMA of tests/bench/bench_gpu_step.c trained in PyTorch, for the
side-by-side of tests/gpu/run.sh: same architecture (d 2048, 16 layers, 16
heads of 128, 8 kv heads, SwiGLU ffn 5632, vocab 32000, untied head, RMSNorm
eps 1e-5, RoPE theta 1e4), same batch (8 x 2048 tokens, the benchmark's
token formula), same step (zero grads, forward, backward, gradient clipping
at norm 1, AdamW lr 3e-4, betas 0.9/0.95, weight decay 0.1).

Precision: PyTorch's usual bf16 mixed precision, fp32 weights under
torch.autocast(bfloat16) with the fused AdamW, 16 bytes per parameter of
weights, gradients and moments like libllmt's BF16_MIXED (which keeps bf16
weights and gradients and an fp32 master copy instead).

Runs eager mode (attention by F.scaled_dot_product_attention, causal, GQA)
in this process, then torch.compile in a child process that must finish its
first (compiling) step within --compile-start-s seconds or is stopped and
reported as not started. Prints, per mode, the median step time, tokens/s,
model TFLOP/s and MFU (the benchmark's FLOP formula) against PyTorch's own
bf16 GEMM rate and the 989 TFLOP/s datasheet peak, and the peak memory with
its parts; --json writes the same as one JSON object.

  python3 tests/gpu/torch_side_by_side.py [--steps 5] [--json FILE]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from torch_llama import batch, build_model  # noqa: E402 (after the path)

DATASHEET_BF16_TFLOPS = 989.4  # H100/H200 SXM, dense bf16
CFG = dict(vocab=32000, d=2048, layers=16, heads=16, kv_heads=8, ffn=5632, batch=8, seq=2048,
           eps=1e-5, theta=10000.0)
COMPILED_MARK = "compiled-first-step-s "


def model_flops_per_step(params):
    tokens = CFG["batch"] * CFG["seq"]
    return 6.0 * params * tokens + 12.0 * CFG["layers"] * CFG["d"] * CFG["seq"] * tokens


def gemm_tflops(torch, n=8192, reps=10):
    """PyTorch's bf16 GEMM rate on random data, best of reps after warm-up."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    best = math.inf
    for r in range(reps + 2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b.t()
        torch.cuda.synchronize()
        if r >= 2:
            best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best / 1e12


def train(torch, mode, steps, gemm_rate, on_first_step=None):
    """Builds the model (compiled when mode is 'compile'), runs 1 warm-up and
    `steps` timed steps; returns the figures."""
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    model = build_model(torch, CFG).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if mode == "compile" else model
    tokens, targets = batch(torch, CFG, "cuda")
    times, loss = [], float("nan")
    for s in range(steps + 1):  # step 0 warms up (and compiles)
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = step_fn(tokens, targets)
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = out.item()  # synchronises, like libllmt's loss
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        if s == 0 and on_first_step:
            on_first_step(dt)
        if s > 0:
            times.append(dt)
    step = statistics.median(times)
    tflops = model_flops_per_step(params) / step / 1e12
    gib = 1024.0 ** 3
    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    g_bytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                  if p.grad is not None)
    o_bytes = sum(t.numel() * t.element_size() for st in opt.state.values()
                  for t in st.values() if torch.is_tensor(t))
    peak = torch.cuda.max_memory_allocated()
    return {"mode": mode, "params": params, "batch": CFG["batch"], "seq_len": CFG["seq"],
            "steps": steps, "step_s": step, "tokens_per_s": CFG["batch"] * CFG["seq"] / step,
            "model_tflops": tflops, "mfu_vs_measured_gemm": tflops / gemm_rate,
            "mfu_vs_datasheet": tflops / DATASHEET_BF16_TFLOPS,
            "loss": loss if math.isfinite(loss) else None,
            "peak_allocated_gib": peak / gib,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib,
            "params_gib": p_bytes / gib, "grads_gib": g_bytes / gib,
            "optimizer_gib": o_bytes / gib,
            "activations_and_workspace_gib": (peak - p_bytes - g_bytes - o_bytes) / gib}


def show(r):
    print(f"{r['mode']:<8} {r['params'] / 1e6:6.0f}M {r['batch']:3d} {r['seq_len']:5d} "
          f"{r['step_s']:8.3f} {r['tokens_per_s']:10.0f} {r['model_tflops']:8.1f} "
          f"{100 * r['mfu_vs_measured_gemm']:8.1f}% {100 * r['mfu_vs_datasheet']:7.1f}% "
          f"{r['peak_allocated_gib']:8.2f} (params {r['params_gib']:.2f}, grads "
          f"{r['grads_gib']:.2f}, optimizer {r['optimizer_gib']:.2f}, rest "
          f"{r['activations_and_workspace_gib']:.2f}) loss {r['loss']}", flush=True)


def compile_in_child(steps, gemm_rate, start_s, total_s):
    """torch.compile in a fresh process: its result, or why there is none."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child-compile", "--steps", str(steps),
           "--gemm-rate", repr(gemm_rate)]
    return run_compile_child(cmd, start_s, total_s)


def run_compile_child(cmd, start_s, total_s):
    """Runs cmd, the compiling child: waits at most start_s seconds for its
    COMPILED_MARK line, no longer once its output ends (it died: a child that
    fails at once costs no waiting), then at most total_s for it to finish;
    its result (its JSON line), or why there is none."""
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = threading.Event()  # the mark was printed
    settled = threading.Event()  # the mark was printed, or the output ended
    lines = []

    def read():
        try:
            for line in child.stdout:
                lines.append(line)
                if line.startswith(COMPILED_MARK):
                    started.set()
                    settled.set()
        finally:
            settled.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    settled.wait(start_s)
    if not started.is_set():
        try:  # its output ended: it has exited or is exiting
            code = child.wait(5) if settled.is_set() else None
        except subprocess.TimeoutExpired:
            code = None
        child.kill()
        child.wait()
        reader.join(5)
        why = (f"did not start within {start_s:.0f} s" if code is None
               else f"failed before its first step (exit status {code})")
        return {"mode": "compile", "status": f"not run: torch.compile {why}",
                "output_tail": "".join(lines[-5:]).strip()}
    try:
        child.wait(total_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return {"mode": "compile", "status": f"compiled but did not finish within {total_s} s"}
    reader.join(5)
    for line in lines:
        if line.startswith("{"):
            r = json.loads(line)
            r["status"] = "ran"
            r["first_step_s"] = float(next(l for l in lines if l.startswith(COMPILED_MARK))
                                      .split()[1])
            return r
    return {"mode": "compile", "status": f"exit status {child.returncode}",
            "output_tail": "".join(lines[-5:]).strip()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--compile-start-s", type=float, default=60.0)
    ap.add_argument("--compile-total-s", type=float, default=120.0)
    ap.add_argument("--child-compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gemm-rate", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.steps < 1:
        ap.error("--steps must be at least 1")
    import torch  # here, so that the file compiles and --help runs without torch

    if not torch.cuda.is_available():
        print("torch_side_by_side: FAILED: torch sees no CUDA device", flush=True)
        return 1
    if a.child_compile:
        r = train(torch, "compile", a.steps, a.gemm_rate,
                  lambda dt: print(f"{COMPILED_MARK}{dt:.1f}", flush=True))
        print(json.dumps(r), flush=True)
        return 0
    name = torch.cuda.get_device_name()
    rate = gemm_tflops(torch)
    print(f"torch {torch.__version__} on {name}; bf16 GEMM 8192^3 (torch.matmul): {rate:.1f} "
          f"TFLOP/s (datasheet peak {DATASHEET_BF16_TFLOPS:.0f})", flush=True)
    print("mode     params   B     T  step(s)   tokens/s  TFLOP/s MFU(gemm) MFU(989) "
          "peak GiB (parts)", flush=True)
    eager = train(torch, "eager", a.steps, rate)
    show(eager)
    torch.cuda.empty_cache()
    compiled = compile_in_child(a.steps, rate, a.compile_start_s, a.compile_total_s)
    if compiled.get("status") == "ran":
        show(compiled)
    else:
        print(f"compile  {compiled['status']}", flush=True)
    result = {"torch": torch.__version__, "device": name, "gemm_bf16_tflops": rate,
              "datasheet_bf16_tflops": DATASHEET_BF16_TFLOPS, "precision":
              "fp32 weights, torch.autocast(bfloat16), fused AdamW", "eager": eager,
              "compile": compiled}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
