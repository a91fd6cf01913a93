"""Object lifetimes: C handles must be freed children first (a model before
its context, an optimizer before its model, a trainer before its parts).

Each Python object over a C handle holds a ``_Native`` node: the pointer, its
free function, and the nodes of its parents and live children. The nodes refer
only to each other, never to the Python objects, so they stay intact while
the garbage collector finalizes a cycle of Python objects in any order.
Closing a node closes its children first, so freeing in any order (explicit
``close()``, ``with``, garbage collection, interpreter exit) frees the C
objects in a valid order. ``atexit`` closes every node still open.
"""
import atexit

from .errors import StateError

_roots = {}  # id -> open node without parents


class _Native:
    """A C handle, its free function, and its place in the tree of handles."""
    __slots__ = ("ptr", "free", "kind", "parents", "children", "busy", "keep")

    def __init__(self, ptr, free, kind, parents):
        self.ptr = ptr
        self.free = free          # C free function, or None for a borrowed handle
        self.kind = kind          # the Python class name, for messages
        self.parents = list(parents)
        self.children = {}
        self.busy = 0             # > 0 while a call that may call back into Python runs
        self.keep = {}            # Python objects C holds pointers to (callbacks)
        for p in self.parents:
            p.children[id(self)] = self
        if not self.parents:
            _roots[id(self)] = self

    def _check_idle(self):
        if self.busy:
            raise StateError(f"cannot close the {self.kind} while it runs "
                             "(called from one of its callbacks)")
        for child in self.children.values():
            child._check_idle()

    def close(self):
        if self.ptr is None:
            return
        self._check_idle()
        for child in list(self.children.values()):
            child.close()
        ptr, self.ptr = self.ptr, None
        if self.free is not None:
            self.free(ptr)
        for p in self.parents:
            p.children.pop(id(self), None)
        _roots.pop(id(self), None)
        self.parents = []
        self.keep = {}


@atexit.register
def _close_all():
    for node in list(_roots.values()):
        node.close()


class Handle:
    """Base of the classes over C handles: ``close()`` (idempotent), context
    manager support, and freeing children first."""

    _native = None

    def _attach(self, ptr, free, parents):
        """Takes ownership of ``ptr`` (freed with ``free``; None: borrowed)
        under the handles ``parents``, which this object keeps alive."""
        self._parents = tuple(parents)
        self._native = _Native(ptr, free, type(self).__name__,
                               [p._native for p in self._parents])

    @classmethod
    def _borrow(cls, ptr, owner, **attrs):
        """An object over a handle ``owner`` owns (freed with it, never by
        this object), with the attributes ``attrs`` set."""
        self = cls.__new__(cls)
        self._attach(ptr, None, (owner,))
        for name, value in attrs.items():
            setattr(self, name, value)
        return self

    @property
    def _ptr(self):
        native = self._native
        if native is None or native.ptr is None:
            raise StateError(f"the {type(self).__name__} is closed (closed itself, or with an "
                             "object it depends on)")
        return native.ptr

    @property
    def closed(self):
        """True once the C object has been freed (by close() or with a parent)."""
        return self._native is None or self._native.ptr is None

    def close(self):
        """Frees the C object, after every live object made from it. Idempotent."""
        if self._native is not None:
            self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if self._native is not None and self._native.ptr is not None:
            self._native.close()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<llmt.{type(self).__name__} {state}>"
