"""What the C API needs of an array: its address, element count, lowrank dtype and device.

Accepts torch tensors (CPU or CUDA) and NumPy arrays; torch is imported only if a tensor is given.
"""
import sys
from dataclasses import dataclass

from ._capi import DTYPES
from .errors import InvalidArgumentError

_TORCH_DTYPES = {"torch.float32": "float32", "torch.float16": "float16",
                 "torch.bfloat16": "bfloat16", "torch.float64": "float64", "torch.int8": "int8",
                 "torch.uint8": "uint8", "torch.int32": "int32", "torch.int64": "int64"}


@dataclass
class Buffer:
    ptr: int        # address of the first element
    count: int      # elements
    dtype: str      # a key of DTYPES
    device: str     # "cpu" or "cuda"
    index: int      # CUDA device index (-1 for host memory)


def describe(x, what="tensor", function="allreduce", writable=False):
    """Buffer of a contiguous torch tensor or NumPy array; InvalidArgumentError otherwise
    (non-contiguous, sparse, empty, an unsupported dtype or device; a read-only array where
    `writable`)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _describe_tensor(x, what, function)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        if writable and not x.flags.writeable:
            raise InvalidArgumentError(4, f"{what} is a read-only array: lowrank writes the result "
                                          "into it", function)
        return _describe_ndarray(x, what, function)
    raise InvalidArgumentError(4, f"{what} must be a torch.Tensor or a numpy.ndarray, "
                                  f"not {type(x).__name__}", function)


def _describe_tensor(t, what, function):
    if t.layout != sys.modules["torch"].strided:
        raise InvalidArgumentError(4, f"{what} is {t.layout}: only dense (strided) tensors", function)
    if not t.is_contiguous():
        raise InvalidArgumentError(4, f"{what} is not contiguous (shape {tuple(t.shape)}, stride "
                                      f"{t.stride()}): call .contiguous() first", function)
    dtype = _TORCH_DTYPES.get(str(t.dtype))
    if dtype is None:
        raise InvalidArgumentError(4, f"{what} has dtype {t.dtype}: lowrank takes "
                                      f"{', '.join(_TORCH_DTYPES.values())}", function)
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(4, f"{what} is on {t.device}: only cpu and cuda", function)
    if t.numel() == 0:
        raise InvalidArgumentError(4, f"{what} is empty", function)
    index = t.device.index if t.device.type == "cuda" else -1
    return Buffer(t.data_ptr(), t.numel(), dtype, t.device.type, index)


def _describe_ndarray(a, what, function):
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(4, f"{what} is not C-contiguous: use numpy.ascontiguousarray",
                                   function)
    if a.dtype.name not in DTYPES or a.dtype.byteorder == ">":
        raise InvalidArgumentError(4, f"{what} has dtype {a.dtype}: lowrank takes "
                                      "native-endian float16/32/64, int8/32/64, uint8/32/64", function)
    if a.size == 0:
        raise InvalidArgumentError(4, f"{what} is empty", function)
    return Buffer(a.ctypes.data, a.size, a.dtype.name, "cpu", -1)
