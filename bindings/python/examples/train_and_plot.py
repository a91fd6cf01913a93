#!/usr/bin/env python3
"""Trains the default llmt-train model (3M parameters, byte-level) on the
licence texts of /usr/share/common-licenses, checkpointing as it goes;
stops half-way, resumes from the newest checkpoint in a new trainer, trains
on, and plots the loss and the memory per category over the steps.

    python3 train_and_plot.py [--out DIR] [--steps N] [--png FILE | --no-plot]

DIR (default: a new temporary directory) receives data/, checkpoints/ and,
unless --png says otherwise, train_and_plot.png. Run it again with the same
--out and it resumes from the newest checkpoint there. Plotting needs
matplotlib, the package's "plot" extra; without it, --no-plot only trains.
"""
import argparse
import glob
import os
import sys
import tempfile

import llmt

# How to get matplotlib, said when plotting is asked for without it.
MATPLOTLIB_HINT = ("plotting needs matplotlib, which this Python cannot import: "
                   "pip install 'llmt[plot]' (from a checkout: pip install "
                   "'bindings/python[plot]'), or on Debian: apt install python3-matplotlib; "
                   "or pass --no-plot to train without plotting")

# llmt-train's embedded default configuration (examples/llmt-train.c).
DEFAULT_MODEL = dict(vocab_size=320, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                     ffn_size=704, max_seq_len=256, tie_embeddings=True)


def make_shards(data_dir):
    """Tokenizes the licence texts into data_dir once; returns the globs."""
    train = os.path.join(data_dir, "text_train_*.bin")
    val = os.path.join(data_dir, "text_val_*.bin")
    if not glob.glob(train):
        texts = sorted(p for p in glob.glob("/usr/share/common-licenses/*")
                       if os.path.isfile(p) and not os.path.islink(p))
        r = llmt.tokenize_files(texts, data_dir, val_fraction=0.05)
        print(f"tokenized {r.files} files: {r.train_tokens} training tokens, "
              f"{r.val_tokens} held out")
    return train, val


def config(out, steps):
    train, val = make_shards(os.path.join(out, "data"))
    return {"model": DEFAULT_MODEL,
            "optimizer": {"lr": 3e-3, "weight_decay": 0.1, "grad_clip": 1.0},
            "schedule": {"kind": "cosine", "warmup_steps": max(steps // 10, 1),
                         "total_steps": steps, "min_lr": 3e-4},
            "batch": {"batch_size": 8, "micro_batch": 8, "seq_len": 256},
            "data": {"train": train, "val": val},
            "train": {"steps": steps, "eval_every": max(steps // 4, 1), "eval_batches": 4,
                      "seed": 1234},
            "checkpoint": {"dir": os.path.join(out, "checkpoints"),
                           "every": max(steps // 6, 1), "keep": 3}}


def progress(report):
    """Prints every 10th step; returning False lets the run go on."""
    if report.step % 10 == 0 or report.eval_loss is not None:
        held_out = f"  held-out {report.eval_loss:.4f}" if report.eval_loss is not None else ""
        saved = "  [saved]" if report.checkpointed else ""
        print(f"step {report.step:4d}  loss {report.loss:.4f}  "
              f"{report.tokens_per_second:6.0f} tok/s  "
              f"peak {report.mem_peak / 2**20:.1f} MiB{held_out}{saved}")
    return False


def train_phase(cfg, steps, label):
    """A trainer from cfg (its context made from train.seed/threads), resumed
    from the newest checkpoint, run for ``steps`` steps; returns the reports."""
    with llmt.Trainer.from_config(None, cfg) as tr:
        tr.on_log(lambda line: print("  " + line))
        start = tr.resume_latest()
        print(f"{label}: {tr.model.num_params} parameters; "
              f"{'resuming from step %d' % start if start is not None else 'starting afresh'}")
        return tr.run(steps, callback=progress)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None without
    matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot
    return matplotlib.pyplot


def plot(plt, reports, resumed_at, path):
    steps = [r.step for r in reports]
    fig, (ax_loss, ax_mem) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    ax_loss.plot(steps, [r.loss for r in reports], label="training loss", lw=1)
    evals = [(r.step, r.eval_loss) for r in reports if r.eval_loss is not None]
    if evals:
        ax_loss.plot(*zip(*evals), "o-", label="held-out loss")
    ax_loss.set_ylabel("loss (nats)")
    mib = 2**20
    ax_mem.stackplot(steps, *[[r.memory[c] / mib for r in reports] for c in llmt.CATEGORIES],
                     labels=llmt.CATEGORIES)
    ax_mem.plot(steps, [r.mem_peak / mib for r in reports], "k--", lw=1,
                label="peak during the step")
    ax_mem.set_ylabel("memory after the step (MiB)")
    ax_mem.set_xlabel("step")
    for ax in (ax_loss, ax_mem):
        if resumed_at is not None:
            ax.axvline(resumed_at + 0.5, color="grey", ls=":", label="stopped and resumed")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        ax.grid(alpha=0.3)
    ax_loss.set_title("libllmt from Python: loss and memory per category")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="working directory (default: a new temporary one)")
    parser.add_argument("--steps", type=int, default=60, help="steps in all (default 60)")
    parser.add_argument("--png", help="the plot (default OUT/train_and_plot.png)")
    parser.add_argument("--no-plot", action="store_true",
                        help="train only: no plot, so no need for matplotlib")
    args = parser.parse_args()
    if args.no_plot and args.png:
        parser.error("--png and --no-plot contradict each other")
    # Checked before training, so a missing matplotlib costs no minutes.
    plt = None if args.no_plot else pyplot()
    if not args.no_plot and plt is None:
        print(f"{parser.prog}: {MATPLOTLIB_HINT}", file=sys.stderr)
        sys.exit(2)
    out = args.out or tempfile.mkdtemp(prefix="llmt-train-and-plot-")
    os.makedirs(out, exist_ok=True)
    cfg = config(out, args.steps)

    first = train_phase(cfg, args.steps // 2, "first trainer")
    stopped_at = first[-1].step if first else None
    second = train_phase(cfg, None, "second trainer")
    # The second trainer resumed from the newest checkpoint, at or before
    # where the first stopped: its reports replace the first's from there.
    resumed_at = second[0].step - 1 if second else stopped_at
    reports = [r for r in first if r.step <= resumed_at] + second
    if plt is not None:
        path = args.png or os.path.join(out, "train_and_plot.png")
        plot(plt, reports, resumed_at if first else None, path)
        print(f"plot: {path}")


if __name__ == "__main__":
    main()
