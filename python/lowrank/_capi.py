"""ctypes declarations of lowrank's C API (include/lowrank/lowrank.h), and the loading of liblowrank.

Why ctypes and not an extension module: one pure-Python package serves every Python and every torch
(Debian's 1.13, PyPI's 2.x) with no compiler and no build per interpreter, and it sees exactly the
ABI-stable C API that C users see. ctypes.CDLL releases the GIL for the duration of every foreign
call, so a blocking allreduce never stalls the interpreter's other threads.

The library is looked up, first found wins:
  1. LOWRANK_LIBRARY: a path to liblowrank.so or to the folder holding it (when set, nothing else
     is tried: an explicit choice is never silently replaced);
  2. the package's own copy (lowrank/lib/liblowrank.so, from a wheel or `pip install .`), the
     library folder recorded at `meson install` (lowrank/_install.py), and, for a package used from
     a source checkout, build*/ of that checkout (lowrank/_paths.py);
  3. the system's paths (the dynamic loader's: ld.so.cache, LD_LIBRARY_PATH).
"""
import ctypes
import os
import threading

from . import _paths
from .errors import LibraryNotFoundError

# ---- Enums (values of lowrank.h, equal to NCCL's) ----------------------------------------------

RESULT_NAMES = {0: "lowrankSuccess", 1: "lowrankUnhandledCudaError", 2: "lowrankSystemError",
                3: "lowrankInternalError", 4: "lowrankInvalidArgument", 5: "lowrankInvalidUsage",
                6: "lowrankRemoteError", 7: "lowrankInProgress", 8: "lowrankTimeout"}
SUCCESS, INVALID_ARGUMENT, INVALID_USAGE = 0, 4, 5

# dtype name -> lowrankDataType_t
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
COMPRESSED_DTYPES = ("float32", "float16", "bfloat16")
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}

UNIQUE_ID_BYTES = 128
CONFIG_MAGIC = 0x4C52434B
UNDEF_INT, UNDEF_DOUBLE, UNDEF_SEED = -2147483648, -1.0, -1


class UniqueId(ctypes.Structure):
    """lowrankUniqueId: 128 opaque bytes (the root's bootstrap address and a secret)."""
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """lowrankConfig_t. Fields left at their UNDEF value come from LOWRANK_* or the default.
    `alternate`, appended last, took the padding after `pipeline`: the struct's size (what the
    library checks) did not change, so a library older than it ignores the field (Communicator
    refuses alternate=1 with such a library: it has no lowrankBufferSetAlternate).
    `factorDtype`, appended after it, made the struct 8 bytes larger (CONFIG_SIZE_NO_FACTOR_DTYPE
    before), and the library accepts only its own size: a library older than it refuses this
    struct as "not initialized with LOWRANK_CONFIG_INITIALIZER", so Communicator gives such a
    library the older size (the fields up to `alternate`) when factor_dtype is fp32 or unset,
    and refuses bf16 and fp16 naming the missing feature (comm.py, _with_config)."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("approxRank", ctypes.c_int), ("minCompressionRate", ctypes.c_double),
                ("startIter", ctypes.c_int), ("errorFeedback", ctypes.c_int),
                ("warmStart", ctypes.c_int), ("orthoEpsilon", ctypes.c_double),
                ("seed", ctypes.c_longlong), ("timeoutSec", ctypes.c_double),
                ("pipeline", ctypes.c_int), ("alternate", ctypes.c_int),
                ("factorDtype", ctypes.c_int)]

    @classmethod
    def initializer(cls):
        """LOWRANK_CONFIG_INITIALIZER: every field unset."""
        return cls(ctypes.sizeof(cls), CONFIG_MAGIC, 100, UNDEF_INT, UNDEF_DOUBLE, UNDEF_INT,
                   UNDEF_INT, UNDEF_INT, UNDEF_DOUBLE, UNDEF_SEED, UNDEF_DOUBLE, UNDEF_INT,
                   UNDEF_INT, UNDEF_INT)


# sizeof(lowrankConfig_t) of a library older than factorDtype: the fields up to `alternate`,
# rounded up to the struct's alignment (that of size_t and double).
CONFIG_SIZE_NO_FACTOR_DTYPE = -(-Config.factorDtype.offset // ctypes.alignment(Config)) * \
    ctypes.alignment(Config)
# lowrankConfig_t.factorDtype: the names the package takes and gives back -> lowrankDataType_t
FACTOR_DTYPES = {"fp32": DTYPES["float32"], "bf16": DTYPES["bfloat16"], "fp16": DTYPES["float16"]}


MAX_DIMS = 8        # LOWRANK_MAX_DIMS
RANK_DEFAULT, RANK_EXACT, MAX_TENSOR_RANK = -1, 0, 65536  # lowrankTensor_t.approxRank
ALTERNATE_DEFAULT = -1  # LOWRANK_ALTERNATE_DEFAULT (lowrankBufferSetAlternate)


class Tensor(ctypes.Structure):
    """lowrankTensor_t: one tensor of a buffer declared with lowrankBufferSetTensors."""
    _fields_ = [("id", ctypes.c_uint64), ("ndims", ctypes.c_int),
                ("shape", ctypes.c_size_t * MAX_DIMS), ("approxRank", ctypes.c_int)]


class BufferView(ctypes.Structure):
    """lowrankBufferView_t."""
    _fields_ = [("planned", ctypes.c_int), ("perTensor", ctypes.c_int), ("ntensors", ctypes.c_int),
                ("ncompressed", ctypes.c_int), ("rows", ctypes.c_size_t), ("cols", ctypes.c_size_t),
                ("padded", ctypes.c_size_t), ("approxRank", ctypes.c_int),
                ("calls", ctypes.c_size_t), ("pElements", ctypes.c_size_t),
                ("qElements", ctypes.c_size_t), ("exactElements", ctypes.c_size_t),
                ("chunks", ctypes.c_size_t)]


class Stats(ctypes.Structure):
    """lowrankStats_t. Its fields only grow at the end: append here whatever lowrank.h appends
    (the library fills its whole struct). A library older than rankChanges leaves it 0."""
    _fields_ = [("calls", ctypes.c_uint64), ("compressedCalls", ctypes.c_uint64),
                ("fallbackCalls", ctypes.c_uint64), ("compressedElements", ctypes.c_uint64),
                ("exactElements", ctypes.c_uint64), ("payloadElements", ctypes.c_uint64),
                ("elementsSent", ctypes.c_uint64), ("bytesSent", ctypes.c_uint64),
                ("ratio", ctypes.c_double), ("stateBytes", ctypes.c_uint64),
                ("buffers", ctypes.c_uint64), ("exactOnlyPlans", ctypes.c_uint64),
                ("rankChanges", ctypes.c_uint64)]


class MemoryInfo(ctypes.Structure):
    """lowrankMemoryInfo_t: size-versioned (the library fills what `size` says), bytes."""
    _fields_ = [("size", ctypes.c_size_t), ("planned", ctypes.c_int), ("device", ctypes.c_int),
                ("supplied", ctypes.c_int), ("residualBytes", ctypes.c_uint64),
                ("factorBytes", ctypes.c_uint64), ("payloadBytes", ctypes.c_uint64),
                ("workspaceBytes", ctypes.c_uint64), ("tableBytes", ctypes.c_uint64),
                ("pinnedBytes", ctypes.c_uint64), ("totalBytes", ctypes.c_uint64)]

    @classmethod
    def initializer(cls):
        """LOWRANK_MEMORY_INFO_INITIALIZER."""
        return cls(size=ctypes.sizeof(cls))


# lowrankAllocFn_t, lowrankFreeFn_t (lowrankCommSetAllocator)
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                            ctypes.c_void_p, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class NcclUniqueId(ctypes.Structure):
    """ncclUniqueId: 128 opaque bytes."""
    _fields_ = [("internal", ctypes.c_char * 128)]


def struct_to_dict(s):
    """A ctypes structure as a plain dict of its fields."""
    return {name: getattr(s, name) for name, _ in s._fields_}


# ---- Loading -------------------------------------------------------------------------------------

_P, _I, _Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_R = ctypes.c_int  # lowrankResult_t
_PROTOTYPES = {
    "lowrankGetVersion": (_R, [ctypes.POINTER(_I)]),
    "lowrankGetErrorString": (ctypes.c_char_p, [_R]),
    "lowrankGetLastError": (ctypes.c_char_p, [_P]),
    "lowrankGetUniqueId": (_R, [ctypes.POINTER(UniqueId)]),
    "lowrankCommInitRankConfig": (_R, [ctypes.POINTER(_P), _I, UniqueId, _I, ctypes.POINTER(Config)]),
    "lowrankCommInitFromEnvConfig": (_R, [ctypes.POINTER(_P), ctypes.POINTER(Config)]),
    "lowrankCommDestroy": (_R, [_P]),
    "lowrankCommAbort": (_R, [_P]),
    "lowrankCommGetConfig": (_R, [_P, ctypes.POINTER(Config)]),
    "lowrankCommCount": (_R, [_P, ctypes.POINTER(_I)]),
    "lowrankCommUserRank": (_R, [_P, ctypes.POINTER(_I)]),
    "lowrankAllReduce": (_R, [_P, _P, _Z, _I, _I, _P, _P]),
    "lowrankBufferSetLayout": (_R, [_P, _P, _I, ctypes.POINTER(_I), ctypes.POINTER(ctypes.POINTER(_Z))]),
    "lowrankBufferGetView": (_R, [_P, _P, ctypes.POINTER(BufferView)]),
    "lowrankBufferReset": (_R, [_P, _P]),
    "lowrankBufferRelease": (_R, [_P, _P]),
    "lowrankBufferSaveState": (_R, [_P, _P, _P, ctypes.POINTER(_Z)]),
    "lowrankBufferRestoreState": (_R, [_P, _P, _P, _Z]),
    "lowrankGetStats": (_R, [_P, ctypes.POINTER(Stats)]),
}
# Present only where the library was built with NCCL's header (lowrank_nccl.h), or only in newer
# libraries (lowrankGetNcclLibrary: 0.1.0 from this package's release on; lowrankBufferSetTensors:
# tensor ids, after 0.1.0; lowrankBufferGetTensorRanks: per-tensor ranks, after that;
# lowrankGetBuildInfo: the revision built from, after that; lowrankBufferGetMemory,
# lowrankCommSetAllocator and lowrankCommGetTransportInfo: the memory report, the application's
# device memory and the links measured, after that; lowrankStateAddCalls: the conversion of the
# hook's version-1 checkpoints, after that; lowrankBufferSetAlternate: alternating PowerSGD,
# after that).
_OPTIONAL = {
    "lowrankCommGetTransportInfo": (_R, [_P, ctypes.c_char_p, ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_size_t)]),
    "lowrankGetBuildInfo": (_R, [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_I),
                                 ctypes.POINTER(ctypes.c_char_p)]),
    "lowrankBufferSetTensors": (_R, [_P, _P, _I, ctypes.POINTER(Tensor)]),
    "lowrankBufferGetTensorRanks": (_R, [_P, _P, ctypes.POINTER(_I), ctypes.POINTER(_I)]),
    "lowrankBufferGetMemory": (_R, [_P, _P, ctypes.POINTER(MemoryInfo)]),
    "lowrankStateAddCalls": (_R, [_P, _Z, ctypes.c_uint64]),
    "lowrankBufferSetAlternate": (_R, [_P, _P, _I]),
    "lowrankCommSetAllocator": (_R, [_P, ALLOC_FN, FREE_FN, _P]),
    "lowrankGetNcclLibrary": (_R, [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                                   ctypes.POINTER(_I)]),
    "lowrankNcclGetUniqueId": (_R, [ctypes.POINTER(NcclUniqueId)]),
    "lowrankCommInitNcclRank": (_R, [ctypes.POINTER(_P), _I, NcclUniqueId, _I, ctypes.POINTER(Config)]),
}

_lock = threading.Lock()
_lib = None
# True once load() has set LOWRANK_NCCL_WHEEL_PATH, LOWRANK_CUDA_BACKEND (the user had not)
nccl_wheel_path_set = cuda_backend_set = False


def _missing_dependency(error):
    """A clear message when liblowrank is there but a library it needs is not (UCX), else None."""
    text = str(error)
    for lib in ("libucp", "libuct", "libucs"):
        if lib in text:
            return (f"liblowrank needs UCX, which was not found or did not load ({text}): install "
                    f"Debian's {_paths.UCX_PACKAGE} (apt-get install {_paths.UCX_PACKAGE}) or your "
                    f"system's UCX 1.x, or put its folder on LD_LIBRARY_PATH")
    return None


def load():
    """The loaded liblowrank (a ctypes.CDLL with prototypes set), loaded once per process.

    Raises LibraryNotFoundError naming every path tried and why each failed."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, from_env = _paths.candidates_to_load()
        tried = []
        for path in paths:
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{path} (no such file)")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                missing = _missing_dependency(e) if os.sep in path else None
                if missing:  # the library is ours; what it needs is not there: no use going on
                    raise LibraryNotFoundError(missing) from None
                tried.append(f"{path} ({e})")
                continue
            if not hasattr(lib, "lowrankAllReduce"):
                tried.append(f"{path} (not liblowrank: no lowrankAllReduce)")
                continue
            for name, (res, args) in _PROTOTYPES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            for name, (res, args) in _OPTIONAL.items():
                if hasattr(lib, name):
                    fn = getattr(lib, name)
                    fn.restype, fn.argtypes = res, args
            lib.lowrank_path = path
            # Where the C side looks for a PyPI NCCL wheel (platform/nccl.h, step 4): sys.path.
            global nccl_wheel_path_set, cuda_backend_set
            if "LOWRANK_NCCL_WHEEL_PATH" not in os.environ:
                os.environ["LOWRANK_NCCL_WHEEL_PATH"] = _paths.nccl_wheel_path()
                nccl_wheel_path_set = True
            # The CUDA backend of an in-tree or editable build is not beside its liblowrank, where
            # the library looks by itself (engine/device_backend.cc): name it for the library.
            if "LOWRANK_CUDA_BACKEND" not in os.environ and \
                    not _paths.beside(path, "liblowrank_cuda.so"):
                backend = _paths.build_backend(path)
                if backend:
                    os.environ["LOWRANK_CUDA_BACKEND"] = backend
                    cuda_backend_set = True
            _lib = lib
            return lib
        source_copy = None if from_env else _paths.unbuilt_source_copy()
        if source_copy:
            raise LibraryNotFoundError(f"liblowrank not found: {source_copy}; tried: " + "; ".join(tried))
        how = "LOWRANK_LIBRARY is set" if from_env else \
            "set LOWRANK_LIBRARY to liblowrank.so, or build it (scripts/build.sh) or install it (meson install)"
        raise LibraryNotFoundError("liblowrank not found (" + how + "); tried: " + "; ".join(tried))
