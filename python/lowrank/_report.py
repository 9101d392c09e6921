"""`python -m lowrank`: what a user pastes into a bug report (as `python -m torch.utils.collect_env`
does): lowrank's version and the libraries it loaded, UCX and its transports, the CUDA backend and
driver, the NCCL lowrank would use, torch, and the LOWRANK_* variables. Each part that fails says
why in its own lines; the report never needs a GPU, NCCL or torch. The command exits 0, or 1 when
lowrank's own library could not be loaded (the report is printed all the same)."""
import ctypes
import os
import platform
import sys


def _loaded(pred):
    """Paths of the shared objects mapped in this process that pred(path) accepts, in load order."""
    seen = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                if path.startswith("/") and pred(path) and path not in seen:
                    seen.append(path)
    except OSError:
        pass
    return seen


def _lowrank(out):
    import lowrank
    from . import _capi
    out.append(f"lowrank {lowrank.__version__} (package {os.path.dirname(lowrank.__file__)})")
    lib = _capi.load()
    out.append(f"  library: {lib.lowrank_path} (version code {lowrank.library_version()})")
    try:
        info = lowrank.build_info()
    except Exception as e:  # noqa: BLE001 (the library loaded: the report goes on)
        out.append(f"  build info: failed: {e}")
        return lib
    dirty = {True: "differed from it", False: "as committed", None: "unknown"}[info["sources_dirty"]]
    out.append(f"  resolved: {info['library']}, sha256 {info['sha256']}")
    out.append(f"  built from revision {info['revision']} (library sources: {dirty}; "
               f"digest {info['sources_digest']})")
    return lib


def _ucx(out):
    """UCX's version, and its transports: a one-rank communicator initializes UCX, which then loads
    its transport modules (libuct_*.so under ucx/ beside libucs)."""
    ucp = _loaded(lambda p: os.path.basename(p).startswith("libucp.so"))
    if not ucp:
        out.append("UCX: not loaded (liblowrank did not load)")
        return
    lib = ctypes.CDLL(ucp[0])
    lib.ucp_get_version_string.restype = ctypes.c_char_p
    out.append(f"UCX {lib.ucp_get_version_string().decode()} ({ucp[0]})")
    moddir = os.path.join(os.path.dirname(os.path.realpath(ucp[0])), "ucx")
    avail = sorted(f for f in os.listdir(moddir) if f.endswith(".so")) if os.path.isdir(moddir) else []
    out.append(f"  modules in {moddir}: {', '.join(avail) if avail else 'none (folder missing or empty)'}")
    try:
        import lowrank
        comm = lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0)
        comm.destroy()
    except Exception as e:  # noqa: BLE001 (the report goes on)
        out.append(f"  a one-rank communicator failed: {e}")
    mods = [os.path.basename(p) for p in _loaded(lambda p: os.sep + "ucx" + os.sep in p)]
    out.append(f"  transports loaded: {', '.join(mods) if mods else 'none'}"
               f" (UCX_TLS={os.environ.get('UCX_TLS', 'unset')})")


def _not_built_yet(relative, folders=None):
    """"not built yet ..." where a build folder is configured with the target `relative` but has not
    built it (the CUDA backend and the shim after scripts/demo.sh), else None."""
    from . import _paths
    unbuilt = _paths.configured_not_built(relative, folders)
    if not unbuilt:
        return None
    return (f"not built yet (scripts/demo.sh builds the library and the perf binary only; "
            f"ninja -C {unbuilt[0]} {relative} builds it)")


def _cuda(out, lib):
    from . import _paths
    path = _paths.cuda_backend_for(lib.lowrank_path)
    missing = not path or not os.path.exists(path)
    # only where it is missing: why (a build folder's build.ninja is read)
    folder = [os.path.dirname(os.path.realpath(lib.lowrank_path))] if os.sep in lib.lowrank_path else []
    unbuilt = missing and _not_built_yet(_paths.BUILT_BACKEND, folder)
    if unbuilt:
        out.append(f"CUDA backend: {unbuilt}; device buffers are refused")
    elif missing:
        out.append(f"CUDA backend: absent (none beside {lib.lowrank_path}, nor in its build folder: "
                   "built where nvcc was not found or with -Dcuda=disabled, not built yet (scripts/"
                   "demo.sh builds the perf binary only), or a library copied alone; "
                   "LOWRANK_CUDA_BACKEND names one); device buffers are refused")
    else:
        backend = ctypes.CDLL(path)  # the runtime is static: this loads no CUDA library
        try:
            # a char array (not a pointer): its address is the string's
            info = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(backend, "lowrankCudaBuildInfo"))).decode()
        except ValueError:
            info = "no build info (a backend older than this package)"
        fields = dict(f.split("=", 1) for f in info.split() if "=" in f)
        code = int(fields.get("cuda", "0") or 0)
        built = f"CUDA {code // 1000}.{code % 1000 // 10}" if code else "unknown CUDA"
        out.append(f"CUDA backend: {path}")
        out.append(f"  built for {built}, GPU architectures {fields.get('arch', '?')}, "
                   f"runtime {fields.get('cudart', '?')} (needs only the driver)")
    try:
        drv = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        out.append(f"  CUDA driver: absent (libcuda.so.1: {e})")
        return
    v = ctypes.c_int()
    drv.cuDriverGetVersion(ctypes.byref(v))
    rc = drv.cuInit(0)
    n = ctypes.c_int()
    if rc == 0:
        drv.cuDeviceGetCount(ctypes.byref(n))
    why = "" if rc == 0 else f", cuInit failed with CUresult {rc} (100: no device)"
    out.append(f"  CUDA driver: {v.value // 1000}.{v.value % 1000 // 10} ({_loaded(lambda p: 'libcuda.so' in p)[:1]}),"
               f" {n.value} device(s){why}")


def _torch(out):
    try:
        import torch
    except ImportError as e:
        out.append(f"torch: absent ({e})")
        return
    import torch.distributed as dist
    backends = [name for name, check in (("gloo", "is_gloo_available"), ("nccl", "is_nccl_available"),
                                         ("mpi", "is_mpi_available"), ("ucc", "is_ucc_available"))
                if dist.is_available() and getattr(dist, check, lambda: False)()]
    out.append(f"torch {torch.__version__} ({os.path.dirname(torch.__file__)}), CUDA "
               f"{torch.version.cuda or 'none'}, distributed backends: {', '.join(backends) or 'none'}")


def _nccl(out, lib):
    if not hasattr(lib, "lowrankGetNcclLibrary"):
        out.append("NCCL: not reported (this liblowrank predates lowrankGetNcclLibrary)")
        return
    path, source, version = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int()
    rc = lib.lowrankGetNcclLibrary(ctypes.byref(path), ctypes.byref(source), ctypes.byref(version))
    if rc != 0:
        out.append(f"NCCL: absent ({lib.lowrankGetLastError(None).decode()})")
        return
    v = version.value
    ver = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else str(v)
    out.append(f"NCCL {ver}: {path.value.decode()} (found: {source.value.decode()})")


SHIM_TARGET = os.path.join("plugin", "nccl_shim", "liblowrank_nccl.so")


def _shim(out):
    from . import _paths
    shim = _paths.shim_path()
    dropin = _paths.package_file("lib", "nccl", "libnccl.so.2")
    # without a build at all, the shim's absence is not the build options' doing
    unbuilt = not shim and _not_built_yet(SHIM_TARGET)
    if shim:
        out.append(f"NCCL shim (LD_PRELOAD): {shim}")
    elif unbuilt:
        out.append(f"NCCL shim (LD_PRELOAD): {unbuilt}")
    else:
        why = "none built: see \"lowrank: failed\" above" if _paths.unbuilt_source_copy() else \
            "built where nccl.h was not found, or with -Dnccl_shim=disabled"
        out.append(f"NCCL shim (LD_PRELOAD): absent ({why})")
    if dropin:
        out.append(f"  drop-in libnccl.so.2: {dropin}")


def _section(out, name, fn, *args):
    try:
        return fn(out, *args)
    except Exception as e:  # noqa: BLE001 (a report: every part says what failed and goes on)
        out.append(f"{name}: failed: {type(e).__name__}: {e}")
        return None


def report():
    """The report's lines."""
    return report_status()[0]


def report_status():
    """(the report's lines, whether lowrank's library loaded)."""
    out = [f"Python {platform.python_version()} ({sys.executable}), {platform.platform()}"]
    lib = _section(out, "lowrank", _lowrank)
    if lib is not None:
        _section(out, "UCX", _ucx)
        _section(out, "CUDA", _cuda, lib)
    _section(out, "torch", _torch)  # before NCCL: torch's own NCCL, where it has one, is found first
    if lib is not None:
        _section(out, "NCCL", _nccl, lib)
    _section(out, "NCCL shim", _shim)
    own = _loaded(lambda p: os.path.basename(p).startswith(("liblowrank", "libnccl")))
    out.append("lowrank's and NCCL's libraries in this process:" + "".join(f"\n  {p}" for p in own))
    from . import _capi
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("LOWRANK_")
                 and not (k == "LOWRANK_NCCL_WHEEL_PATH" and _capi.nccl_wheel_path_set)
                 and not (k == "LOWRANK_CUDA_BACKEND" and _capi.cuda_backend_set))
    out.append("LOWRANK_* set: " + (", ".join(f"{k}={v}" for k, v in env) if env else "none"))
    if _capi.nccl_wheel_path_set:
        out.append("  (LOWRANK_NCCL_WHEEL_PATH: set by the package to sys.path)")
    if _capi.cuda_backend_set:
        out.append("  (LOWRANK_CUDA_BACKEND: set by the package to its build's backend)")
    return out, lib is not None
