"""lowrank: PowerSGD compressed allreduce with error feedback, from Python.

A thin ctypes binding of lowrank's C API (include/lowrank/lowrank.h): communicators, the
allreduce of torch tensors and NumPy arrays, per-buffer layout, view, stats and config.
PyTorch's DDP communication hook is in lowrank.torch (imported on its own: it needs torch).

Method: Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019 (arXiv 1905.13727).
"""
from ._capi import BufferView, Config, Stats, load as load_library
from ._build_info import build_info
from .comm import Communicator, get_unique_id, make_config, nccl_unique_id, tensor_array
from .errors import InvalidArgumentError, LibraryNotFoundError, LowrankError

try:
    from ._version import __version__  # written by the build from meson.build's version
except ImportError:  # the package used in-tree (PYTHONPATH=python): the checkout's meson.build
    def _checkout_version():
        import os
        import re
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            with open(os.path.join(root, "meson.build")) as f:
                return re.search(r"project\('lowrank'.*?version: '([^']+)'", f.read(), re.S).group(1)
        except (OSError, AttributeError):  # a copy of the package outside any checkout or install
            return "0+unknown"
    __version__ = _checkout_version()


def library_path():
    """Path of the liblowrank that was loaded (loads it if needed; LibraryNotFoundError if none)."""
    return load_library().lowrank_path


def library_version():
    """lowrankGetVersion of the loaded library, e.g. 100 for 0.1.0."""
    import ctypes
    v = ctypes.c_int()
    load_library().lowrankGetVersion(ctypes.byref(v))
    return v.value


__all__ = ["Communicator", "get_unique_id", "nccl_unique_id", "make_config", "tensor_array",
           "LowrankError",
           "InvalidArgumentError", "LibraryNotFoundError", "library_path", "library_version",
           "build_info",
           "BufferView", "Config", "Stats"]
