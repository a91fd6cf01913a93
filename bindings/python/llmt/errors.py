"""Exceptions: every negative libllmt status code raises a subclass of LlmtError
whose text is the library's message for the failure (``llmt_error_last()``)."""

OK = 0
EINVAL = -1
ENOMEM = -2
EIO = -3
ECORRUPT = -4
EVERSION = -5
EUNSUPPORTED = -6
ECUDA = -7
ESTATE = -8
ENOTFOUND = -9
EBUSY = -10
ECOMM = -11


class LlmtError(Exception):
    """A libllmt call failed.

    ``status`` is the C status code (``LLMT_E*``, negative) and ``str(error)``
    the library's message naming the argument, key or file that was wrong.
    """

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status

    def __str__(self):
        return self.args[0] if self.args else ""


class InvalidArgument(LlmtError, ValueError):
    """LLMT_EINVAL: an argument (or configuration key) is invalid."""
    status = EINVAL


class OutOfMemory(LlmtError):
    """LLMT_ENOMEM: out of memory, or the context's budget refused an allocation."""
    status = ENOMEM


class IOFailure(LlmtError, OSError):
    """LLMT_EIO: a file system or I/O operation failed."""
    status = EIO


class CorruptData(LlmtError):
    """LLMT_ECORRUPT: data on disk failed validation."""
    status = ECORRUPT


class VersionError(LlmtError):
    """LLMT_EVERSION: a struct or file version the library does not know."""
    status = EVERSION


class Unsupported(LlmtError):
    """LLMT_EUNSUPPORTED: not available in this build or backend."""
    status = EUNSUPPORTED


class CudaError(LlmtError):
    """LLMT_ECUDA: the CUDA runtime or a CUDA library reported an error."""
    status = ECUDA


class StateError(LlmtError):
    """LLMT_ESTATE: the object's state does not allow the call (also raised
    by the binding for a closed object)."""
    status = ESTATE


class NotFound(LlmtError, LookupError):
    """LLMT_ENOTFOUND: the requested item does not exist."""
    status = ENOTFOUND


class Busy(LlmtError):
    """LLMT_EBUSY: another process (or handle) holds the item's lock, e.g. a
    checkpoint directory already open in a store; the message names its pid."""
    status = EBUSY


class CommError(LlmtError):
    """LLMT_ECOMM: a collective failed, or the ranks of a data-parallel run
    disagree (the message names the rank)."""
    status = ECOMM


class ConfigWarning(UserWarning):
    """A configuration setting that will not take effect as written."""


_BY_STATUS = {cls.status: cls for cls in (InvalidArgument, OutOfMemory, IOFailure, CorruptData,
                                          VersionError, Unsupported, CudaError, StateError,
                                          NotFound, Busy, CommError)}


def error_for(status, message):
    """The exception for a negative status code (LlmtError for an unknown one)."""
    cls = _BY_STATUS.get(status, LlmtError)
    return cls(message, status)
