"""The binding stays in step with the C API: the functions it declares are
exactly the LLMT_API declarations of the headers, all exist in the library,
and every struct mirror has the C layout."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

import llmt
from llmt import _lib, _structs, errors

DECLARATION = re.compile(r"^LLMT_API [^(]*[^a-z0-9_](llmt_[a-z0-9_]+)\(")


def header_functions(include_dir):
    """The function names of the LLMT_API declarations, parsed as
    tests/api/check_exports.sh parses them."""
    names = set()
    for header in sorted(include_dir.glob("*.h")):
        for line in header.read_text().splitlines():
            if line.startswith("LLMT_API "):
                match = DECLARATION.match(line)
                assert match, f"{header.name}: cannot parse {line!r}"
                names.add(match.group(1))
    return names


def test_declared_functions_equal_the_headers(include_dir):
    headers = header_functions(include_dir)
    assert len(headers) > 100
    declared = set(_lib.FUNCTIONS)
    assert not headers - declared, f"functions without a binding: {sorted(headers - declared)}"
    assert not declared - headers, f"bound but not in the headers: {sorted(declared - headers)}"


def test_every_declared_function_is_in_the_library():
    for name, (result, arguments) in _lib.FUNCTIONS.items():
        fn = getattr(_lib._cdll, name)  # AttributeError when missing
        assert getattr(_lib.lib, name) is fn
        assert fn.argtypes == arguments, name


def test_every_public_struct_has_a_mirror(include_dir):
    defined = set()
    # comm_mpi.h is compiled in the host program against its MPI: no ABI.
    for header in set(include_dir.glob("*.h")) - {include_dir / "comm_mpi.h"}:
        defined |= set(re.findall(r"^typedef struct (llmt_[a-z0-9_]+) \{", header.read_text(),
                                  re.MULTILINE))
    assert defined == {cls.__name__ for cls in _structs.STRUCTS}


def _layout_program():
    """C source printing the size and field offsets of every mirrored
    struct, the constants the binding copies, and the status codes."""
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include <llmt/llmt.h>',
             'int main(void) {']
    for cls in _structs.STRUCTS:
        lines.append(f'printf("{cls.__name__} %zu\\n", sizeof({cls.__name__}));')
        for field, _ in cls._fields_:
            lines.append(f'printf("{cls.__name__}.{field} %zu\\n", '
                         f'offsetof({cls.__name__}, {field}));')
        if hasattr(cls, "VERSION"):
            macro = cls.__name__.upper() + "_VERSION"
            lines.append(f'printf("{cls.__name__}.VERSION %d\\n", (int){macro});')
    for name in ("VERSION_NUMBER", "MEM_CATEGORY_SLOTS", "MEM_CATEGORY_COUNT",
                 "CONFIG_PATH_MAX", "BYTE_VOCAB", "TOKEN_EOT", "SHARD_VERSION_U16",
                 "SHARD_VERSION_U32"):
        lines.append(f'printf("{name} %d\\n", (int)LLMT_{name});')
    for name in ("OK", "EINVAL", "ENOMEM", "EIO", "ECORRUPT", "EVERSION", "EUNSUPPORTED",
                 "ECUDA", "ESTATE", "ENOTFOUND", "EBUSY"):
        lines.append(f'printf("status.{name} %d\\n", (int)LLMT_{name});')
    lines += ['return 0;', '}']
    return "\n".join(lines) + "\n"


def test_struct_layouts_and_constants_match_the_headers(include_dir, tmp_path):
    cc = shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text(_layout_program())
    subprocess.run([cc, "-std=c99", f"-I{include_dir.parent}", str(src), "-o", str(exe)],
                   check=True)
    c = dict(line.rsplit(" ", 1) for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    py = {}
    for cls in _structs.STRUCTS:
        py[cls.__name__] = ctypes.sizeof(cls)
        for field, _ in cls._fields_:
            py[f"{cls.__name__}.{field}"] = getattr(cls, field).offset
        if hasattr(cls, "VERSION"):
            py[f"{cls.__name__}.VERSION"] = cls.VERSION
    for name in ("VERSION_NUMBER", "MEM_CATEGORY_SLOTS", "MEM_CATEGORY_COUNT",
                 "CONFIG_PATH_MAX", "BYTE_VOCAB", "TOKEN_EOT", "SHARD_VERSION_U16",
                 "SHARD_VERSION_U32"):
        py[name] = getattr(_structs, name)
    for name in ("OK", "EINVAL", "ENOMEM", "EIO", "ECORRUPT", "EVERSION", "EUNSUPPORTED",
                 "ECUDA", "ESTATE", "ENOTFOUND", "EBUSY"):
        py[f"status.{name}"] = getattr(errors, name)
    assert {k: int(v) for k, v in c.items()} == py


def _import_with(library):
    env = dict(os.environ, LLMT_LIBRARY=str(library))
    return subprocess.run([sys.executable, "-c", "import llmt"], env=env, capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(llmt.__file__)))


def test_a_library_of_another_version_is_refused(tmp_path):
    cc = shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    src, lib = tmp_path / "fake.c", tmp_path / "libllmt.so.0"
    src.write_text('unsigned llmt_version_number(void) { return 200; }\n'
                   'const char *llmt_version_string(void) { return "0.2.0"; }\n')
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    result = _import_with(lib)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "is libllmt 0.2.0 (version number 200); this binding was written for 0.1.0" \
        in result.stderr


def test_a_missing_library_is_an_import_error(tmp_path):
    result = _import_with(tmp_path / "nothing.so")
    assert result.returncode != 0
    assert f"cannot load LLMT_LIBRARY={tmp_path / 'nothing.so'}" in result.stderr
