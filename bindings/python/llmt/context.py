"""The context: backend, threads, accounted memory and the root random stream."""
import ctypes
from collections import namedtuple

import numpy as np

from . import _structs as S
from ._convert import BACKENDS, enum, fill_struct, init_struct, ptr
from ._handle import Handle
from ._lib import lib

#: The memory categories, in llmt_mem_category order ("params", "grads", ...).
CATEGORIES = tuple(lib.llmt_mem_category_name(i).decode() for i in range(S.MEM_CATEGORY_COUNT))

RngState = namedtuple("RngState", "seed stream offset")
RngState.__doc__ = "Position of a Philox random stream (llmt_rng_state)."


def category_dict(values, count=S.MEM_CATEGORY_COUNT):
    """{category name: value} from a C array indexed by llmt_mem_category."""
    return {lib.llmt_mem_category_name(i).decode(): int(values[i]) for i in range(count)}


class Context(Handle):
    """An llmt_context: the backend and device, the thread count, the memory
    accounting with its optional budget, and the root random stream.

    Keyword arguments are the fields of llmt_context_config over its defaults:
    ``backend`` ("cpu", "cuda" or 0/1), ``device``, ``num_threads`` (0: all
    cores), ``memory_budget`` (bytes, 0: none), ``seed``, ``host_memory_budget``
    (bytes of "host_state", 0: none).
    Everything made from a context is closed before it.
    """

    def __init__(self, **config):
        cfg = init_struct(S.llmt_context_config, lib.llmt_context_config_init)
        fill_struct(cfg, config, "Context",
                    {"backend": lambda v: enum(v, BACKENDS, "backend")})
        out = ctypes.POINTER(S.llmt_context)()
        lib.llmt_context_create(ctypes.byref(out), ctypes.byref(cfg))
        self._attach(out, lib.llmt_context_free, ())

    @property
    def backend(self):
        """"cpu" or "cuda"."""
        return BACKENDS[lib.llmt_context_backend(self._ptr)]

    @property
    def num_threads(self):
        """CPU threads the context's ops use."""
        return lib.llmt_context_num_threads(self._ptr)

    def memory_stats(self):
        """The accounting as a dict: each category name ("params", "grads",
        "optimizer", "activations", "workspace", "staging", "host_state") maps
        to {"current": bytes, "peak": bytes}; "total" likewise, over every
        category but "host_state" (its peak is the peak of the sum); and
        "budget", "host_budget", "device_total", "device_free" in bytes (0 when
        none or unknown)."""
        st = S.new(S.llmt_memory_stats)
        lib.llmt_context_memory_stats(self._ptr, ctypes.byref(st))
        out = {lib.llmt_mem_category_name(i).decode(): {"current": st.current[i],
                                                         "peak": st.peak[i]}
               for i in range(st.category_count)}
        out["total"] = {"current": st.total_current, "peak": st.total_peak}
        out.update(budget=st.budget, host_budget=st.host_budget, device_total=st.device_total,
                   device_free=st.device_free)
        return out

    def reset_peak(self):
        """Sets every peak to the current value."""
        lib.llmt_context_reset_peak(self._ptr)

    def set_budget(self, budget):
        """Sets the budget in bytes (0: none); below what is in use is refused."""
        lib.llmt_context_set_budget(self._ptr, budget)

    def set_host_budget(self, budget):
        """Sets the budget of "host_state" in bytes (0: none); below what it
        holds is refused."""
        lib.llmt_context_set_host_budget(self._ptr, budget)

    @property
    def rng_state(self):
        """The root random stream's position as RngState(seed, stream, offset);
        assign one to restore it."""
        st = S.llmt_rng_state()
        lib.llmt_context_rng_get(self._ptr, ctypes.byref(st))
        return RngState(st.seed, st.stream, st.offset)

    @rng_state.setter
    def rng_state(self, state):
        st = S.llmt_rng_state(*state)
        lib.llmt_context_rng_set(self._ptr, ctypes.byref(st))

    def uniform(self, n):
        """n uniform float32 draws in [0, 1) from the root stream."""
        out = np.empty(n, dtype=np.float32)
        lib.llmt_context_rng_uniform(self._ptr, ptr(out, ctypes.c_float), n)
        return out
