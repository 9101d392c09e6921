#!/usr/bin/env python3
"""Checks the layers of docs/design.md ("Layers") where Meson cannot.

Each layer's library sees only the include roots of the layers it may use (plugin/layers/), so an
include such as "engine/plan.h" in the transport does not compile. Two ways round that remain, and
this script refuses both:
  - a relative include ("../engine/plan.h", or "cuda/x.h" found beside the including file) that
    reaches another layer's file;
  - a meson.build of one layer that compiles another layer's source (a second copy of a common
    part in a second library), or that gives a library the tests' wide include root `inc`.
It also holds every quoted include to the layer graph below, so a new root given by mistake in a
meson.build is caught too.

Usage: check_layers.py [SOURCE_ROOT]   (default: the repository holding this script)
Prints one line per violation ("FILE:LINE: ...") and exits 1 if there is any; else prints a summary
and exits 0.
"""
import os
import re
import sys

# Layer -> its folders (relative to the root). A file belongs to the layer of its longest prefix.
LAYERS = {
    "common": ["plugin/util"],
    "platform": ["plugin/platform"],
    "kernels": ["kernels/host"],
    "transport": ["plugin/transport"],
    "engine": ["plugin/engine"],
    "api": ["plugin/api"],
    "abi": ["plugin/abi"],
    "shim": ["plugin/nccl_shim"],
    "cuda_backend": ["plugin/engine/cuda"],
    "cuda_kernels": ["kernels/cuda"],
    "public": ["include"],
}

# The include namespaces (the path prefix of a quoted include) each layer may use. "lowrank/" is the
# public API, open to all. The shim and the CUDA side see the common layer's header-only parts
# (inline dtype sizes and conversions) and nothing compiled there: liblowrank hides it, and they
# reach the rest through its services table (plugin/abi/services.h).
COMMON_HEADERS_ONLY = ["util/dtype.h", "util/convert.h", "util/c_enum.h"]
MAY_INCLUDE = {
    "common": ["util/"],
    "platform": ["util/", "platform/", "abi/"],
    "kernels": ["util/", "kernels/host/"],
    "transport": ["util/", "platform/", "transport/"],
    "engine": ["util/", "platform/", "abi/", "kernels/host/", "transport/", "engine/"],
    "api": ["util/", "engine/", "api/"],
    "abi": ["abi/"],
    "shim": ["abi/", "nccl_shim/"] + COMMON_HEADERS_ONLY,
    "cuda_backend": ["abi/", "engine/cuda/", "kernels/cuda/"] + COMMON_HEADERS_ONLY,
    "cuda_kernels": ["kernels/cuda/"] + COMMON_HEADERS_ONLY,
    "public": ["lowrank/"],
}
# A namespace prefix -> the layer whose files it names (engine/cuda/ before engine/).
NAMESPACES = [
    ("engine/cuda/", "cuda_backend"), ("kernels/cuda/", "cuda_kernels"),
    ("kernels/host/", "kernels"), ("util/", "common"), ("platform/", "platform"),
    ("transport/", "transport"), ("engine/", "engine"), ("api/", "api"), ("abi/", "abi"),
    ("nccl_shim/", "shim"), ("lowrank/", "public"),
]
SOURCE_EXT = (".cc", ".h", ".cu", ".cuh", ".c", ".S")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
MESON_FILE = re.compile(r"'([^']+\.(?:cc|cu|c|S))'")


def layer_of(rel):
    best, best_len = None, -1
    for layer, dirs in LAYERS.items():
        for d in dirs:
            if (rel == d or rel.startswith(d + "/")) and len(d) > best_len:
                best, best_len = layer, len(d)
    return best


def sources(root):
    for top in ("plugin", "kernels", "include"):
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            rel_dir = os.path.relpath(dirpath, root)
            if rel_dir.startswith("plugin/layers"):  # the include roots: links, not sources
                dirnames[:] = []
                continue
            for f in sorted(files):
                if f.endswith(SOURCE_EXT) or f == "meson.build":
                    yield os.path.join(rel_dir, f)


def check_include(root, rel, lineno, inc, layer, out):
    here = os.path.dirname(rel)
    beside = os.path.normpath(os.path.join(here, inc))
    if ".." in inc.split("/") or ("/" not in inc and os.path.exists(os.path.join(root, beside))):
        target = layer_of(beside)
        if ".." in inc.split("/"):
            if target != layer:
                out.append(f'{rel}:{lineno}: #include "{inc}" is a relative include that crosses '
                           f'from layer {layer} into layer {target} ({beside}); {layer} may include: '
                           f'{", ".join(MAY_INCLUDE[layer])}')
            else:
                out.append(f'{rel}:{lineno}: #include "{inc}" is a relative include; name it from '
                           f"its layer's root instead (e.g. \"{beside.split('/', 1)[1]}\")")
        return  # a file beside the includer: the same layer
    if "/" not in inc:
        return  # a generated or system header on the include path (e.g. nccl.h)
    for prefix, target in NAMESPACES:
        if inc.startswith(prefix):
            allowed = MAY_INCLUDE[layer] + ["lowrank/"]
            if not any(inc == a or (a.endswith("/") and inc.startswith(a)) for a in allowed):
                out.append(f'{rel}:{lineno}: #include "{inc}": layer {layer} may not use layer '
                           f'{target}; {layer} may include: {", ".join(MAY_INCLUDE[layer])}')
            # a relative lookup beside the includer would win over the root: refuse it too
            elif os.path.exists(os.path.join(root, beside)) and layer_of(beside) != target:
                out.append(f'{rel}:{lineno}: #include "{inc}" resolves beside the includer '
                           f"({beside}), in layer {layer_of(beside)}, not in layer {target}")
            return
    # An unknown namespace that resolves beside the includer reaches into a subfolder: the same
    # layer, unless that subfolder is another layer's.
    if os.path.exists(os.path.join(root, beside)) and layer_of(beside) != layer:
        out.append(f'{rel}:{lineno}: #include "{inc}" reaches layer {layer_of(beside)} ({beside}) '
                   f"by a path relative to the includer")


def check_meson(root, rel, layer, out):
    here = os.path.dirname(rel)
    text = open(os.path.join(root, rel), encoding="utf-8").read()
    for lineno, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for name in MESON_FILE.findall(code):
            path = os.path.normpath(os.path.join(here, name))
            target = layer_of(path)
            if target is not None and target != layer:
                out.append(f"{rel}:{lineno}: '{name}' compiles {path}, a source of layer {target}, "
                           f"into layer {layer}'s library (link layer {target}'s library instead)")
        if re.search(r"include_directories\s*:\s*\[?\s*inc\b", code):
            out.append(f"{rel}:{lineno}: a library of layer {layer} is given the tests' wide include "
                       f"root `inc`; use the roots of the layers it may use (plugin/layers/)")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    out, files = [], 0
    for rel in sources(root):
        layer = layer_of(rel)
        if layer is None:
            continue
        files += 1
        if rel.endswith("meson.build"):
            check_meson(root, rel, layer, out)
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if m:
                    check_include(root, rel, lineno, m.group(1), layer, out)
    for line in out:
        print(line)
    if out:
        print(f"check_layers: {len(out)} violation(s) of the layers (docs/design.md, \"Layers\")")
        return 1
    print(f"check_layers: {files} files of {len(LAYERS)} layers, every include and compiled source "
          f"within the allowed layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
