"""examples/train_and_plot.py without matplotlib (the "plot" extra): --help
works, and asking for a plot says how to get matplotlib before any training.
matplotlib is hidden by a shim: None in sys.modules makes its import fail."""
import os
import subprocess
import sys

from conftest import PACKAGE_ROOT

SCRIPT = str(PACKAGE_ROOT / "examples" / "train_and_plot.py")
# python -c SHIM SCRIPT ARGS...: runs SCRIPT as __main__ with ARGS, matplotlib hidden.
SHIM = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_without_matplotlib(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    return subprocess.run([sys.executable, "-c", SHIM, SCRIPT, *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_shim_hides_matplotlib(tmp_path):
    hidden = subprocess.run([sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
                             "import matplotlib"], capture_output=True, text=True, cwd=tmp_path)
    assert hidden.returncode != 0 and "import of matplotlib halted" in hidden.stderr


def test_help_without_matplotlib(tmp_path):
    r = run_without_matplotlib("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: train_and_plot.py") and "--no-plot" in r.stdout


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path):
    out = tmp_path / "out"
    r = run_without_matplotlib("--out", str(out), "--steps", "2", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "pip install 'llmt[plot]'" in r.stderr
    assert "apt install python3-matplotlib" in r.stderr and "--no-plot" in r.stderr
    assert not out.exists()  # refused before training


def test_png_and_no_plot_contradict(tmp_path):
    r = run_without_matplotlib("--no-plot", "--png", "x.png", cwd=tmp_path)
    assert r.returncode == 2 and "--png and --no-plot" in r.stderr
