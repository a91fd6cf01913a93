"""A minimal PEP 517 build backend for the llmt package, shipped in the tree
so that `pip install bindings/python` needs nothing from the network: the
package is pure Python (ctypes), so a wheel is a zip of llmt/ plus metadata.
A libllmt.so.0 copied into llmt/ is included (it is then found next to the
package)."""
import base64
import hashlib
import os
import zipfile

NAME = "llmt"
VERSION = "0.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Python binding (ctypes) of libllmt, a C library for training LLaMA models
License: Apache-2.0
Requires-Python: >=3.9
Requires-Dist: numpy
Provides-Extra: plot
Requires-Dist: matplotlib; extra == "plot"
Provides-Extra: test
Requires-Dist: pytest; extra == "test"
"""
WHEEL = """Wheel-Version: 1.0
Generator: llmt_wheel
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _package_files():
    """Files of the package, relative to ROOT, sorted (reproducible wheels)."""
    found = []
    for folder, dirs, files in os.walk(os.path.join(ROOT, NAME)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py") or f.startswith("libllmt.so"):
                found.append(os.path.relpath(os.path.join(folder, f), ROOT))
    return found


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}\n"


def get_requires_for_build_wheel(config_settings=None):
    """Nothing: the backend uses the standard library only."""
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """Writes llmt-VERSION-py3-none-any.whl into wheel_directory."""
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    record = ""
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for rel in _package_files():
            with open(os.path.join(ROOT, rel), "rb") as f:
                data = f.read()
            z.writestr(rel, data)
            record += _record_line(rel, data)
        for meta, text in (("METADATA", METADATA), ("WHEEL", WHEEL)):
            z.writestr(f"{info}/{meta}", text)
            record += _record_line(f"{info}/{meta}", text.encode())
        z.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
    return name
