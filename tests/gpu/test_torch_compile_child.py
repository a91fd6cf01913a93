#!/usr/bin/env python3
"""CTest's gpu_torch_compile_child: how torch_side_by_side.py waits for its
torch.compile child, with stand-in children (no PyTorch needed): one that
dies at once is reported as failed without waiting out --compile-start-s
(60 s of a GPU machine's budget), one that prints nothing is stopped at
start_s, one that prints the mark and its JSON line is reported as run."""
import os
import stat
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_side_by_side as tss  # noqa: E402


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def timed(f, *args):
    t = time.monotonic()
    r = f(*args)
    return r, time.monotonic() - t


def main():
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        # A child that dies at once (as one without torch, or whose CUDA
        # fails): compile_in_child runs sys.executable, here this script.
        dying = os.path.join(tmp, "dying")
        with open(dying, "w") as f:
            f.write("#!/bin/sh\necho 'ModuleNotFoundError: torch'\nexit 3\n")
        os.chmod(dying, stat.S_IRWXU)
        sys.executable = dying
        r, took = timed(tss.compile_in_child, 1, 100.0, 60.0, 120.0)
        check(took < 10, f"a child that died at once was waited on for {took:.0f} s")
        check(r["status"] == "not run: torch.compile failed before its first step "
              "(exit status 3)", f"status {r['status']!r}")
        check(r["output_tail"] == "ModuleNotFoundError: torch", f"tail {r['output_tail']!r}")

    r, took = timed(tss.run_compile_child, [py, "-c", "import time; time.sleep(30)"], 1.0, 5.0)
    check(took < 10, f"a silent child was not stopped at start_s (took {took:.0f} s)")
    check(r["status"] == "not run: torch.compile did not start within 1 s", f"{r['status']!r}")

    ok = ("print('" + tss.COMPILED_MARK + "12.5', flush=True); "
          "print('{\"mode\": \"compile\", \"step_s\": 0.25}')")
    r, _ = timed(tss.run_compile_child, [py, "-c", ok], 10.0, 10.0)
    check(r == {"mode": "compile", "step_s": 0.25, "status": "ran", "first_step_s": 12.5},
          f"a child that compiled: {r!r}")
    print("PASS: the compile child: died at once (no wait), silent (stopped), compiled (run)")


if __name__ == "__main__":
    main()
