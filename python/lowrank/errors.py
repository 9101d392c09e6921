"""Exceptions of the lowrank package.

Every failed C call raises LowrankError (or a subclass) carrying lowrank's result code, its name
and the library's message (lowrankGetLastError). The communicator and the buffers stay as the C
API leaves them after the error (see lowrank.h: argument errors leave the communicator usable).
"""


class LowrankError(RuntimeError):
    """A lowrank C call failed.

    Attributes: code (int, lowrankResult_t), result (its name, e.g. "lowrankInvalidUsage"),
    message (lowrank's text of the failure), function (the C function that failed)."""

    def __init__(self, code, message, function=""):
        from ._capi import RESULT_NAMES
        self.code = int(code)
        self.result = RESULT_NAMES.get(self.code, f"lowrankResult {self.code}")
        self.message = message
        self.function = function
        where = f"{function}: " if function else ""
        super().__init__(f"{where}{self.result} ({self.code}): {message}")

    def __reduce__(self):  # pickles (torch.distributed sends errors between ranks)
        return (type(self), (self.code, self.message, self.function))


class LibraryNotFoundError(LowrankError, OSError):
    """liblowrank could not be loaded; the message names every path tried."""

    def __init__(self, message):
        super().__init__(2, message, "load")  # 2 = lowrankSystemError

    def __reduce__(self):
        return (type(self), (self.message,))


class InvalidArgumentError(LowrankError, ValueError):
    """lowrankInvalidArgument, or an argument the package refuses before calling C (a
    non-contiguous tensor, an unsupported dtype, tensors on different devices)."""


def error_for(code, message, function=""):
    """The exception for a result code: InvalidArgumentError for code 4, else LowrankError."""
    cls = InvalidArgumentError if int(code) == 4 else LowrankError
    return cls(code, message, function)
