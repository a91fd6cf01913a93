"""The package installs offline with pip into a virtual environment (from
a copy of bindings/python, so the source tree gets no build files), and its
wheel declares the extras of pyproject.toml."""
import os
import re
import shutil
import subprocess
import sys
import zipfile

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


def pyproject_extras():
    """{extra: [requirement, ...]} of [project.optional-dependencies], read by
    hand (tomllib is not in every supported Python)."""
    text = (PACKAGE_ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    return {m.group(1): re.findall(r'"([^"]+)"', m.group(2))
            for m in re.finditer(r'^(\w+) = \[(.*)\]$', section, re.M)}


def test_wheel_declares_the_extras(tmp_path):
    sys.path.insert(0, str(PACKAGE_ROOT / "build_backend"))
    try:
        import llmt_wheel
    finally:
        sys.path.pop(0)
    name = llmt_wheel.build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as z:
        metadata = z.read(f"llmt-{llmt_wheel.VERSION}.dist-info/METADATA").decode()
    extras = pyproject_extras()
    assert extras.get("plot") == ["matplotlib"]
    declared = re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M)
    assert sorted(declared) == sorted(extras)
    for extra, requirements in extras.items():
        for req in requirements:
            assert f'Requires-Dist: {req}; extra == "{extra}"' in metadata
