"""The training configuration (llmt_train_config) and its YAML form; every
key is in docs/config.md."""
import ctypes
import json
import os

import numpy as np

from . import _structs as S
from ._convert import path_bytes
from ._lib import lib


def _scalar(value, key):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (str, os.PathLike)):
        return json.dumps(os.fspath(value), ensure_ascii=False)  # a YAML double-quoted string
    raise TypeError(f"{key}: cannot write {type(value).__name__} {value!r} as a configuration "
                    "value")


def _nested(mapping):
    """Nests dotted keys ({"optimizer.lr": 1e-3} -> {"optimizer": {"lr": 1e-3}})."""
    out = {}
    for key, value in mapping.items():
        *sections, name = str(key).split(".")
        node = out
        for s in sections:
            node = node.setdefault(s, {})
        if isinstance(value, dict):
            node.setdefault(name, {}).update(_nested(value))
        else:
            node[name] = value
    return out


def dict_to_yaml(mapping):
    """YAML text for a dict of configuration keys: sections as nested dicts
    or dotted keys; values bool, int, float, str or path."""
    lines = []

    def emit(node, indent, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                lines.append(f"{indent}{key}:")
                emit(value, indent + "  ", f"{prefix}{key}.")
            else:
                lines.append(f"{indent}{key}: {_scalar(value, prefix + key)}")

    emit(_nested(mapping), "", "")
    return "\n".join(lines) + "\n"


def _is_yaml_text(source):
    return (not os.path.isfile(source) and
            (source == "" or ":" in source or "\n" in source))


class TrainConfig:
    """A training configuration: the defaults of llmt_train_config_init with
    YAML keys applied over them (docs/config.md).

    ``source`` (optional, and for update()) is a path (os.PathLike, or a str
    naming an existing file or without ':' and newlines), YAML text (a str
    with ':' or newlines), or a dict of keys (nested sections or dotted keys:
    {"optimizer": {"lr": 1e-3}} or {"optimizer.lr": 1e-3}). Errors name the
    source, line, column and key. ``struct`` is the llmt_train_config itself.
    """

    def __init__(self, source=None):
        self.struct = S.llmt_train_config()
        lib.llmt_train_config_init(ctypes.byref(self.struct))
        if source is not None:
            self.update(source)

    def update(self, source):
        """Applies the keys of ``source`` over the current values; returns self."""
        if isinstance(source, dict):
            self._parse(dict_to_yaml(source), "<dict>")
        elif isinstance(source, str) and _is_yaml_text(source):
            self._parse(source, "<string>")
        elif isinstance(source, (str, bytes, os.PathLike)):
            lib.llmt_train_config_load_yaml(ctypes.byref(self.struct), path_bytes(source))
        else:
            raise TypeError(f"a configuration is a path, YAML text or a dict, not "
                            f"{type(source).__name__}")
        return self

    def set(self, key, value):
        """Sets one key (dotted: "optimizer.lr") to ``value``, checked as the
        YAML loader checks it (llmt_train_config_set); returns self. value is a
        bool, int, float, str or path; a str is taken as written (no YAML
        quoting). Raises InvalidArgument naming the key and value, leaving the
        configuration unchanged."""
        if isinstance(value, (str, os.PathLike)):
            text = path_bytes(value)
        else:
            text = _scalar(value, key).encode()
        lib.llmt_train_config_set(ctypes.byref(self.struct), str(key).encode(), text)
        return self

    def _parse(self, text, source):
        data = text.encode()
        lib.llmt_train_config_parse_yaml(ctypes.byref(self.struct), data, len(data),
                                         source.encode())

    def check(self):
        """Checks the relations between keys (micro_batch <= batch_size, ...)."""
        lib.llmt_train_config_check(ctypes.byref(self.struct))

    def to_yaml(self):
        """The configuration as YAML text with every key."""
        needed = ctypes.c_size_t()
        lib.llmt_train_config_to_yaml(ctypes.byref(self.struct), None, 0, ctypes.byref(needed))
        out = ctypes.create_string_buffer(needed.value)
        lib.llmt_train_config_to_yaml(ctypes.byref(self.struct), out, len(out), None)
        return out.value.decode()

    def __repr__(self):
        return f"<llmt.TrainConfig steps={self.struct.steps} seed={self.struct.seed}>"
