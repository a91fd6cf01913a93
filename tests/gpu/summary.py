#!/usr/bin/env python3
"""Writes tests/gpu/run.sh's gpu-summary.json from its records, as valid
JSON whatever the text holds (control characters, quotes, backslashes,
bytes that are not UTF-8: replaced by U+FFFD).

  summary.py FILE MODE BUDGET_S ELAPSED_S FAILED BENCH_JSON TORCH_JSON
             NHOST [KEY VALUE]... [NAME STATUS SECONDS NOTE]...

NHOST pairs describe the host; every four arguments after them are one
stage. BENCH_JSON and TORCH_JSON (the benchmark's and PyTorch's results)
are embedded when the stage of that name passed and the file parses, else
null: a broken file must not break the summary. Their non-finite numbers
(NaN, +-Infinity, or a literal beyond a double such as 1e999, which
Python's json reads as inf) become null, which JSON can say: PyTorch's loss
starts at NaN."""
import json
import math
import os
import sys


def text(arg):
    return os.fsencode(arg).decode("utf-8", "replace")


def finite(value):
    """value with every non-finite float in it (at any depth) as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def result_file(stages, name, path):
    if not any(s["name"] == name and s["status"] == "pass" for s in stages):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return finite(json.load(f))
    except (OSError, ValueError):
        return None


def main(argv):
    if len(argv) < 9:
        sys.exit("usage: summary.py FILE MODE BUDGET_S ELAPSED_S FAILED BENCH_JSON TORCH_JSON "
                 "NHOST [KEY VALUE]... [NAME STATUS SECONDS NOTE]...")
    path, mode, budget, elapsed, failed, bench, torch, nhost = argv[1:9]
    rest = [text(a) for a in argv[9:]]
    nhost = int(nhost)
    host_args, stage_args = rest[:2 * nhost], rest[2 * nhost:]
    if len(host_args) != 2 * nhost or len(stage_args) % 4:
        sys.exit("summary.py: the host pairs or stage quadruples are incomplete")
    stages = [{"name": n, "status": st, "seconds": int(sec), "note": note}
              for n, st, sec, note in zip(*[iter(stage_args)] * 4)]
    summary = {"kit": "tests/gpu/run.sh", "mode": mode, "budget_s": int(budget),
               "elapsed_s": int(elapsed), "failed_stages": int(failed),
               "result": "pass" if int(failed) == 0 else "fail",
               "host": dict(zip(host_args[0::2], host_args[1::2])), "stages": stages,
               "bench": result_file(stages, "bench", bench),
               "torch": result_file(stages, "torch", torch)}
    with open(path, "w", encoding="ascii") as f:
        # ensure_ascii: every character beyond ASCII escaped; allow_nan=False:
        # a non-finite number left would raise here rather than write NaN.
        json.dump(summary, f, allow_nan=False)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv)
