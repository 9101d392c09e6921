"""Where lowrank's files are: the package's own copies first (a wheel or `pip install .` puts the
libraries in lowrank/lib and the perf binary in lowrank/bin), then a `meson install` (the library
folder recorded in lowrank/_install.py), then a source checkout's build*/ folders (the package used
in-tree with PYTHONPATH=python). Only paths: nothing is loaded here."""
import glob
import importlib.resources
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# The checkout this package is in (python/lowrank -> the repository), or None when installed.
_CHECKOUT = os.path.dirname(os.path.dirname(_HERE))
if not os.path.exists(os.path.join(_CHECKOUT, "meson.build")):
    _CHECKOUT = None

# Debian's package names, for the messages of a missing dependency.
UCX_PACKAGE = "libucx0"


def package_file(*parts):
    """The path of lowrank/<parts> inside the installed package, or None where it is absent.
    Through importlib.resources, so that a package imported from a zip or an editable install's
    loader is asked, not guessed."""
    try:
        res = importlib.resources.files("lowrank").joinpath(*parts)
    except (ModuleNotFoundError, TypeError, AttributeError):  # (files(): Python >= 3.9)
        path = os.path.join(_HERE, *parts)
        return path if os.path.isfile(path) else None
    if not res.is_file():
        return None
    path = os.fspath(res) if isinstance(res, os.PathLike) else str(res)
    return path if os.path.exists(path) else None


def _mtime(path):
    try:
        return os.path.getmtime(path)
    except OSError:  # removed since it was listed
        return -1.0


def checkout_builds(relative):
    """build*/<relative> of the checkout this package is in, and build*/*/<relative> (an editable
    install builds in build/cp3XY), newest first (a build being made can list a link whose target
    is not there yet: only existing files)."""
    if _CHECKOUT is None:
        return []
    found = [p for pattern in ("build*", os.path.join("build*", "*"))
             for p in glob.glob(os.path.join(_CHECKOUT, pattern, relative)) if os.path.exists(p)]
    return sorted(set(found), key=_mtime, reverse=True)


def configured_not_built(relative, folders=None):
    """The build folders (`folders`, else the checkout's build* and build*/*) whose build.ninja has
    the target `relative` while the file is not there: configured, not built yet (scripts/demo.sh
    builds the library and the perf binary only)."""
    if folders is None:
        if _CHECKOUT is None:
            return []
        folders = [os.path.dirname(p) for pattern in ("build*", os.path.join("build*", "*"))
                   for p in glob.glob(os.path.join(_CHECKOUT, pattern, "build.ninja"))]
    out = []
    for folder in folders:
        try:
            with open(os.path.join(folder, "build.ninja"), errors="replace") as f:
                configured = f"\nbuild {relative}:" in f.read()
        except OSError:
            continue
        if configured and not os.path.exists(os.path.join(folder, relative)):
            out.append(folder)
    return out


def library_candidates():
    """The liblowrank paths to try, in order (the last ones are names for the dynamic loader)."""
    paths = []
    own = package_file("lib", "liblowrank.so")
    if own:
        paths.append(own)
    try:
        from . import _install  # written by `meson install`
        paths.append(os.path.join(_install.LIBDIR, "liblowrank.so"))
    except ImportError:
        pass
    paths += checkout_builds("liblowrank.so")
    return paths + ["liblowrank.so.0", "liblowrank.so"]


def _hidden_installs():
    """Other lowrank packages on sys.path that the one imported hides (an installed copy that a
    checkout's python/ folder, the current one or on PYTHONPATH, comes before)."""
    import importlib.machinery
    mine = os.path.realpath(os.path.dirname(_HERE))
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != mine]
    spec = importlib.machinery.PathFinder.find_spec("lowrank", others)
    if spec is None or not spec.origin:
        return []
    return [os.path.dirname(spec.origin)]


def unbuilt_source_copy():
    """Where the package imported is the source copy of a checkout (python/lowrank) with no
    library of its own and no build in its checkout: a sentence that says so and how to use a
    built copy instead, else None. What a missing library or shim is then due to: not the
    build's options (nothing was built here), but the copy imported."""
    if _CHECKOUT is None or package_file("lib", "liblowrank.so") or checkout_builds("liblowrank.so"):
        return None
    hidden = _hidden_installs()
    also = (f"; it hides the installed lowrank in {hidden[0]} (Python imports from the current "
            "folder and PYTHONPATH first)") if hidden else ""
    return (f"the lowrank package imported is the source copy in the checkout {_CHECKOUT} "
            f"({_HERE}), which holds no library, and that checkout has no build (no "
            f"build*/liblowrank.so){also}. To use the package `pip install .` installed, run "
            "from outside the checkout's python/ folder, without PYTHONPATH=python; to use this "
            "copy, build the checkout first (scripts/build.sh), then PYTHONPATH=python, or set "
            "LOWRANK_LIBRARY to a built liblowrank.so")


def beside(library, name):
    """The file `name` in the folder of the loaded `library` (the CUDA backend and the shim sit
    beside liblowrank in every layout), or None where it is not there."""
    if os.sep not in library:
        return None
    path = os.path.join(os.path.dirname(os.path.realpath(library)), name)
    return path if os.path.exists(path) else None


# Where a build folder has the CUDA backend (meson's layout of plugin/cuda_backend).
BUILT_BACKEND = os.path.join("plugin", "cuda_backend", "liblowrank_cuda.so")


def build_backend(library):
    """The CUDA backend of the build folder `library` sits in (plugin/cuda_backend/: an in-tree or
    editable build, where liblowrank does not find it by itself), or None."""
    if os.sep not in library:
        return None
    built = os.path.join(os.path.dirname(os.path.realpath(library)), BUILT_BACKEND)
    return built if os.path.exists(built) else None


def cuda_backend_for(library):
    """The CUDA backend that goes with the loaded `library`: LOWRANK_CUDA_BACKEND, else the one
    beside it (where liblowrank looks by itself: a wheel, `meson install`), else its build
    folder's; None where none is."""
    return (os.environ.get("LOWRANK_CUDA_BACKEND") or beside(library, "liblowrank_cuda.so")
            or build_backend(library))


def candidates_to_load():
    """(the liblowrank paths the package tries, in order; whether LOWRANK_LIBRARY decided them):
    LOWRANK_LIBRARY, a file or the folder holding liblowrank.so, else library_candidates()."""
    env = os.environ.get("LOWRANK_LIBRARY", "")
    if env:
        return [os.path.join(env, "liblowrank.so") if os.path.isdir(env) else env], True
    return library_candidates(), False


def library_to_load():
    """The liblowrank the package loads (the first of candidates_to_load() that is a file), found
    without loading it; None where no candidate is a file."""
    return next((p for p in candidates_to_load()[0] if os.sep in p and os.path.exists(p)), None)


def of_library(relative):
    """build-folder file `relative` that goes with the library the package loads: in that
    library's folder (a build's: the same build, so a checkout with several build*/ folders gives
    the shim or perf binary of the library in use, not the newest one built), else the newest
    checkout build's; None where neither has it."""
    lib = library_to_load()
    if lib:
        folder = os.path.dirname(os.path.realpath(lib))
        for path in (os.path.join(folder, relative), os.path.join(folder, os.path.basename(relative))):
            if os.path.exists(path):
                return path
    built = checkout_builds(relative)
    return built[0] if built else None


def shim_path():
    """liblowrank_nccl.so, the LD_PRELOAD shim: the package's own, else the build's of the library
    loaded (of_library)."""
    own = package_file("lib", "liblowrank_nccl.so")
    return own or of_library(os.path.join("plugin", "nccl_shim", "liblowrank_nccl.so"))


def perf_binary():
    """lowrank_allreduce_perf: the package's own, else the build's of the library loaded
    (of_library); None where neither."""
    own = package_file("bin", "lowrank_allreduce_perf")
    return own or of_library(os.path.join("perf", "lowrank_allreduce_perf"))


def nccl_wheel_path():
    """The value LOWRANK_NCCL_WHEEL_PATH takes when the user has not set it: sys.path's folders,
    where pip puts NVIDIA's NCCL wheel (nvidia/nccl/lib/libnccl.so.2) as torch's wheels do."""
    return os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
