"""lowrank.build_info(): which native library this process runs, and what it was built from, for
the provenance of a result (the library's file and revision pin what the Python alone cannot)."""
import ctypes
import hashlib
import os

from . import _capi
from .errors import LowrankError

_UNKNOWN = "unknown"


def _mappings():
    """(start, end, path, device, inode) of every file mapped in this process."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            major, minor = (int(x, 16) for x in parts[3].split(":"))
            yield start, end, parts[5].strip(), os.makedev(major, minor), int(parts[4])


def _loaded_file(path, device, inode):
    """The resolved path of a mapped file; LowrankError if that path now holds another file."""
    path = path.removesuffix(" (deleted)")  # the kernel's mark of a file unlinked since
    try:
        st = os.stat(path)
        same = (st.st_dev, st.st_ino) == (device, inode)
    except OSError:
        same = False
    if not same:
        raise LowrankError(2, f"{path} is not the file this process loaded (rebuilt, replaced or "
                           "removed since): its sha256 would not be the loaded library's; ask in a "
                           "fresh process", "build_info")
    return os.path.realpath(path)


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_info():
    """What the loaded liblowrank is and what it was built from, as a dict (JSON-ready):

    - library: the resolved path (symlinks followed) of the liblowrank mapped in this process (the
      file its code was loaded from, however it was found);
    - sha256: hex sha256 of that file;
    - revision: the git commit (40 hex digits) its source tree had checked out at build time, or
      "unknown" (a tree that was not a git checkout, or a library older than lowrankGetBuildInfo);
    - sources_dirty: True when its sources (plugin/, kernels/, include/, the Meson files) differed
      from that commit's, False when not, None when unknown;
    - sources_digest: sha256 hex of those sources (scripts/source_revision.py; the same for the
      same sources whatever the commit), or "unknown" for an older library;
    - version: the library's lowrankGetVersion as "major.minor.patch"; package_version: this Python
      package's lowrank.__version__ (the two differ when a library of another release is loaded);
    - plugins: [{library, sha256}] of the CUDA backend (liblowrank_cuda.so, loaded at the first
      device buffer) and the NCCL shim (liblowrank_nccl.so) where this process has loaded them,
      by resolved path; [] when neither is loaded.

    Loads the library if needed (LibraryNotFoundError if none). Raises LowrankError if the file at
    the path of liblowrank or of a plugin is no longer the one loaded (rebuilt or replaced since):
    its hash would not be the loaded code's. Thread safety: any thread."""
    import lowrank
    lib = _capi.load()
    version = ctypes.c_int()
    lib.lowrankGetVersion(ctypes.byref(version))
    code = version.value
    address = ctypes.cast(lib.lowrankGetVersion, ctypes.c_void_p).value
    mapped = list(_mappings())
    own = [m[2:] for m in mapped if m[0] <= address < m[1]]
    path = _loaded_file(*own[0]) if own else os.path.realpath(lib.lowrank_path)
    plugins = {}
    for _, _, name, device, inode in mapped:
        if os.path.basename(name).startswith(("liblowrank_cuda.so", "liblowrank_nccl.so")) and \
                name not in plugins:
            plugins[name] = _loaded_file(name, device, inode)
    info = {"library": path, "sha256": _sha256(path), "revision": _UNKNOWN, "sources_dirty": None,
            "sources_digest": _UNKNOWN,
            "version": f"{code // 10000}.{code // 100 % 100}.{code % 100}",
            "package_version": lowrank.__version__,
            "plugins": [{"library": p, "sha256": _sha256(p)} for p in sorted(plugins.values())]}
    if hasattr(lib, "lowrankGetBuildInfo"):
        revision, dirty, digest = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_char_p()
        lib.lowrankGetBuildInfo(ctypes.byref(revision), ctypes.byref(dirty), ctypes.byref(digest))
        info.update(revision=revision.value.decode(), sources_digest=digest.value.decode(),
                    sources_dirty=None if dirty.value < 0 else bool(dirty.value))
    return info
