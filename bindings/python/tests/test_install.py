"""The package installs offline with pip into a virtual environment (from
a copy of bindings/python, so the source tree gets no build files)."""
import os
import shutil
import subprocess
import sys

import llmt
from conftest import PACKAGE_ROOT


def test_pip_installs_offline_into_a_venv(tmp_path):
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True)
    assert made.returncode == 0, f"cannot make a venv (python3-venv): {made.stderr.strip()}"
    source = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT, source, ignore=shutil.ignore_patterns(
        "tests", "examples", "__pycache__", "libllmt.so*"))
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", str(source)],
                   check=True, capture_output=True)
    env = dict(os.environ, LLMT_LIBRARY=os.path.realpath(llmt.library_path))
    result = subprocess.run(
        [python, "-c", "import llmt; ctx = llmt.Context(); "
                       "print(llmt.__file__, llmt.library_version, llmt.Model(ctx).num_params)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    location, version, params = result.stdout.split()
    assert location.startswith(str(venv)) and version == "0.1.0" and int(params) > 0
