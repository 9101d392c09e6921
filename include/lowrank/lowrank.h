/*
 * lowrank: PowerSGD compressed allreduce with error feedback, in the style of NCCL's C API.
 *
 * Method: Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
 * Distributed Optimization", NeurIPS 2019 (arXiv 1905.13727): the rank-k compression of its
 * Algorithm 1, warm-started from the previous call's Q, inside the error-feedback scheme of its
 * Algorithm 2 (the optimizer's momentum stays the application's). P is orthonormalized by
 * Gram-Schmidt for k <= 2 and Householder QR above, in float64. Per buffer and per call, on every
 * comm rank i:
 *
 *   M_i  = G_i + E_i                     error feedback
 *   P    = sum_i M_i Q                   n x k, allreduce #1, then orthonormalized
 *   Q    = sum_i M_i^T P                 m x k, allreduce #2; Qbar = Q / N
 *   out  = P Qbar^T (avg) or N P Qbar^T (sum); identical on every comm rank
 *   E_i  = M_i - P Qbar^T                kept (float32) for the next call
 *
 * This header includes no CUDA header: streams are `void*`, so CPU-only users need no CUDA.
 *
 * Thread safety: every function is thread-safe with respect to calls on *different* communicators.
 * Calls on one communicator must be serialized by the caller (as with NCCL), except
 * lowrankCommAbort and lowrankGetLastError, which may be called from any thread while another
 * call runs on it; never with or after lowrankCommDestroy / lowrankCommAbort of that communicator
 * (it is freed then, as NCCL's). No function throws or lets a C++ exception escape.
 */
#ifndef LOWRANK_LOWRANK_H_
#define LOWRANK_LOWRANK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; lowrankGetVersion gives the library's (LOWRANK_VERSION_CODE). */
#define LOWRANK_MAJOR 0
#define LOWRANK_MINOR 1
#define LOWRANK_PATCH 0
#define LOWRANK_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define LOWRANK_VERSION_CODE LOWRANK_VERSION(LOWRANK_MAJOR, LOWRANK_MINOR, LOWRANK_PATCH)

/* Result codes (numbering follows ncclResult_t where NCCL has the same code). */
typedef enum {
  lowrankSuccess = 0,
  lowrankUnhandledCudaError = 1, /* a CUDA call failed */
  lowrankSystemError = 2,        /* the OS or a library (socket, UCX, allocation) failed */
  lowrankInternalError = 3,      /* a bug in lowrank: please report it */
  lowrankInvalidArgument = 4,    /* a bad argument: null or misaligned pointer, bad count, dtype, op */
  lowrankInvalidUsage = 5,       /* a bad sequence of calls, mismatched ranks, or a failed comm */
  lowrankRemoteError = 6,        /* a peer failed or disconnected */
  lowrankInProgress = 7,         /* reserved (NCCL's code for a non-blocking init): not returned */
  lowrankTimeout = 8,            /* a wait exceeded the configured timeout */
  lowrankNumResults = 9
} lowrankResult_t;

/* Data types; values equal ncclDataType_t's so that the NCCL shim can pass them through. */
typedef enum {
  lowrankInt8 = 0,
  lowrankUint8 = 1,
  lowrankInt32 = 2,
  lowrankUint32 = 3,
  lowrankInt64 = 4,
  lowrankUint64 = 5,
  lowrankFloat16 = 6,
  lowrankFloat32 = 7,
  lowrankFloat64 = 8,
  lowrankBfloat16 = 9,
  lowrankNumTypes = 10
} lowrankDataType_t;

/* Reduction operations; values equal ncclRedOp_t's. */
typedef enum {
  lowrankSum = 0,
  lowrankProd = 1,
  lowrankMax = 2,
  lowrankMin = 3,
  lowrankAvg = 4,
  lowrankNumOps = 5
} lowrankRedOp_t;

/* A communicator: a group of comm ranks that allreduce together, and the per-buffer state (residual,
 * factors) of the buffers allreduced on it. Opaque; made by lowrankCommInit*, freed by
 * lowrankCommDestroy or lowrankCommAbort. */
typedef struct lowrankComm* lowrankComm_t;

#define LOWRANK_UNIQUE_ID_BYTES 128
/* Opaque identifier of a communicator being created: the root's bootstrap address and a random
 * 128-bit secret. Made once by lowrankGetUniqueId, then passed to every comm rank. */
typedef struct {
  char internal[LOWRANK_UNIQUE_ID_BYTES];
} lowrankUniqueId;

/* Values meaning "not set here": the LOWRANK_* environment variable, else the default, applies. */
#define LOWRANK_CONFIG_UNDEF_INT (-2147483647 - 1)
#define LOWRANK_CONFIG_UNDEF_DOUBLE (-1.0)
#define LOWRANK_CONFIG_UNDEF_SEED (-1LL)
#define LOWRANK_CONFIG_MAGIC 0x4c52434bu /* "LRCK" */

/* Communicator configuration, as ncclConfig_t: initialize with LOWRANK_CONFIG_INITIALIZER, then set
 * the fields you want. Explicit fields win; unset ones come from the environment variable named
 * beside them, else the default. Every value in force is logged at LOWRANK_DEBUG=INFO. */
typedef struct {
  size_t size;          /* sizeof(lowrankConfig_t), set by the initializer */
  unsigned int magic;   /* LOWRANK_CONFIG_MAGIC */
  unsigned int version; /* LOWRANK_VERSION_CODE (informative: size and magic are what is checked) */
  int approxRank;       /* approximation rank k, in [0, 65536]; 0 turns compression off (every
                           call is an exact allreduce). LOWRANK_APPROX_RANK, default 4 */
  double minCompressionRate; /* a tensor is compressed only if (n + m) k rate < n m; >= 1.
                           LOWRANK_MIN_COMPRESSION_RATE, default 2 */
  int startIter;        /* calls per buffer done exactly before compression starts; in [0, 2^30].
                           LOWRANK_START_ITER, default 0 */
  int errorFeedback;    /* 0 or 1. LOWRANK_ERROR_FEEDBACK, default 1 */
  int warmStart;        /* 0 or 1: reuse Qbar of the previous call. LOWRANK_WARM_START, default 1 */
  double orthoEpsilon;  /* added to column norms in Gram-Schmidt (k <= 2 only; Householder QR,
                           used above, needs none), as PyTorch's orthogonalization_epsilon; >= 0.
                           LOWRANK_ORTHO_EPSILON, default 0 (a zero or dependent column becomes
                           zero, never NaN, whatever this is) */
  long long seed;       /* seed of the initial Q, the same on every comm rank; in [0, 2^63 - 1].
                           LOWRANK_SEED, default 0 */
  double timeoutSec;    /* bound on every wait for a peer, seconds, > 0. LOWRANK_TIMEOUT, default 300 */
  int pipeline;         /* 0 or 1: overlap the factor allreduces with the compression passes, chunk
                           by chunk (a progress thread drives the transport). LOWRANK_PIPELINE,
                           default 1. Results agree with pipeline 0 to float rounding (the chunks
                           change the order of the sums), and are identical on every comm rank. */
  int alternate;        /* 0 or 1: alternating PowerSGD (ACP-SGD, Zhang et al., ICDCS 2023): one
                           factor allreduce per call, P and Q on alternate calls (docs/design.md,
                           "Alternating factors"), instead of PowerSGD's two dependent ones. Needs
                           warmStart 1. LOWRANK_ALTERNATE, default 0; per buffer:
                           lowrankBufferSetAlternate. */
  int factorDtype;      /* the dtype PowerSGD's factors P and Q travel in: lowrankFloat32, or
                           lowrankBfloat16 / lowrankFloat16 for half the factors' bytes
                           (docs/design.md, "16-bit factors"; prefer bfloat16: float16 spans 6e-5
                           to 65504, small factors lose bits). On the host transport each send
                           rounds once and every sum is taken in float32; on a device, NCCL sums
                           bfloat16, and a float16 request travels as bfloat16 there (float16's
                           range does not hold factors of every scale); on the host, a call whose
                           inputs could overflow float16 factors is allreduced exactly (counted in
                           lowrankStats_t.fallbackCalls). The exact part and the payload's checks
                           stay float32. Must be
                           the same on every comm rank (the plan check fails every rank otherwise).
                           LOWRANK_FACTOR_DTYPE=fp32|bf16|fp16, default fp32. */
} lowrankConfig_t;

#define LOWRANK_CONFIG_INITIALIZER                                                              \
  {                                                                                             \
    sizeof(lowrankConfig_t), LOWRANK_CONFIG_MAGIC, LOWRANK_VERSION_CODE,                        \
        LOWRANK_CONFIG_UNDEF_INT, LOWRANK_CONFIG_UNDEF_DOUBLE, LOWRANK_CONFIG_UNDEF_INT,        \
        LOWRANK_CONFIG_UNDEF_INT, LOWRANK_CONFIG_UNDEF_INT, LOWRANK_CONFIG_UNDEF_DOUBLE,        \
        LOWRANK_CONFIG_UNDEF_SEED, LOWRANK_CONFIG_UNDEF_DOUBLE, LOWRANK_CONFIG_UNDEF_INT,       \
        LOWRANK_CONFIG_UNDEF_INT, LOWRANK_CONFIG_UNDEF_INT                                      \
  }

/* ---- Version and errors ------------------------------------------------------------------- */

/* *version = LOWRANK_VERSION_CODE of the library loaded. Errors: lowrankInvalidArgument (null). */
lowrankResult_t lowrankGetVersion(int* version);

/* The sources the library loaded was built from, for a result's provenance, as the build found
 * them (at every build, not only at configure). *revision: the git commit checked out in the
 * source tree, 40 hex digits; "unknown" where the tree was not a git checkout of its own and no
 * revision was recorded (an sdist made by `meson dist` records it). *sourcesDirty: 1 when the
 * library's sources (every file under plugin/, kernels/ and include/, and every meson.build and
 * meson_options.txt) differed from that revision's, 0 when they did not, -1 when unknown.
 * *sourcesDigest: 64 hex digits, the sha256 of those sources as built (equal sources, equal
 * digest, whatever the revision; scripts/source_revision.py computes it for a commit). The
 * strings are static. Any argument may be NULL. Errors: none (returns lowrankSuccess).
 * Thread safety: any thread. */
lowrankResult_t lowrankGetBuildInfo(const char** revision, int* sourcesDirty,
                                    const char** sourcesDigest);

/* A static, human-readable name of a result code; never null. */
const char* lowrankGetErrorString(lowrankResult_t result);

/* The message of the last error on `comm` (or, with comm null, of the calling thread's last error
 * made without one: lowrankGetUniqueId, the lowrankCommInit* calls, null-comm errors, and
 * lowrankCommCount / UserRank / GetConfig); "" when none. The text is this thread's copy: valid
 * until the thread's next lowrankGetLastError. Never null. */
const char* lowrankGetLastError(lowrankComm_t comm);

/* Diagnostics: the NCCL library lowrank uses for device buffers and NCCL communicators, loaded
 * now if it is not yet (a GPU is not needed). The first found wins: the library LOWRANK_NCCL_LIBRARY
 * names; an NCCL the process has loaded (torch's, for instance); nvidia/nccl/lib/libnccl.so.2 of a
 * PyPI NCCL wheel under a folder of LOWRANK_NCCL_WHEEL_PATH (the Python package sets it to
 * sys.path when unset); libnccl.so.2 from the dynamic loader. *path: the library's path; *source:
 * "LOWRANK_NCCL_LIBRARY", "loaded by the process", "PyPI wheel" or "dynamic loader"; *version:
 * ncclGetVersion's code (e.g. 22703). The strings are static. Any argument may be NULL.
 * Errors: lowrankSystemError when none loads or it lacks NCCL's entry points (lowrankGetLastError(
 * NULL) names what was tried). Thread safety: any thread; the library is resolved once per process. */
lowrankResult_t lowrankGetNcclLibrary(const char** path, const char** source, int* version);

/* ---- Communicators -------------------------------------------------------------------------- */

/* Makes a new unique id on the process that will be comm rank 0 (the root): opens the bootstrap
 * listening socket (interface from LOWRANK_SOCKET_IFNAME, else the first non-loopback interface
 * that is up, else loopback) and draws a random 128-bit secret. Pass the id to every comm rank
 * (threads: copy it; processes: any side channel). One id serves one communicator; the root's
 * listening thread exits once it has formed, or after the timeout (LOWRANK_TIMEOUT).
 * Errors: lowrankInvalidArgument (null), lowrankInvalidUsage (malformed LOWRANK_TIMEOUT or unknown
 * LOWRANK_SOCKET_IFNAME; the message names it), lowrankSystemError (socket). */
lowrankResult_t lowrankGetUniqueId(lowrankUniqueId* uniqueId);

/* Creates a communicator of `nranks` comm ranks, this caller being `rank` (0 <= rank < nranks).
 * Collective: every comm rank must call it with the same id and nranks (1 to 65536), each from its
 * own thread or process; it blocks until all have joined or timeoutSec (seconds, the config's or
 * LOWRANK_TIMEOUT) has passed. With config null, LOWRANK_* variables and defaults apply.
 * Errors: lowrankInvalidArgument (null pointer, bad nranks/rank, malformed config or id),
 * lowrankInvalidUsage (a bad LOWRANK_* variable; the message names it), lowrankSystemError,
 * lowrankRemoteError (the root refused this rank: another nranks, a comm rank given twice, a wrong
 * secret), lowrankTimeout. *comm is null on error.
 * Thread safety: calls for different comm ranks run concurrently (that is how threads join). */
lowrankResult_t lowrankCommInitRank(lowrankComm_t* comm, int nranks, lowrankUniqueId uniqueId,
                                    int rank);
lowrankResult_t lowrankCommInitRankConfig(lowrankComm_t* comm, int nranks,
                                          lowrankUniqueId uniqueId, int rank,
                                          lowrankConfig_t* config);

/* Creates a communicator from the environment of a launcher, for one process per comm rank.
 * Collective over all processes. Reads, first found wins:
 *   comm rank and size: LOWRANK_RANK / LOWRANK_WORLD_SIZE, torchrun's RANK / WORLD_SIZE, Open MPI's
 *     OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE, PMI_RANK / PMI_SIZE, Slurm's SLURM_PROCID /
 *     SLURM_NTASKS;
 *   the root's bootstrap address: LOWRANK_ROOT_ADDR (host:port), else MASTER_ADDR with port
 *     MASTER_PORT + 1 (torchrun's own store holds MASTER_PORT); comm rank 0 listens there;
 *   the secret: LOWRANK_SECRET (32 hex digits) when set; else one derived from the root address and
 *     world size, which refuses strays but is no protection against a hostile network.
 * LOWRANK_SOCKET_IFNAME picks the interface comm rank 0 listens on when the address is a wildcard.
 * With config null, LOWRANK_* variables and defaults apply (as lowrankCommInitRankConfig).
 * Errors: lowrankInvalidArgument (null comm, or a bad config field), lowrankInvalidUsage (no
 * launcher variables, or a malformed one: the message names it), lowrankSystemError,
 * lowrankRemoteError, lowrankTimeout. *comm is null on error. */
lowrankResult_t lowrankCommInitFromEnv(lowrankComm_t* comm);
lowrankResult_t lowrankCommInitFromEnvConfig(lowrankComm_t* comm, lowrankConfig_t* config);

/* Frees the communicator and every buffer state it holds. Not collective: peers that still run
 * collectives on it will see a remote error or time out. Waits for a call still running on it (on
 * another thread) to return, and, for device buffers, for the device work queued on it to finish.
 * An NCCL communicator it owns (lowrankCommInitNcclRank, lowrank_nccl.h) is destroyed last.
 * Errors: lowrankInvalidArgument (null); that ncclCommDestroy's error, mapped (comm is freed all
 * the same). */
lowrankResult_t lowrankCommDestroy(lowrankComm_t comm);

/* Ends the communicator at once, as ncclCommAbort, never waiting for a call in flight: it marks
 * the communicator failed and releases every wait (the host transport's and the device's), and
 * aborts the NCCL communicator lowrankCommInitNcclRank made (ncclCommAbort) first, which ends its
 * collectives; a call blocked on it (on another thread, e.g. waiting for a dead peer, on the host
 * or on the device) returns an error (lowrankRemoteError) promptly instead of at the timeout.
 * Then the communicator is freed as lowrankCommDestroy does, device memory after its queued work
 * (waiting at most a second per buffer: memory whose work does not finish, held by an
 * application's NCCL communicator, is left allocated with a WARN). The NCCL communicator of
 * lowrankCommInitFromNccl is not aborted: it is the application's. The communicator must not be
 * used afterwards. Errors: lowrankInvalidArgument (null); that ncclCommAbort's error, mapped. */
lowrankResult_t lowrankCommAbort(lowrankComm_t comm);

/* The configuration in force on comm: every field resolved (explicit field, else LOWRANK_*
 * variable, else default). config must come from LOWRANK_CONFIG_INITIALIZER (its header is checked).
 * Errors: lowrankInvalidArgument (null, or a config header that does not match). */
lowrankResult_t lowrankCommGetConfig(const lowrankComm_t comm, lowrankConfig_t* config);

/* Number of comm ranks / this caller's comm rank. Errors: lowrankInvalidArgument (null). */
lowrankResult_t lowrankCommCount(const lowrankComm_t comm, int* count);
lowrankResult_t lowrankCommUserRank(const lowrankComm_t comm, int* rank);

/* ---- The allreduce --------------------------------------------------------------------------- */

/* Allreduce of `count` elements (not bytes) of `datatype` from sendbuff into recvbuff (in-place
 * when equal), host memory, or device memory on an NCCL communicator (below). Collective: every
 * comm rank calls it with the same count, datatype and op, in the same order of buffers.
 *
 * Compressed (PowerSGD) when datatype is lowrankFloat32, lowrankFloat16 or lowrankBfloat16 and op
 * is lowrankSum or lowrankAvg and approxRank > 0: computed in float32, residual in float32, the
 * result identical on every comm rank (it is an approximation of the exact allreduce, with the
 * residual fed back at the next call on the same recvbuff). Every other dtype and op is an exact
 * allreduce, as ncclAllReduce computes it (never a wrong answer). Calls made before startIter on a
 * buffer are exact.
 *
 * State is kept per (comm, recvbuff): a residual E of `count` float32 (when error feedback is on)
 * and the factors. A call with another count or datatype on the same recvbuff resets it. The view
 * is made at the buffer's first call: per-tensor (lowrankBufferSetLayout) or one matrix (batched).
 * If any comm rank's input has a NaN or Inf, or an element so large that the factors could
 * overflow float32, every comm rank does an exact allreduce for this call (NaN/Inf propagate as in
 * NCCL), and the buffer's state is reset (counted in lowrankStats_t.fallbackCalls). Device buffers
 * take that decision on the GPU instead: see lowrank_nccl.h.
 *
 * `stream` is a cudaStream_t for device buffers, which need a communicator made by
 * lowrankCommInitFromNccl (lowrank_nccl.h); the call is then asynchronous on that stream, and a
 * compressed one must not be made inside the caller's ncclGroupStart/ncclGroupEnd (lowrank_nccl.h
 * says why and what is detected). Host
 * buffers: pass NULL (on an NCCL communicator a stream is accepted and ignored). Device memory is
 * recognised through the CUDA driver when the process has loaded one; otherwise every buffer is
 * host memory. Host and device buffers in one call: lowrankInvalidArgument.
 * Buffers must be aligned to their element size.
 * Errors:
 *   lowrankInvalidArgument: null comm or buffer, misaligned buffer, count 0 or count * size
 *     overflowing, unknown datatype or op, sendbuff and recvbuff partly overlapping, host and device
 *     buffers mixed, a stream with host buffers on a communicator not made from NCCL;
 *   lowrankInvalidUsage: the communicator failed earlier; device buffers on a communicator not made
 *     from NCCL; a compressible call inside CUDA graph capture; a layout whose elements are not
 *     `count`; comm ranks that disagree on (count, datatype, op, layout, k) of a buffer (found at
 *     its first compressed call: an exact call with differing counts fails on some comm rank with
 *     this, and on the others with a remote error or timeout) or on sum vs avg;
 *   lowrankRemoteError (a peer died or left), lowrankTimeout (LOWRANK_TIMEOUT), lowrankSystemError
 *     (allocation, the transport), lowrankUnhandledCudaError (device buffers), lowrankInternalError.
 * Errors found before any data moves (argument checks, the plan agreement, sum vs avg) leave the
 * communicator usable; the others, and a mismatch the transport finds midway through a collective,
 * mark it failed (later calls: lowrankInvalidUsage naming the first error): destroy it. Over NCCL
 * (lowrank_nccl.h), any error NCCL returns for one of a host-buffer call's allreduces fails it
 * likewise, whatever its code (ncclInvalidUsage and ncclInvalidArgument included). A failure of a
 * communicator that owns its NCCL communicator (lowrankCommInitNcclRank) aborts that one at once
 * (ncclCommAbort). On error
 * recvbuff may be partly written but the buffer's state is reset, never left half-updated. */
lowrankResult_t lowrankAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 lowrankDataType_t datatype, lowrankRedOp_t op,
                                 lowrankComm_t comm, void* stream);

/* ---- Per-buffer state -------------------------------------------------------------------------- */

/* Declares the tensors packed in the flat buffer `recvbuff`, in order: tensor t has ndims[t]
 * dimensions, its sizes in shapes[t][0 .. ndims[t]-1]. A tensor of >= 2 dimensions is viewed as
 * (shape[0], prod(shape[1:])) and compressed if it passes the compression-rate test; 1-D tensors
 * and the rest are allreduced exactly (per-tensor mode, as PyTorch's powerSGD_hook). Resets the
 * buffer's state (host or device; for a device buffer this waits for its queued work), keeping a
 * restore still pending (lowrankBufferRestoreState): the next call plans with this layout. The
 * sum of the tensors' elements must equal the count of the next compressible call (else that
 * call fails with lowrankInvalidUsage). Every comm rank must give the
 * same layout. Local, not collective.
 * Errors: lowrankInvalidArgument (null pointers, ntensors <= 0, ndims[t] < 1 or > 8, a size 0, a
 * total number of elements that overflows size_t). */
lowrankResult_t lowrankBufferSetLayout(lowrankComm_t comm, const void* recvbuff, int ntensors,
                                       const int* ndims, const size_t* const* shapes);

/* ---- Tensors with ids: state that follows the tensor ------------------------------------------ */

#define LOWRANK_MAX_DIMS 8
#define LOWRANK_RANK_DEFAULT (-1) /* lowrankTensor_t.approxRank: the communicator's approxRank */
#define LOWRANK_RANK_EXACT 0      /* lowrankTensor_t.approxRank: allreduced exactly, never compressed */

/* One tensor of a buffer declared with lowrankBufferSetTensors. */
typedef struct {
  uint64_t id;                    /* the caller's name for the tensor: any value, unique among the
                                     tensors of the communicator (a parameter's index, a hash of its
                                     name); the same on every comm rank */
  int ndims;                      /* 1 to LOWRANK_MAX_DIMS */
  size_t shape[LOWRANK_MAX_DIMS]; /* shape[0 .. ndims-1]: its sizes, each > 0 */
  int approxRank;                 /* LOWRANK_RANK_DEFAULT (lowrankConfig_t.approxRank),
                                     LOWRANK_RANK_EXACT, or a rank of its own in [1, 65536]; a
                                     compressed tensor still passes the compression-rate test, and
                                     1-D tensors are always exact */
} lowrankTensor_t;

/* Declares the tensors packed in order in the flat buffer `recvbuff`, each with an id, so that
 * their state belongs to the tensors rather than to the buffer's address (docs/api.md, "Tensor
 * ids"): the residual, the warm-start Q, the warm-up count and a pending restore of each id follow
 * it into whichever buffer declares it next. Per-tensor mode as lowrankBufferSetLayout (a tensor of
 * >= 2 dimensions viewed as (shape[0], prod(shape[1:]))), with each tensor's treatment its own.
 * Rules:
 *  - Declaring changes no state: the next compressible call on recvbuff takes each id's state
 *    from wherever it is. The same ids in the same order with the same shapes and treatment as a
 *    buffer declared before (another address: FSDP's freshly allocated outputs) take that
 *    buffer's state as is, without a copy (a lookup); ids in another order or grouping (a DDP
 *    bucket rebuild, a restart with another bucket size) are copied once, at that call, into the
 *    new buffer's state; ids seen nowhere start afresh. Ids a buffer gave up stay held (not
 *    freed) until another buffer takes them, lowrankBufferRelease of their last buffer, or
 *    lowrankCommDestroy.
 *  - A call on a buffer some of whose ids have since been taken by another buffer, with no new
 *    declaration on it, fails with lowrankInvalidUsage naming the id (declare it again to take
 *    them back).
 *  - Warm-up per id: each id counts the compressible calls it has been part of; a tensor is
 *    allreduced exactly until it has made lowrankConfig_t.startIter of them.
 *  - The first Q of a tensor is drawn from (seed, id, its call count), not from its position.
 *  - An id declared again with another approxRank keeps its state: at the next call its residual
 *    is kept as is and its warm-start Q keeps its columns, cut to the first k or grown with the
 *    columns a first Q of rank k would have drawn (the same on every comm rank); a checkpoint's
 *    tensor of another k is fitted the same way. Counted in lowrankStats_t.rankChanges. Every
 *    comm rank must declare the same change before the same call: ranks that all change, to
 *    different ks, fail that call with lowrankInvalidUsage on every rank (nothing changes); a
 *    change on some ranks only re-plans those alone, and the communicator fails (their plan
 *    check meets the others' compressed call), as a restore on some ranks only.
 *  - A buffer without ids that holds state of a layout (from its calls, or a restore pending)
 *    goes on as its tensors: declared with the shapes of that layout, tensor by tensor its state
 *    becomes that of the id declared in its place; the state of a batched buffer (no layout) fits
 *    no tensors and is dropped, unless it is a restore still pending, which is refused.
 * Calling it again with the same tensors is cheap (no state is touched). Every comm rank must
 * declare the same tensors. Local, not collective.
 * Errors: lowrankInvalidArgument (null pointers, ntensors <= 0, ndims out of range, a size 0, an
 * approxRank out of range, an id given twice, a total that overflows size_t); lowrankInvalidUsage
 * (a buffer without ids whose layout state these tensors cannot take, above: nothing changes;
 * lowrankBufferReset it first to start them afresh). */
lowrankResult_t lowrankBufferSetTensors(lowrankComm_t comm, const void* recvbuff, int ntensors,
                                        const lowrankTensor_t* tensors);

/* The view of a buffer, as planned at its first call. */
typedef struct {
  int planned;          /* 0 if the buffer has no plan yet (the other fields are then 0) */
  int perTensor;        /* 1: per-tensor layout, 0: batched (one matrix) */
  int ntensors;         /* tensors in the layout (1 in batched mode) */
  int ncompressed;      /* tensors compressed */
  size_t rows, cols;    /* batched mode: the matrix view n x m (rows*cols >= count) */
  size_t padded;        /* batched mode: rows*cols - count, elements of zero padding */
  int approxRank;       /* k in force for the largest compressed tensor (k clipped to min(n, m)) */
  size_t calls;         /* calls made on this buffer since its plan */
  size_t pElements;     /* float32 elements of P (all compressed tensors) per call */
  size_t qElements;     /* float32 elements of Q (all compressed tensors) per call */
  size_t exactElements; /* elements allreduced exactly (1-D and incompressible tensors) per call */
  size_t chunks;        /* P chunks per call (P by row blocks; Q likewise by column blocks): 1
                           when not pipelined (the whole buffer in one chunk), host and device
                           buffers alike; 0 when nothing is compressed */
} lowrankBufferView_t;

/* Reports the view of a buffer. A buffer never called has planned = 0 (lowrankSuccess).
 * Errors: lowrankInvalidArgument (null). */
lowrankResult_t lowrankBufferGetView(lowrankComm_t comm, const void* recvbuff,
                                     lowrankBufferView_t* view);

/* The approximation rank in force for each tensor of a buffer's plan, in layout order (one entry
 * in batched mode): its k after the compression test and the clipping to min(n, m), or 0 when the
 * tensor is allreduced exactly at this plan (1-D, declared LOWRANK_RANK_EXACT, failing the
 * compression-rate test, in its warm-up, or the buffer made exact-only). Read-only: what
 * lowrankBufferGetView sums up, per tensor. *ntensors in: the room at approxRanks (approxRanks
 * may be NULL: the count only); out: the plan's tensors (0 for a buffer without a plan, as
 * lowrankBufferGetView's planned = 0: never called, reset, or its ids taken by another buffer).
 * Errors: lowrankInvalidArgument (null comm, buffer or ntensors; *ntensors smaller than the
 * plan's tensors: *ntensors is then the number needed and nothing is written). */
lowrankResult_t lowrankBufferGetTensorRanks(lowrankComm_t comm, const void* recvbuff, int* ntensors,
                                            int* approxRanks);

/* Drops the residual and factors of a buffer (its layout stays; with ids: the state of the ids it
 * holds, and the restores staged for its declared ids); the next call starts afresh, as
 * the first call did. Local; call it on every comm rank at the same point. A buffer never called
 * is not an error. A device buffer's state is dropped once its queued work is done (the host
 * waits). Errors: lowrankInvalidArgument (null comm or buffer). */
lowrankResult_t lowrankBufferReset(lowrankComm_t comm, const void* recvbuff);

#define LOWRANK_ALTERNATE_DEFAULT (-1) /* lowrankBufferSetAlternate: the communicator's setting */
/* Chooses the schedule of one buffer: alternate 1, alternating PowerSGD (one factor allreduce per
 * call, lowrankConfig_t.alternate); 0, PowerSGD's two; LOWRANK_ALTERNATE_DEFAULT, the
 * communicator's. A change of schedule takes effect at the buffer's next call, which plans it
 * again keeping its tensors' residuals and warm-start Q; the alternation (re)starts with a P step
 * (the schedule it already has changes nothing). Every comm rank must choose the same: ranks
 * that differ fail that call on every rank (the plan check, or, for a buffer already planned on
 * the others, the transport's size check; the message names count, dtype or layout). Local, not
 * collective. Errors: lowrankInvalidArgument (null comm or buffer, another value, 1 with
 * lowrankConfig_t.warmStart 0). */
lowrankResult_t lowrankBufferSetAlternate(lowrankComm_t comm, const void* recvbuff, int alternate);

/* Frees everything held for a buffer, its layout included (call before freeing the memory if the
 * address may be reused for another tensor). With ids: the state of the ids it holds goes; restores
 * staged for its ids stay; a buffer whose ids another buffer took holds nothing, so releasing it
 * only forgets its declaration (FSDP's old outputs: release each once the next one has taken its
 * ids, or the communicator keeps a small record of every address it saw). Device buffers: as lowrankBufferReset, the host waits
 * for the buffer's queued work. Errors: lowrankInvalidArgument (null). */
lowrankResult_t lowrankBufferRelease(lowrankComm_t comm, const void* recvbuff);

/* ---- Checkpoint of a buffer's state ------------------------------------------------------------ */

/* The residual E and the warm-start Q of a buffer are training state: save them with the model and
 * the optimizer, on every comm rank (each rank's residual is its own), and restore them after a
 * restart, so that the next call goes on as if the job had never stopped. docs/checkpoint.md.
 *
 * The bytes, little-endian (format version 2; docs/checkpoint.md): a header (magic "LRSTATE\0",
 * version, seed, comm size, comm rank, whether E is held, whether the tensors are by position),
 * then per tensor its id (a buffer without ids: its position in the layout; one tensor of shape
 * (count) for a batched buffer), shape, the rank its Q was made at, its calls, whether a
 * warm-start Q is held, its residual (float32, when error feedback is on) and its Qt (float32),
 * and, alternating PowerSGD before a Q step (lowrankConfig_t.alternate), that phase and its kept P
 * (float32); and a CRC-32 (zlib's) over all that precedes it. Bytes of format version 1 (written
 * by lowrank before it wrote version 2 for every buffer) are read as well. The size is fixed once
 * the buffer is planned and its warm-up is over, except that an alternating buffer's bytes hold P
 * after every other call.
 *
 * Save: *size in: bytes available at `bytes`; out: bytes needed (bytes NULL: only that), or written.
 * A buffer restored and not yet called saves what was restored. Local, not collective; it changes
 * nothing. Device buffers: the host waits for the buffer's queued work, then copies its state to
 * host memory synchronously (no stream of the caller's is used or waited for).
 * Errors: lowrankInvalidArgument (null comm, buffer or size; *size too small: *size is then the size
 * needed and nothing is written); lowrankInvalidUsage (the buffer has no state to save: never
 * called with a compressible call on this communicator, or reset since, by lowrankBufferReset,
 * a change of count or dtype, or a call that fell back to exact on non-finite input);
 * lowrankTimeout, lowrankRemoteError or an NCCL error (device buffers: the bounded wait for the
 * state's last call failed, a dead peer or an abort): the communicator is then failed, as after a
 * call that failed so, and refuses further calls naming this failure.
 */
lowrankResult_t lowrankBufferSaveState(lowrankComm_t comm, const void* recvbuff, void* bytes,
                                       size_t* size);

/* Tensors with ids (lowrankBufferSetTensors): a buffer declared with ids saves one entry per declared id (its shape, the rank its Q was made at, its call count, its residual and
 * Q), wherever each id's state is held now; ids without state are left out, and none with any is
 * lowrankInvalidUsage. Restoring format-2 bytes stages each id's state, whatever recvbuff is
 * given: the buffer that next declares and calls the id installs it (checked across comm ranks at
 * that call, as below), so a checkpoint of one bucketing restores into another. Format-1 bytes
 * restored into a buffer declared with ids whose shapes are the saved layout are split into its
 * ids' states likewise, and so are format-2 bytes saved by a buffer without ids (by position).
 * docs/checkpoint.md, "Tensors with ids". */

/* Restores the state saved by lowrankBufferSaveState into recvbuff's record: call it on every comm
 * rank at the same point (as lowrankBufferReset), each with the bytes its own comm rank saved. The
 * buffer's current state is dropped (its layout stays) and the restored one is installed when the
 * next compressible call plans the buffer, which checks it against that call (count, dtype,
 * layout: lowrankBufferSetLayout may come before or after the restore, and keeps it pending) and
 * across comm ranks: every comm rank's restored call count and warm-start Q must agree. A restore
 * on some ranks only, or from different steps, fails that call with lowrankInvalidUsage on every
 * comm rank, and the restore stays pending until lowrankBufferReset or lowrankBufferRelease drops
 * it. (A buffer already planned is planned again at that call: a comm rank that restores it alone
 * meets its peers' compressed call with its plan check, a size no payload has, which fails the
 * communicator over UCX; over NCCL, collectives that differ across ranks are undefined.) After it,
 * calls go on from the saved one: warm-up, warm start and the initial Q's draw as in the run that
 * saved. Local, not collective. Device buffers: the state is copied to the device when the call
 * plans it, synchronously, before the call is queued. docs/checkpoint.md.
 * Errors, each leaving the buffer as it was (never half restored):
 *   lowrankInvalidArgument: null comm or buffer or bytes, bytes that are truncated, corrupt (CRC),
 *     not lowrank's, or of another format version;
 *   lowrankInvalidUsage, naming what differs: bytes saved with another comm size, comm rank,
 *     seed or error feedback (format 1: or approximation rank k; format 2 carries each tensor's
 *     k, and a tensor restored at another k goes on as after a change of k), or a layout other
 *     than the one set here (or the plan's, for a buffer already planned); and, at the next call
 *     (on every comm rank), another layout or count. */
lowrankResult_t lowrankBufferRestoreState(lowrankComm_t comm, const void* recvbuff,
                                          const void* bytes, size_t size);

/* Adds `calls` to the call count of format-1 bytes (a buffer's state saved before tensor ids), in
 * place, under a new CRC; every other byte stays as saved. For a caller that counted a warm-up of
 * its own before the library counted calls: lowrank.torch's hook of format 1 did its warm-up
 * without lowrank and saved only the calls made since, while lowrank's per-id warm-up
 * (lowrankConfig_t.startIter) counts every call; that hook's checkpoints get its warm-up's steps
 * added before they are restored. docs/checkpoint.md, "Tensors with ids". Needs no communicator;
 * thread-safe (the last error is the calling thread's: lowrankGetLastError(NULL)).
 * Errors, each leaving the bytes as they were: lowrankInvalidArgument (null bytes; bytes that are
 * truncated, corrupt, not lowrank's or of another format version, as lowrankBufferRestoreState
 * says; a count that would pass 2^62). */
lowrankResult_t lowrankStateAddCalls(void* bytes, size_t size, uint64_t calls);

/* ---- Statistics -------------------------------------------------------------------------------- */

/* Counters of one communicator since its creation, for this comm rank. Fields are only ever
 * appended; lowrankGetStats fills the whole struct of the library's header, so a program built
 * against an older header (before rankChanges, 8 bytes shorter; before exactOnlyPlans, 16) must be
 * rebuilt, and a binding
 * that mirrors the struct (python/lowrank/_capi.py) must append the field too. */
typedef struct {
  uint64_t calls;              /* lowrankAllReduce calls that succeeded */
  uint64_t compressedCalls;    /* calls that ran PowerSGD */
  uint64_t fallbackCalls;      /* compressed calls that fell back to exact (non-finite input);
                                  device buffers: counted once the device has run the call */
  uint64_t compressedElements; /* input elements that went through compression */
  uint64_t exactElements;      /* input elements allreduced exactly */
  uint64_t payloadElements;    /* elements handed to the transport: P, Q and exact parts */
  uint64_t elementsSent;       /* elements this rank put on the wire: counted by the UCX
                                  transport; over NCCL (host buffers through the NCCL transport,
                                  and device buffers: their plan checks, exact calls and factor
                                  allreduces), the ring's 2 (N - 1) / N of each call's elements
                                  (busbw's factor), not a count */
  uint64_t bytesSent;          /* bytes of elementsSent (a 16-bit factor element: 2) */
  double ratio;                /* (compressedElements + exactElements) / payloadElements: input
                                  elements per element handed to the transport; 0 before any */
  uint64_t stateBytes;         /* bytes of per-buffer state held now: per buffer, its float32
                                  residual, payload (exact part, P, checks) and Q twice (host
                                  alternating buffers: three times, docs/cuda.md "Memory"); host
                                  memory for host buffers, device memory for device ones
                                  (lowrankBufferGetMemory: every byte of one buffer, its
                                  workspaces, tables and pinned memory included) */
  uint64_t buffers;            /* buffers planned now (each holds its tensors' state, if any is
                                  compressed), and states of tensor ids no buffer holds (ids a
                                  buffer gave up, kept for the buffer that takes them next); an
                                  address whose ids moved on holds none */
  uint64_t exactOnlyPlans;     /* plans made exact-only because some comm rank could not allocate
                                  the buffer's state (counted on every comm rank; that rank logs a
                                  WARN naming the buffer and the bytes): the buffer is allreduced
                                  exactly, uncompressed, until it is planned again */
  uint64_t rankChanges;        /* tensors declared with ids whose approximation rank changed: each
                                  tensor declared again (lowrankBufferSetTensors) with another
                                  approxRank than the one its state was planned with
                                  (LOWRANK_RANK_DEFAULT read as lowrankConfig_t.approxRank,
                                  LOWRANK_RANK_EXACT as 0), counted once per tensor at the call
                                  that plans the new declaration, on every comm rank */
} lowrankStats_t;

/* Fills *stats. Errors: lowrankInvalidArgument (null). */
lowrankResult_t lowrankGetStats(lowrankComm_t comm, lowrankStats_t* stats);

/* What the communicator's transport measured and chose, as one JSON object in UTF-8 (for logs and
 * results' records; its keys may grow, none is removed). The host transport (UCX) gives
 *   {"transport": "ucx", "choice": "measured" | "given" | "forced" | "tuned",
 *    "alpha_us": A, "overhead_us": O, "beta_ns_per_byte": B,   the cost model's constants in use
 *    "probe": {"partner", "small_rtt_us", "burst_us", "large1_us", "large2_us", "seconds"},
 *                                       this comm rank's link measurement, when one was made
 *                                       (zeros on the upper rank of each pair: its partner timed)
 *    "algorithms": {"<c>": "ring" | "halving_doubling" | "recursive_doubling" | "direct", ...}}
 *                                       per size class c = floor(log2(bytes)) of the allreduces
 *                                       run so far, the last algorithm used (tuning trials aside)
 * ("measured": the links were measured when the communicator was made, docs/environment.md's
 * LOWRANK_UCX_PROBE; "given": constants from the environment or the defaults). Over NCCL:
 * {"transport": "nccl"}.
 * Writes at most `size` bytes into `json`, NUL included (snprintf's rule: truncated, still
 * terminated, when size is too small); *needed (if not NULL) = the bytes the whole object needs,
 * NUL included. json may be NULL when size is 0 (to ask for the size).
 * Errors: lowrankInvalidArgument (comm NULL, or json NULL with size > 0).
 * Thread safety: any thread, beside calls on the same communicator. */
lowrankResult_t lowrankCommGetTransportInfo(lowrankComm_t comm, char* json, size_t size,
                                            size_t* needed);

/* ---- Memory ------------------------------------------------------------------------------------ */

/* The bytes one buffer's state holds now. Size-versioned: set `size` to sizeof(lowrankMemoryInfo_t)
 * (LOWRANK_MEMORY_INFO_INITIALIZER does); the library fills the fields that fit in `size` and
 * leaves the rest, so a program built against this header keeps working with a later library,
 * which may append fields. Bytes, not elements. docs/cuda.md ("Memory") gives the formula of each
 * field in terms of each tensor's n x m view, its approximation rank k and the dtype. */
typedef struct {
  size_t size;             /* in: sizeof(lowrankMemoryInfo_t) of the caller's header */
  int planned;             /* 0: the buffer holds no state now (never called compressibly, reset,
                              exact-only, or its tensor ids taken by another buffer): every byte
                              field is 0 */
  int device;              /* 1: the state is in device memory (a device buffer), 0: host memory */
  int supplied;            /* 1: its device memory came from the allocator of
                              lowrankCommSetAllocator; 0: lowrank's own (cudaMallocAsync) */
  uint64_t residualBytes;  /* the residual E: 4 * count with error feedback, else 0 */
  uint64_t factorBytes;    /* Qt of every compressed tensor and its copy by column blocks (the
                              Q allreduce's): 2 * 4 * sum of k * m; alternating, more (the
                              exact part and checks the Q step carries; on the host the last Q
                              step's own Q): docs/cuda.md, "Memory" */
  uint64_t payloadBytes;   /* the P allreduce's payload: 4 * (exact elements + sum of n * k + 2) */
  uint64_t workspaceBytes; /* device: the orthonormalization workspaces (float64), the partial
                              sums of passes 1 and 2, cuSOLVER's, and with 16-bit factors their
                              16-bit copy on the wire; host: 0 */
  uint64_t tableBytes;     /* device: the launch tables (block, chunk and matrix descriptors and
                              their prefix sums); host: 0 */
  uint64_t pinnedBytes;    /* device: pinned host memory of the buffer (its ring of per-call
                              checks); host: 0 */
  uint64_t totalBytes;     /* the sum of the six fields above */
} lowrankMemoryInfo_t;

#define LOWRANK_MEMORY_INFO_INITIALIZER {sizeof(lowrankMemoryInfo_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/* Fills *info with the memory recvbuff's state holds now (planned 0 for a buffer never seen).
 * A device buffer's figures are those its plan allocated (they do not change from call to call).
 * Local; it waits for nothing and changes nothing.
 * Errors: lowrankInvalidArgument (null comm, buffer or info; info->size smaller than the fields
 * up to totalBytes of the first version, or not a multiple of 8).
 * Thread safety: as every call on comm (serialized by the caller). */
lowrankResult_t lowrankBufferGetMemory(lowrankComm_t comm, const void* recvbuff,
                                       lowrankMemoryInfo_t* info);

/* Device memory from the application (PyTorch's caching allocator, an arena): lowrank then takes
 * every byte of device memory of a buffer's state planned afterwards (its residual, factors,
 * payload, launch tables and workspaces) from `alloc` and gives it back through `free`, as
 * NCCL's and UCC's memory hooks. Pinned host memory and the communicator's own few bytes stay
 * lowrank's.
 *
 * alloc(&ptr, bytes, stream, userdata): bytes > 0; returns lowrankSuccess with *ptr set to device
 * memory of the communicator's device, aligned to 256 bytes, that the work queued on `stream`
 * from now on may use (stream-ordered, as cudaMallocAsync: `stream` is the cudaStream_t of the
 * lowrankAllReduce call that plans the buffer; lowrank orders its own streams after it). Any
 * other result is a failure: lowrank frees what it took for that buffer (through `free`) and the
 * call fails on every comm rank together with lowrankSystemError ("the supplied allocator
 * (lowrankCommSetAllocator) could not give N bytes..."), leaving the communicator usable and every
 * state as it was (a tensor's residual and Q stay where they were held; nothing is lost). Call
 * again once memory is free. (lowrank's own allocations instead make such a buffer exact-only,
 * counted in lowrankStats_t.exactOnlyPlans with a WARN.)
 * free(ptr, stream, userdata): ptr is no longer used once the work queued on `stream` so far has
 * run (stream-ordered, as cudaFreeAsync; PyTorch: tensor.record_stream(stream), then drop it);
 * called from lowrankBufferReset / Release / SetLayout, a call that re-plans, lowrankCommDestroy
 * and lowrankCommAbort, on the calling thread. `stream` may be destroyed by lowrank right after.
 * Both are called on the thread of a lowrank call on comm, under its serialization; neither may
 * call lowrank on comm. userdata is passed as given.
 *
 * States planned before keep the memory they have (and give it back to what allocated it: keep
 * the allocator's memory valid until lowrankCommDestroy). alloc and free both NULL: lowrank's own
 * allocation from then on. Local, not collective; every comm rank should set one alike.
 * Errors: lowrankInvalidArgument (null comm; exactly one of alloc and free NULL).
 * Thread safety: as every call on comm. */
typedef lowrankResult_t (*lowrankAllocFn_t)(void** ptr, size_t bytes, void* stream, void* userdata);
typedef void (*lowrankFreeFn_t)(void* ptr, void* stream, void* userdata);
lowrankResult_t lowrankCommSetAllocator(lowrankComm_t comm, lowrankAllocFn_t alloc,
                                        lowrankFreeFn_t free, void* userdata);

#ifdef __cplusplus
}
#endif
#endif /* LOWRANK_LOWRANK_H_ */
