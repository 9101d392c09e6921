"""Communicator: lowrank's communicator (lowrankComm_t) from Python.

Thread safety: a Communicator serializes its own calls (a lock), so it may be shared between
threads; abort() may be called from any thread while a call runs and makes that call return.
Every C call runs with the GIL released (ctypes), so other Python threads go on meanwhile.
"""
import ctypes
import json
import numbers
import threading

from . import _capi
from ._buffers import describe
from .errors import InvalidArgumentError, LowrankError, error_for

# Python keyword -> lowrankConfig_t field (lowrank.h documents ranges and defaults).
CONFIG_FIELDS = {"approx_rank": "approxRank", "min_compression_rate": "minCompressionRate",
                 "start_iter": "startIter", "error_feedback": "errorFeedback",
                 "warm_start": "warmStart", "ortho_epsilon": "orthoEpsilon", "seed": "seed",
                 "timeout": "timeoutSec", "pipeline": "pipeline", "alternate": "alternate",
                 "factor_dtype": "factorDtype"}
# factor_dtype's spellings -> its name ("fp32", "bf16", "fp16"; torch's dtypes: factor_dtype_name)
_FACTOR_DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
                       "fp16": "fp16", "float16": "fp16"}
FACTOR_DTYPE_VALUES = ("'fp32', 'bf16', 'fp16' (or 'float32', 'bfloat16', 'float16', "
                       "torch.float32, torch.bfloat16, torch.float16)")


def as_int(v):
    """v as a Python int when it is an integer and not a boolean: int, NumPy's integers (any
    numbers.Integral); TypeError for anything else (2.7, "3", True, numpy.bool_, a tensor), so
    that an id, a size or a rank is never a truncated float or a flag taken for 1."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{v!r} is not an integer")
    return int(v)


def factor_dtype_name(value):
    """The name ("fp32", "bf16" or "fp16") of a factor dtype given as one of FACTOR_DTYPE_VALUES
    (strings in any case, as LOWRANK_FACTOR_DTYPE's);
    None for None. TypeError for what is neither a string nor a torch.dtype (16, True),
    ValueError for another string or dtype ("int8", torch.float64); both name the values taken."""
    if value is None:
        return None
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":  # not importing torch
        key = str(value)[len("torch."):]
    elif isinstance(value, str):
        key = value.lower()  # any case, as LOWRANK_FACTOR_DTYPE
    else:
        raise TypeError(f"factor_dtype must be one of {FACTOR_DTYPE_VALUES}, not {value!r}")
    if key not in _FACTOR_DTYPE_NAMES:
        raise ValueError(f"factor_dtype must be one of {FACTOR_DTYPE_VALUES}, not {value!r}")
    return _FACTOR_DTYPE_NAMES[key]


def make_config(**kwargs):
    """A lowrankConfig_t with the given fields set (keywords of CONFIG_FIELDS; None = unset: the
    LOWRANK_* variable or the default applies). factor_dtype: a name (factor_dtype_name), set
    as its lowrankDataType_t. Unknown keywords raise TypeError; a bad factor_dtype
    InvalidArgumentError."""
    cfg = _capi.Config.initializer()
    for key, value in kwargs.items():
        if key not in CONFIG_FIELDS:
            raise TypeError(f"unknown lowrank config field {key!r} (known: {', '.join(CONFIG_FIELDS)})")
        if value is None:
            continue
        if key == "factor_dtype":
            try:
                cfg.factorDtype = _capi.FACTOR_DTYPES[factor_dtype_name(value)]
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(4, f"config {e}", "make_config") from None
            continue
        if isinstance(value, bool):
            value = int(value)
        field = CONFIG_FIELDS[key]
        kind = dict(cfg._fields_)[field]
        # ctypes wraps out-of-range integers silently, and the C "unset" sentinels (-1 for
        # doubles and the seed, INT_MIN for ints) would quietly mean "the default": refuse both
        # here; the C library checks the documented ranges of the rest.
        if kind is ctypes.c_int and not -2**31 < int(value) < 2**31:
            raise InvalidArgumentError(4, f"config {key}={value} is out of range", "make_config")
        if kind is ctypes.c_longlong and not 0 <= int(value) < 2**63:
            raise InvalidArgumentError(4, f"config {key}={value} must be in [0, 2^63 - 1]", "make_config")
        if kind is ctypes.c_double and float(value) < 0:
            raise InvalidArgumentError(4, f"config {key}={value} must be >= 0", "make_config")
        setattr(cfg, field, value)
    return cfg


def _fail(lib, code, function, handle=None):
    """The exception of a failed call, with lowrank's message (read on the calling thread)."""
    msg = lib.lowrankGetLastError(handle)
    return error_for(code, (msg or b"").decode(errors="replace") or lib.lowrankGetErrorString(code).decode(),
                     function)


def get_unique_id():
    """lowrankGetUniqueId: 128 bytes to hand to every comm rank (made on comm rank 0, which then
    listens for the others). Raises LowrankError."""
    return _make_id(_capi.UniqueId, "lowrankGetUniqueId")


def nccl_unique_id():
    """lowrankNcclGetUniqueId: an NCCL unique id (128 bytes) from the NCCL library lowrank uses."""
    return _make_id(_capi.NcclUniqueId, "lowrankNcclGetUniqueId")


def state_add_calls(data, calls):
    """lowrankStateAddCalls: format-1 bytes (save_state of a buffer without tensor ids, saved
    before them) with `calls` added to their call count, under a new CRC (a copy; every other
    byte as saved). Raises InvalidArgumentError for bytes that are not whole format-1 bytes, or a
    count past 2^62; LowrankError for a library older than the entry."""
    lib = _capi.load()
    if not hasattr(lib, "lowrankStateAddCalls"):
        raise LowrankError(5, f"{lib.lowrank_path} has no lowrankStateAddCalls (older than this "
                              "package)", "lowrankStateAddCalls")
    out = ctypes.create_string_buffer(bytes(data), len(data))
    rc = lib.lowrankStateAddCalls(out, len(data), as_int(calls))
    if rc:
        raise _fail(lib, rc, "lowrankStateAddCalls")
    return out.raw


def _entry(lib, fn, name):
    """lib's C function fn; LowrankError (lowrankInvalidUsage) for the NCCL entry points of a
    library built without NCCL's header."""
    if not hasattr(lib, fn):
        raise LowrankError(5, f"{lib.lowrank_path} was built without NCCL's header: no {fn}", name)
    return getattr(lib, fn)


def _make_id(struct, fn):
    lib = _capi.load()
    uid = struct()
    rc = _entry(lib, fn, fn)(ctypes.byref(uid))
    if rc:
        raise _fail(lib, rc, fn)
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))  # NULs included


def _id_struct(struct, data, maker, name):
    """The id bytes `data` as a ctypes `struct`; InvalidArgumentError unless they are its size."""
    if not isinstance(data, (bytes, bytearray)) or len(data) != ctypes.sizeof(struct):
        raise InvalidArgumentError(4, f"the id must be {ctypes.sizeof(struct)} bytes from {maker}", name)
    return struct.from_buffer_copy(bytes(data))


class Communicator:
    """A group of comm ranks that allreduce together, and the PowerSGD state of every buffer
    allreduced on it (keyed by the output buffer's address, or by tensor ids: set_tensors).

    Make one with init_rank (a unique id), from_env (a launcher's variables), from_nccl_id (a new
    NCCL communicator, for CUDA tensors) or lowrank.torch.communicator_from_process_group. The
    method: PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019), see lowrank.h."""

    def __init__(self, handle, device="cpu"):
        self._lib = _capi.load()
        self._handle = handle
        self._lock = threading.Lock()       # serializes calls (the C API's rule per communicator)
        self._err_lock = threading.Lock()   # abort vs reading a failed call's message
        self._aborting = False
        self._allocator = None    # set_allocator's ctypes functions, kept alive with the comm
        self._alloc_error = None  # what the allocator raised in the call in progress
        self.device = device  # "cpu": host communicator (UCX); "cuda": over NCCL
        self.size = self._int_query("lowrankCommCount")
        self.rank = self._int_query("lowrankCommUserRank")

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def init_rank(cls, nranks, unique_id, rank, **config):
        """lowrankCommInitRankConfig: collective over nranks callers (threads or processes) that
        share unique_id (bytes from get_unique_id). config: keywords of CONFIG_FIELDS."""
        uid = _id_struct(_capi.UniqueId, unique_id, "get_unique_id()", "lowrankCommInitRank")
        return cls._init("lowrankCommInitRankConfig", "lowrankCommInitRank", "cpu",
                         int(nranks), uid, int(rank), config=config)

    @classmethod
    def from_env(cls, **config):
        """lowrankCommInitFromEnvConfig: comm rank and size from the launcher's variables (RANK,
        WORLD_SIZE, MASTER_ADDR, MASTER_PORT + 1, or LOWRANK_*/Open MPI/Slurm: docs/launching.md)."""
        return cls._init("lowrankCommInitFromEnvConfig", "lowrankCommInitFromEnv", "cpu",
                         config=config)

    @classmethod
    def from_nccl_id(cls, nranks, nccl_id, rank, **config):
        """lowrankCommInitNcclRank: a new NCCL communicator on the current CUDA device, owned by
        the returned communicator (for CUDA tensors; host buffers work too, as NCCL allows)."""
        uid = _id_struct(_capi.NcclUniqueId, nccl_id, "nccl_unique_id()", "lowrankCommInitNcclRank")
        return cls._init("lowrankCommInitNcclRank", "lowrankCommInitNcclRank", "cuda",
                         int(nranks), uid, int(rank), config=config)

    @classmethod
    def _init(cls, fn, name, device, *args, config):
        """Calls the C init `fn`(&comm, *args, &config) and wraps the communicator it makes."""
        lib = _capi.load()
        cfg = make_config(**config)
        if cfg.alternate not in (0, _capi.UNDEF_INT) and not hasattr(lib, _ALTERNATE_FN):
            # the field sits in the old struct's padding: such a library would ignore it
            raise LowrankError(5, f"{lib.lowrank_path} is older than this package: no "
                                  "alternating PowerSGD (config alternate)", name)
        h = ctypes.c_void_p()
        call = _entry(lib, fn, name)
        rc = call(ctypes.byref(h), *args, ctypes.byref(cfg))
        if rc and _older_config(lib, rc, cfg, name):  # the older size (refused nothing else)
            rc = call(ctypes.byref(h), *args, ctypes.byref(cfg))
        if rc:
            raise _fail(lib, rc, name)
        return cls(h.value, device=device)

    # ---- the allreduce -----------------------------------------------------------------------
    def allreduce(self, sendbuf, recvbuf=None, op="avg", stream=None):
        """Allreduce sendbuf into recvbuf (in place when recvbuf is None or the same object) and
        return recvbuf. Both: contiguous torch tensors or NumPy arrays of the same dtype and
        number of elements on the same device. float32/float16/bfloat16 with op "avg" or "sum" are
        compressed (PowerSGD with error feedback: the result approximates the exact allreduce and
        is identical on every comm rank); other dtypes and ops ("max", "min", "prod") are exact.
        State is kept per recvbuf address: reuse the same buffer from call to call.
        CUDA tensors: the call is queued on `stream` (a torch.cuda.Stream or a cudaStream_t as an
        int; default the current stream) and returns once queued.
        Raises InvalidArgumentError (bad arrays, dtype, op) or LowrankError (lowrank.h's errors)."""
        if recvbuf is None:
            recvbuf = sendbuf
        s, r = describe(sendbuf, "sendbuf"), describe(recvbuf, "recvbuf", writable=True)
        if (s.dtype, s.count, s.device, s.index) != (r.dtype, r.count, r.device, r.index):
            raise InvalidArgumentError(4, f"sendbuf ({s.count} {s.dtype} on {s.device}) and recvbuf "
                                          f"({r.count} {r.dtype} on {r.device}) differ", "allreduce")
        if op not in _capi.OPS:
            raise InvalidArgumentError(4, f"op {op!r} is not one of {', '.join(_capi.OPS)}", "allreduce")
        handle = None
        if r.device == "cuda":
            handle = _cuda_stream(stream, r.index)
        self._call("lowrankAllReduce", ctypes.c_void_p(s.ptr), ctypes.c_void_p(r.ptr), r.count,
                   _capi.DTYPES[r.dtype], _capi.OPS[op], _COMM, ctypes.c_void_p(handle))
        return recvbuf

    # ---- per-buffer state --------------------------------------------------------------------
    def set_layout(self, buffer, shapes):
        """Declare the tensors packed in `buffer` (a tensor/array, or its address as an int):
        shapes is a sequence of tensor shapes, in order, whose elements add up to the buffer's
        count. Tensors of >= 2 dimensions are viewed as (shape[0], prod(shape[1:])) and compressed
        if they pass the compression-rate test; 1-D ones are exact. Resets the buffer's state."""
        try:
            shapes = [tuple(int(d) for d in s) for s in shapes]
        except (TypeError, ValueError):
            raise InvalidArgumentError(4, f"shapes must be a sequence of shapes (sequences of ints), "
                                          f"not {shapes!r}", "lowrankBufferSetLayout") from None
        if any(d < 0 for s in shapes for d in s):
            raise InvalidArgumentError(4, f"negative size in {shapes}", "lowrankBufferSetLayout")
        n = len(shapes)
        if n == 0:
            raise InvalidArgumentError(4, "set_layout: no shapes", "lowrankBufferSetLayout")
        ndims = (ctypes.c_int * n)(*[len(s) for s in shapes])
        rows = [(ctypes.c_size_t * max(1, len(s)))(*s) for s in shapes]
        ptrs = (ctypes.POINTER(ctypes.c_size_t) * n)(*[ctypes.cast(a, ctypes.POINTER(ctypes.c_size_t)) for a in rows])
        self._call("lowrankBufferSetLayout", self._addr(buffer), n, ndims, ptrs)

    def set_tensors(self, buffer, tensors):
        """lowrankBufferSetTensors: declare the tensors packed in order in `buffer` (a tensor/array,
        or its address as an int), each with an id, so that their PowerSGD state (residual,
        warm-start Q, warm-up count, a pending restore) belongs to the ids, not to the buffer's
        address: the next compressible allreduce on `buffer` takes each id's state from wherever
        it is (another buffer of the same ids in the same order and shapes: moved as is; in
        another grouping: copied once; an id seen nowhere: afresh). Declaring changes no state,
        and declaring the same tensors again is cheap: declare at every call if that is simpler.
        Per-tensor mode as set_layout; each id warms up (exact allreduces) for its own first
        start_iter calls, and its first Q is drawn from (seed, id).

        tensors: an iterable of (id, shape) or (id, shape, approx_rank), in buffer order:
          id: an int in [0, 2^64 - 1], unique among the communicator's tensors and the same on
            every comm rank (a parameter's index, a hash of its name);
          shape: a sequence of 1 to 8 sizes (elements, each > 0; ints or anything with
            __index__, e.g. torch.Size); the elements of all shapes add up to the buffer's count,
            checked at the next call. Tensors of >= 2 dimensions are viewed as
            (shape[0], prod(shape[1:])) and compressed if they pass the compression-rate test;
            1-D ones are exact;
          approx_rank: None or -1 (the communicator's approx_rank), 0 (always exact), or a rank
            of its own in [1, 65536].
        tensors may also be the array tensor_array(tensors) returned (checked once): declaring
        a buffer at every call then skips the checks and conversions (about 2.5 us a tensor).
        Every comm rank must declare the same tensors. Local, not collective.
        Raises InvalidArgumentError (a malformed entry, an id out of range, a shape of 0 or more
        than 8 dimensions or a size < 1, an approx_rank out of range, no tensors, an id given
        twice), LowrankError lowrankInvalidUsage (a library older than tensor ids).
        Thread safety: as every call (serialized by the communicator's lock); declare and
        allreduce a buffer from one thread, or in an order every rank shares."""
        fn = "lowrankBufferSetTensors"
        array = tensors if isinstance(tensors, _TensorArray) else tensor_array(tensors)
        if not hasattr(self._lib, fn):
            raise LowrankError(5, f"{self._lib.lowrank_path} is older than this package: no {fn} "
                                  "(tensor ids); use the library built with it", fn)
        self._call(fn, self._addr(buffer), len(array), array.array)

    def view(self, buffer):
        """lowrankBufferGetView as a dict (planned, perTensor, ncompressed, approxRank, calls, ...)."""
        v = _capi.BufferView()
        self._call("lowrankBufferGetView", self._addr(buffer), ctypes.byref(v))
        return _capi.struct_to_dict(v)

    def tensor_ranks(self, buffer):
        """lowrankBufferGetTensorRanks: each tensor's approximation rank in force in the buffer's
        plan, a list of ints in layout order (one in batched mode): its k after the
        compression-rate test and the clipping to min(n, m), 0 for a tensor allreduced exactly
        (1-D, declared exact, failing the test, in its warm-up). [] for a buffer without a plan.
        Raises LowrankError lowrankInvalidUsage for a library older than this function.
        Thread safety: as every call (the communicator's lock)."""
        fn = "lowrankBufferGetTensorRanks"
        if not hasattr(self._lib, fn):
            raise LowrankError(5, f"{self._lib.lowrank_path} is older than this package: no {fn}",
                               fn)
        addr = self._addr(buffer)
        for _ in range(3):  # another thread may re-plan the buffer between the two calls
            n = ctypes.c_int(0)
            self._call(fn, addr, ctypes.byref(n), None)
            out = (ctypes.c_int * max(1, n.value))()
            try:
                self._call(fn, addr, ctypes.byref(n), out)
            except InvalidArgumentError:
                continue
            return list(out[:n.value])
        raise LowrankError(5, "the buffer's plan kept changing while it was read", fn)

    def reset(self, buffer):
        """Drop the buffer's residual and factors (its layout stays): the next call starts afresh."""
        self._call("lowrankBufferReset", self._addr(buffer))

    def set_alternate(self, buffer, alternate):
        """lowrankBufferSetAlternate: the schedule of one buffer (a tensor/array, or its address
        as an int). alternate True (or 1): alternating PowerSGD (ACP-SGD: Zhang, Zhang, Shi, Chu,
        Li, ICDCS 2023), one factor allreduce per call, P and Q on alternate calls
        (docs/design.md, "Alternating factors"); False (0): PowerSGD's two allreduces per call;
        None (or -1, LOWRANK_ALTERNATE_DEFAULT): the communicator's config "alternate". A change
        of schedule takes effect at the buffer's next call, which plans it again keeping its
        tensors' residuals and warm-start Q; the alternation (re)starts with a P step (the
        schedule it already has changes nothing). Every comm rank must choose
        the same (else that call fails on every rank). Local, not collective.
        Raises TypeError (not a bool, an int or None), InvalidArgumentError (another int; True
        on a communicator whose warm_start is off), LowrankError lowrankInvalidUsage for a
        library older than this function."""
        value = _capi.ALTERNATE_DEFAULT if alternate is None else \
            int(alternate) if isinstance(alternate, bool) else as_int(alternate)
        if not hasattr(self._lib, _ALTERNATE_FN):
            raise LowrankError(5, f"{self._lib.lowrank_path} is older than this package: no "
                                  f"{_ALTERNATE_FN}", _ALTERNATE_FN)
        if value not in (_capi.ALTERNATE_DEFAULT, 0, 1):  # ctypes would wrap a large int
            raise InvalidArgumentError(4, f"alternate is {value}, not True, False or None",
                                       _ALTERNATE_FN)
        self._call(_ALTERNATE_FN, self._addr(buffer), value)

    def release(self, buffer):
        """Free everything held for the buffer, its layout included."""
        self._call("lowrankBufferRelease", self._addr(buffer))

    # ---- checkpoint of a buffer's state (docs/checkpoint.md) ------------------------------------
    def save_state(self, buffer):
        """lowrankBufferSaveState: the buffer's PowerSGD state (its residual E, the warm-start Q of
        every compressed tensor, the call count, checked by a CRC) as bytes, to keep with the
        model and optimizer; every comm rank saves its own (the residuals are per comm rank).
        buffer: the tensor/array allreduced into, or its address as an int. Local, changes
        nothing; a CUDA buffer's queued work is waited for. A buffer restored and not called
        since saves what was restored. A buffer declared with set_tensors saves format 2: each
        declared id's state, wherever it is held now (that buffer, another, or a restore staged
        and not yet installed).
        Raises InvalidArgumentError (a null buffer), LowrankError lowrankInvalidUsage (the buffer
        has no state: never called compressibly on this communicator, or reset since)."""
        addr = self._addr(buffer)
        size = ctypes.c_size_t(0)
        self._call("lowrankBufferSaveState", addr, None, ctypes.byref(size))
        for _ in range(3):  # another thread may re-plan the buffer between the two calls
            out = ctypes.create_string_buffer(max(1, size.value))
            have = size.value
            try:
                self._call("lowrankBufferSaveState", addr, out, ctypes.byref(size))
            except InvalidArgumentError:
                if size.value > have:  # too small: size now says what is needed
                    continue
                raise
            return out.raw[:size.value]
        raise LowrankError(5, "the buffer's state kept changing size while it was saved",
                           "lowrankBufferSaveState")

    def restore_state(self, buffer, data):
        """lowrankBufferRestoreState: give the buffer the state `data` (bytes from save_state of
        the same comm rank, same comm size, approximation rank, seed and error feedback). Call it
        on every comm rank at the same point (as reset), each with its own comm rank's bytes;
        set_layout may come before or after it and keeps it pending. The buffer's current state
        is dropped; the restored one is installed, and checked across comm ranks, at the
        buffer's next compressible call. data: bytes, bytearray or memoryview.
        Raises InvalidArgumentError (data truncated, corrupt, not lowrank's, another format
        version), LowrankError lowrankInvalidUsage naming what differs (comm size or rank, k,
        seed, error feedback, layout); at the next call every comm rank raises
        lowrankInvalidUsage if the ranks' restored states disagree (some ranks restored, others
        not, or states from different steps), or if count, dtype or layout differ.
        Format-2 bytes (save_state of a buffer declared with set_tensors) stage each id's state
        communicator-wide: `buffer` is then any non-null address, and whichever buffer next
        declares and calls that id installs it (a copy if the grouping differs). Format-1 bytes
        restored into a buffer declared with set_tensors whose shapes equal the saved layout
        become per-id staged states of the declared ids (old checkpoints load into ids)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(4, f"data must be bytes (from save_state), not "
                                          f"{type(data).__name__}", "lowrankBufferRestoreState")
        raw = bytes(data)
        if not raw:
            raise InvalidArgumentError(4, "data is empty", "lowrankBufferRestoreState")
        self._call("lowrankBufferRestoreState", self._addr(buffer), raw, len(raw))

    # ---- queries -------------------------------------------------------------------------------
    def stats(self):
        """lowrankGetStats as a dict: calls, compressedCalls, fallbackCalls, compressedElements,
        exactElements, payloadElements, elementsSent, bytesSent, ratio, stateBytes, buffers,
        exactOnlyPlans, rankChanges (tensors declared again with another approximation rank)."""
        st = _capi.Stats()
        self._call("lowrankGetStats", ctypes.byref(st))
        return _capi.struct_to_dict(st)

    def transport_info(self):
        """lowrankCommGetTransportInfo as a dict: what the transport measured and chose. For the
        host transport: transport "ucx", choice ("measured": links measured when the comm was
        made; "given", "forced", "tuned"), alpha_us, overhead_us, beta_ns_per_byte (the cost
        model's constants in use), probe (this comm rank's link timings, when measured) and
        algorithms ({size class floor(log2(bytes)) as a string: algorithm last used}). Over NCCL:
        {"transport": "nccl"}. Raises LowrankError lowrankInvalidUsage for a library older than
        this function. Thread safety: as every call (the communicator's lock: it waits for a call
        in progress on another thread)."""
        fn = "lowrankCommGetTransportInfo"
        if not hasattr(self._lib, fn):
            raise LowrankError(5, f"{self._lib.lowrank_path} is older than this package: no {fn}",
                               fn)
        for _ in range(3):  # a call between the two may add a size class
            needed = ctypes.c_size_t(0)
            self._call(fn, None, 0, ctypes.byref(needed))
            buf = ctypes.create_string_buffer(needed.value + 64)
            self._call(fn, buf, len(buf), ctypes.byref(needed))
            if needed.value <= len(buf):
                return json.loads(buf.value.decode())
        raise LowrankError(5, "the transport's record kept growing while it was read", fn)

    def memory(self, buffer):
        """lowrankBufferGetMemory as a dict, bytes the buffer's state holds now: planned,
        device (1: device memory), supplied (1: from set_allocator's alloc), residualBytes,
        factorBytes, payloadBytes, workspaceBytes, tableBytes, pinnedBytes, totalBytes (their
        sum); every byte field 0 for a buffer that holds no state. docs/cuda.md, "Memory", gives
        each field's formula. Local; waits for nothing.
        Raises LowrankError lowrankInvalidUsage for a library older than this function."""
        fn = "lowrankBufferGetMemory"
        if not hasattr(self._lib, fn):
            raise LowrankError(5, f"{self._lib.lowrank_path} is older than this package: no {fn}",
                               fn)
        info = _capi.MemoryInfo.initializer()
        self._call(fn, self._addr(buffer), ctypes.byref(info))
        out = _capi.struct_to_dict(info)
        del out["size"]
        return out

    def set_allocator(self, alloc, free):
        """lowrankCommSetAllocator: device buffers planned from now on take every byte of their
        state's device memory from alloc(nbytes, stream) -> address (an int, device memory for
        the work queued on `stream` (a cudaStream_t as an int) from now on; raise, or return 0,
        to refuse) and give it back through free(address, stream) (no longer used once the work
        queued on `stream` so far has run). Both are called on the thread of a call on this
        communicator, inside it; they must not call this communicator. A refusal fails that
        call on every comm rank with nothing changed (lowrank.h); what alloc raised is raised by
        the call (chained from lowrank's error), so that a framework's out-of-memory error is
        what the caller sees. alloc and free None: lowrank's own allocation from now on. States
        planned before keep their memory until released.
        Raises LowrankError lowrankInvalidUsage for a library older than this function;
        TypeError when only one of them is None."""
        fn = "lowrankCommSetAllocator"
        if not hasattr(self._lib, fn):
            raise LowrankError(5, f"{self._lib.lowrank_path} is older than this package: no {fn}",
                               fn)
        if (alloc is None) != (free is None):
            raise TypeError("set_allocator: give both alloc and free, or neither")
        if alloc is None:
            self._call(fn, _capi.ALLOC_FN(), _capi.FREE_FN(), None)
            self._allocator = None
            return

        def c_alloc(out, nbytes, stream, _):
            try:
                address = int(alloc(int(nbytes), stream or 0))
            except BaseException as e:  # noqa: B902 - kept for the call to raise
                self._alloc_error = e
                return 2  # lowrankSystemError: a refusal
            out[0] = address
            return 0 if address else 2

        def c_free(address, stream, _):
            try:
                free(int(address or 0), stream or 0)
            except BaseException as e:  # noqa: B902 - nothing to raise it to
                import logging
                logging.getLogger("lowrank").warning("lowrank: the allocator's free(%#x) raised "
                                                     "%r", address or 0, e)

        funcs = (_capi.ALLOC_FN(c_alloc), _capi.FREE_FN(c_free))
        self._call(fn, funcs[0], funcs[1], None)
        # States planned with them may outlive a later set_allocator: kept until destroy.
        self._allocator = (funcs, self._allocator)

    def config(self):
        """The configuration in force (every field resolved), as a dict of CONFIG_FIELDS keys;
        factor_dtype as its name, "fp32", "bf16" or "fp16" (alternate 0 and factor_dtype "fp32"
        from a library older than them, which never alternates and sends float32 factors)."""
        cfg = _capi.Config.initializer()
        try:
            self._call("lowrankCommGetConfig", ctypes.byref(cfg))
        except InvalidArgumentError as e:  # GetConfig's message is the thread's, not the comm's
            if not _older_config(self._lib, e.code, cfg, "lowrankCommGetConfig"):
                raise
            self._call("lowrankCommGetConfig", ctypes.byref(cfg))
        out = {key: getattr(cfg, field) for key, field in CONFIG_FIELDS.items()}
        if out["alternate"] == _capi.UNDEF_INT:  # not written by an older library
            out["alternate"] = 0
        names = {code: name for name, code in _capi.FACTOR_DTYPES.items()}
        out["factor_dtype"] = names.get(out["factor_dtype"], "fp32")  # UNDEF: an older library
        return out

    # ---- lifetime ------------------------------------------------------------------------------
    def destroy(self):
        """lowrankCommDestroy (not collective). Later calls raise; a second destroy does nothing."""
        with self._lock:
            h, self._handle = self._handle, None
            if h:
                self._lib.lowrankCommDestroy(ctypes.c_void_p(h))

    def abort(self):
        """lowrankCommAbort: a call blocked on this communicator (another thread) returns promptly
        with an error; then the communicator is freed. Callable from any thread."""
        with self._err_lock:  # from here no thread reads the comm's last error (it may be freed)
            self._aborting = True
            h, self._handle = self._handle, None  # without self._lock: a call may hold it
        if h:
            self._lib.lowrankCommAbort(ctypes.c_void_p(h))

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if self.closed else f"comm rank {self.rank} of {self.size}"
        return f"<lowrank.Communicator {self.device}, {state}>"

    # ---- internals -----------------------------------------------------------------------------
    def _int_query(self, fn):
        out = ctypes.c_int()
        self._call(fn, ctypes.byref(out))
        return out.value

    def _addr(self, buffer):
        if isinstance(buffer, int):
            return ctypes.c_void_p(buffer)
        return ctypes.c_void_p(describe(buffer, "buffer").ptr)

    def _call(self, fn, *args):
        with self._lock:
            h = self._handle
            if h is None:
                raise LowrankError(5, "the communicator was destroyed or aborted", fn)
            comm = ctypes.c_void_p(h)
            if _COMM in args:  # the comm is not the first argument (lowrankAllReduce)
                rc = getattr(self._lib, fn)(*[comm if a is _COMM else a for a in args])
            else:
                rc = getattr(self._lib, fn)(comm, *args)
            raised, self._alloc_error = self._alloc_error, None
            if rc:
                with self._err_lock:
                    if self._aborting:  # the comm is being freed: its message is gone with it
                        raise error_for(rc, "the communicator was aborted (lowrankCommAbort) during "
                                            "the call", fn)
                    error = _fail(self._lib, rc, fn, ctypes.c_void_p(h))
                if raised is not None:  # the allocator's own error (a framework's out-of-memory)
                    raise raised from error
                raise error


_COMM = object()  # stands for the communicator's handle in _call's arguments


def _older_config(lib, rc, cfg, name):
    """Whether the call that returned rc refused `cfg` (a Config of this package's size) as a
    library older than lowrankConfig_t.factorDtype does: its size is not that library's, so the
    call did nothing. Then cfg takes the older size (the fields up to alternate), for the caller
    to call again, unless it asks for 16-bit factors, which such a library cannot send:
    LowrankError (lowrankInvalidUsage) naming the missing feature. The refusal's text is this
    thread's last error (the calls that take a config report theirs there)."""
    if rc != _capi.INVALID_ARGUMENT or cfg.size != ctypes.sizeof(_capi.Config):
        return False
    message = (lib.lowrankGetLastError(None) or b"").decode(errors="replace")
    if "LOWRANK_CONFIG_INITIALIZER" not in message:
        return False
    if cfg.factorDtype not in (_capi.UNDEF_INT, _capi.FACTOR_DTYPES["fp32"]):
        names = {code: n for n, code in _capi.FACTOR_DTYPES.items()}
        raise LowrankError(5, f"{lib.lowrank_path} is older than this package: no 16-bit factors "
                              f"(config factor_dtype {names.get(cfg.factorDtype)!r}; its "
                              "lowrankConfig_t has no factorDtype)", name)
    cfg.size = _capi.CONFIG_SIZE_NO_FACTOR_DTYPE
    return True
_ALTERNATE_FN = "lowrankBufferSetAlternate"  # in libraries with alternating PowerSGD


class _TensorArray:
    """A checked lowrankTensor_t array (tensor_array): set_tensors takes it as it is."""
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __len__(self):
        return len(self.array)


def tensor_array(tensors):
    """Communicator.set_tensors' `tensors` (see there) checked and converted once, for a buffer
    declared at every call. Raises InvalidArgumentError naming the first bad entry."""
    fn = "lowrankBufferSetTensors"
    try:
        entries = list(tensors)
    except TypeError:
        raise InvalidArgumentError(4, f"tensors must be an iterable of (id, shape) or (id, shape, "
                                      f"approx_rank), not {type(tensors).__name__}", fn) from None
    if not entries:
        raise InvalidArgumentError(4, "set_tensors: no tensors", fn)
    if len(entries) >= 2**31:
        raise InvalidArgumentError(4, f"set_tensors: {len(entries)} tensors, at most 2^31 - 1", fn)
    array = (_capi.Tensor * len(entries))()
    seen = set()
    for n, entry in enumerate(entries):
        try:
            tid, shape, *rest = entry
            if len(rest) > 1 or isinstance(shape, (set, frozenset, dict)):  # a set has no order
                raise ValueError
            tid = as_int(tid)
            shape = [as_int(d) for d in shape]
            rank = rest[0] if rest else None
            rank = _capi.RANK_DEFAULT if rank is None else as_int(rank)
        except (TypeError, ValueError):
            raise InvalidArgumentError(4, f"tensors[{n}] is {entry!r}, not (id, shape) or "
                                          "(id, shape, approx_rank) with ints", fn) from None
        if not 0 <= tid < 2**64:
            raise InvalidArgumentError(4, f"tensors[{n}]: id {tid} is not in [0, 2^64 - 1]", fn)
        if tid in seen:
            raise InvalidArgumentError(4, f"tensors[{n}]: id {tid} given twice", fn)
        seen.add(tid)
        if not 1 <= len(shape) <= _capi.MAX_DIMS or any(d < 1 or d >= 2**64 for d in shape):
            raise InvalidArgumentError(4, f"tensors[{n}] (id {tid}): shape {tuple(shape)} must "
                                          f"have 1 to {_capi.MAX_DIMS} sizes, each >= 1", fn)
        if rank != _capi.RANK_DEFAULT and not 0 <= rank <= _capi.MAX_TENSOR_RANK:
            raise InvalidArgumentError(4, f"tensors[{n}] (id {tid}): approx_rank {rank} is not "
                                          f"None, -1, 0 or in [1, {_capi.MAX_TENSOR_RANK}]", fn)
        t = array[n]
        t.id, t.ndims, t.approxRank = tid, len(shape), rank
        for d, size in enumerate(shape):
            t.shape[d] = size
    return _TensorArray(array)


def _cuda_stream(stream, index):
    """cudaStream_t (int) of `stream`: None -> torch's current stream on device `index`."""
    if stream is None:
        import torch
        return torch.cuda.current_stream(index).cuda_stream
    if isinstance(stream, int):
        return stream
    return stream.cuda_stream
