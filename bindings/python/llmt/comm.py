"""The ranks of a data-parallel run (llmt_comm): the library's collectives
carried out by a Python engine, such as mpi4py's communicator.

    from mpi4py import MPI
    import llmt
    with llmt.Comm.from_mpi4py(MPI.COMM_WORLD) as comm:
        tr = llmt.Trainer.from_config(ctx, "run.yaml", comm=comm)
        tr.run()
"""
import ctypes
import hashlib

import numpy as np

from . import _structs as S
from ._handle import Handle
from ._lib import lib, note_callback_error
from .errors import InvalidArgument

# The status a callback returns to the library when the engine raised (the
# exception itself is chained to the CommError the failed call raises).
_FAILED = -1
_OPS = ("sum", "max")  # llmt_comm_op, by name
_METHODS = ("alltoallv", "allgatherv", "broadcast", "allreduce_i64", "barrier")
_INT32_MAX = 2**31 - 1


def _bytes_at(address, nbytes, writable=True):
    """A uint8 array over ``nbytes`` bytes of C memory at ``address`` (no copy)."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    view.flags.writeable = writable
    return view


def _extent(counts, offsets):
    """Bytes from a buffer's start to the end of its last non-empty piece."""
    return max((o + c for c, o in zip(counts, offsets) if c), default=0)


def _sizes(array, n):
    return [array[i] for i in range(n)]


class _Callbacks:
    """The C callbacks of one communicator over its engine. They turn the
    library's pointers into numpy views, call the engine (looked up at each
    call) and never raise into C: an exception is noted for the failing
    call and the callback returns _FAILED. Holds no reference to the Comm."""

    def __init__(self, engine, rank, size):
        self.engine, self.rank, self.size = engine, rank, size

    def alltoallv(self, user, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets):
        try:
            sc, sd = _sizes(send_bytes, self.size), _sizes(send_offsets, self.size)
            rc, rd = _sizes(recv_bytes, self.size), _sizes(recv_offsets, self.size)
            self.engine.alltoallv(_bytes_at(send, _extent(sc, sd), writable=False), sc, sd,
                                  _bytes_at(recv, _extent(rc, rd)), rc, rd)
            return 0
        except BaseException as e:  # noqa: B036 - re-raised after the C call
            note_callback_error(e)
            return _FAILED

    def allgatherv(self, user, send, recv, nbytes, offsets):
        try:
            counts, displs = _sizes(nbytes, self.size), _sizes(offsets, self.size)
            in_place = recv is not None and send == recv + displs[self.rank]
            mine = None if in_place else _bytes_at(send, counts[self.rank], writable=False)
            self.engine.allgatherv(mine, _bytes_at(recv, _extent(counts, displs)), counts, displs)
            return 0
        except BaseException as e:  # noqa: B036
            note_callback_error(e)
            return _FAILED

    def broadcast(self, user, buf, nbytes, root):
        try:
            self.engine.broadcast(_bytes_at(buf, nbytes), root)
            return 0
        except BaseException as e:  # noqa: B036
            note_callback_error(e)
            return _FAILED

    def allreduce_i64(self, user, values, count, op):
        try:
            if op not in (0, 1):
                raise ValueError(f"allreduce_i64: unknown reduction {op}")
            array = (np.ctypeslib.as_array(values, shape=(count,)) if count
                     else np.empty(0, dtype=np.int64))
            self.engine.allreduce_i64(array, _OPS[op])
            return 0
        except BaseException as e:  # noqa: B036
            note_callback_error(e)
            return _FAILED

    def barrier(self, user):
        try:
            self.engine.barrier()
            return 0
        except BaseException as e:  # noqa: B036
            note_callback_error(e)
            return _FAILED


def comm_handle(comm, what):
    """The C handle of ``comm`` (a Comm) for the argument named ``what``."""
    if not isinstance(comm, Comm):
        raise TypeError(f"{what}: expected an llmt.Comm, not {type(comm).__name__}")
    return comm._ptr


def _engine_int(engine, name):
    value = getattr(engine, name, None)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Comm: engine.{name} must be an int, not {value!r}")
    if not 0 <= value <= _INT32_MAX:
        raise InvalidArgument(f"Comm: engine.{name} = {value} is out of range [0, 2^31)")
    return int(value)


class Comm(Handle):
    """A communicator over ``engine``, an object with ``rank`` and ``size``
    (ints) and five collective methods. Every rank calls each of them in the
    same order with agreeing sizes. Buffers are uint8 numpy arrays over the
    library's memory (valid during the call only); counts and offsets are
    lists of byte counts per rank:

    - ``alltoallv(send, send_counts, send_offsets, recv, recv_counts,
      recv_offsets)``: to each rank i, send_counts[i] bytes of send from
      send_offsets[i]; from each rank i, recv_counts[i] bytes into recv at
      recv_offsets[i];
    - ``allgatherv(send, recv, counts, offsets)``: each rank i's counts[i]
      bytes land in recv at offsets[i] on every rank; send is None when this
      rank's piece already lies in recv (in place);
    - ``broadcast(buf, root)``: root's buf replaces every other rank's;
    - ``allreduce_i64(values, op)``: int64 values reduced in place, op
      "sum" or "max";
    - ``barrier()``.

    An exception an engine method raises fails the library call that ran
    it with CommError, chained to the exception (``__cause__``), whose text
    it also carries; the ranks that did not fail are then left in the
    collective unless they fail there too (use agree() before a step that
    one rank alone may fail). ``Comm.from_mpi4py`` gives the usual engine.

    Creating a communicator is collective (the ranks check that they agree
    on the size and hold distinct ranks). The engine must stay usable until
    the communicator is closed; objects made over it (a sharded Optimizer,
    a Trainer from a configuration) are closed before it. Closing is not
    collective.
    """

    def __init__(self, engine):
        self._create(engine, None)

    def _create(self, engine, release_engine):
        rank, size = _engine_int(engine, "rank"), _engine_int(engine, "size")
        for name in _METHODS:
            if not callable(getattr(engine, name, None)):
                raise TypeError(f"Comm: the engine has no method {name}()")
        callbacks = _Callbacks(engine, rank, size)
        ops = S.new(S.llmt_comm_ops)
        ops.rank, ops.size, ops.user = rank, size, None
        ops.alltoallv = S.llmt_comm_alltoallv_fn(callbacks.alltoallv)
        ops.allgatherv = S.llmt_comm_allgatherv_fn(callbacks.allgatherv)
        ops.broadcast = S.llmt_comm_broadcast_fn(callbacks.broadcast)
        ops.allreduce_i64 = S.llmt_comm_allreduce_i64_fn(callbacks.allreduce_i64)
        ops.barrier = S.llmt_comm_barrier_fn(callbacks.barrier)
        out = ctypes.POINTER(S.llmt_comm)()
        lib.llmt_comm_create(ctypes.byref(out), ctypes.byref(ops))
        if release_engine is None:
            free = lib.llmt_comm_free
        else:
            def free(ptr):
                lib.llmt_comm_free(ptr)
                release_engine()
        self._attach(out, free, ())
        # The library calls these until the communicator is freed: a thunk
        # collected before then would crash the process. ops holds them all.
        self._native.keep["ops"] = ops
        self.engine = engine

    @classmethod
    def from_mpi4py(cls, comm):
        """A communicator over an mpi4py intracommunicator (MPI.COMM_WORLD or
        one split from it). Works on a duplicate of ``comm`` with
        MPI.ERRORS_RETURN set on it (an MPI error comes back as CommError
        chained to mpi4py's MPI.Exception), freed when the Comm is closed.
        Collective over ``comm``. Needs mpi4py (Debian: python3-mpi4py;
        PyPI: mpi4py), imported only here."""
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise ImportError("llmt.Comm.from_mpi4py needs mpi4py (Debian: apt install "
                              "python3-mpi4py; PyPI: pip install mpi4py)") from e
        engine = _MPIEngine(MPI, comm)
        self = cls.__new__(cls)
        try:
            self._create(engine, engine.free)
        except BaseException:
            engine.free()
            raise
        return self

    @property
    def rank(self):
        """This process's rank, in [0, size)."""
        return lib.llmt_comm_rank(self._ptr)

    @property
    def size(self):
        """The number of ranks."""
        return lib.llmt_comm_size(self._ptr)

    @property
    def bytes_sent(self):
        """Bytes this process has sent through the library's collectives
        (payload; what a rank sends to itself excluded)."""
        return lib.llmt_comm_bytes_sent(self._ptr)

    def check_same(self, what, value):
        """Collective: raises CommError on every rank unless all ranks pass
        the same value, naming ``what`` and the first rank that differs from
        rank 0. ``value`` is an int in [0, 2^64), or str or bytes (compared
        by an 8-byte BLAKE2b digest)."""
        if not isinstance(what, str):
            raise TypeError(f"check_same: what must be a str, not {what!r}")
        if isinstance(value, str):
            value = value.encode()
        if isinstance(value, bytes):
            value = int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "little")
        elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"check_same: value must be an int, str or bytes, not {value!r}")
        elif not 0 <= value < 2**64:
            raise InvalidArgument(f"check_same: value {value} is out of range [0, 2^64)")
        lib.llmt_comm_check_same(self._ptr, what.encode(), int(value))

    def agree(self, status):
        """Collective: every rank passes its status (0, or the ``status`` of
        an LlmtError it caught); returns when all passed 0. Otherwise raises
        on every rank: CommError naming the lowest failed rank and its
        message, and on a failed rank the error of its own status with the
        library's last message on this thread (pass the status of a failed
        libllmt call, so that message is that call's)."""
        if isinstance(status, bool) or not isinstance(status, (int, np.integer)):
            raise TypeError(f"agree: status must be an int, not {status!r}")
        if not -_INT32_MAX <= status <= 0:
            raise InvalidArgument(f"agree: status {status} is not 0 or an LLMT_E* code")
        lib.llmt_comm_agree(self._ptr, int(status))


class _MPIEngine:
    """Comm's engine over mpi4py: a duplicate of the host's communicator."""

    def __init__(self, MPI, comm):
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"Comm.from_mpi4py: comm must be an mpi4py Intracomm, not {comm!r}")
        if comm == MPI.COMM_NULL:
            raise InvalidArgument("Comm.from_mpi4py: comm is MPI.COMM_NULL")
        self.MPI = MPI
        self.comm = comm.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def free(self):
        """Frees the duplicate (skipped once MPI is finalized)."""
        if self.comm != self.MPI.COMM_NULL and not self.MPI.Is_finalized():
            self.comm.Free()

    def alltoallv(self, send, send_counts, send_offsets, recv, recv_counts, recv_offsets):
        byte = self.MPI.BYTE
        self.comm.Alltoallv([send, (send_counts, send_offsets), byte],
                            [recv, (recv_counts, recv_offsets), byte])

    def allgatherv(self, send, recv, counts, offsets):
        byte = self.MPI.BYTE
        self.comm.Allgatherv(self.MPI.IN_PLACE if send is None else [send, byte],
                             [recv, (counts, offsets), byte])

    def broadcast(self, buf, root):
        self.comm.Bcast([buf, self.MPI.BYTE], root=root)

    def allreduce_i64(self, values, op):
        self.comm.Allreduce(self.MPI.IN_PLACE, [values, self.MPI.INT64_T],
                            op=self.MPI.SUM if op == "sum" else self.MPI.MAX)

    def barrier(self):
        self.comm.Barrier()
