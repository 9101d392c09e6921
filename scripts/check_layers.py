#!/usr/bin/env python3
"""Checks the layers of docs/design.md ("Layers") where Meson cannot.

Each layer's library sees only the include roots of the layers it may use (plugin/layers/), so an
include such as "engine/plan.h" in the transport does not compile. Two ways round that remain, and
this script refuses both:
  - a relative include ("../engine/plan.h", <../engine/plan.h>, "transport/../engine/plan.h", or
    "cuda/x.h" found beside the including file) that reaches another layer's file; an include by
    macro, which cannot be checked;
  - a meson.build of one layer that names another layer's source (as a literal, built with +, / or
    join_paths, or through the other layer's variable of files()), a second copy of a common part
    in a second library; or that gives a library the tests' wide include root `inc`.
It also holds every include of lowrank's headers to the layer graph below (a quoted include must
name an allowed layer's root, or a file beside the includer), so a new root given by mistake in a
meson.build is caught too. And nothing but plugin/util/env.cc's table reads the environment
(getenv, secure_getenv, environ). Directives are read as the preprocessor reads them: continued
lines joined, block comments before the '#' skipped.

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
    "cuda_backend": ["plugin/cuda_backend"],
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
    "cuda_backend": ["abi/", "cuda_backend/", "kernels/cuda/"] + COMMON_HEADERS_ONLY,
    "cuda_kernels": ["kernels/cuda/"] + COMMON_HEADERS_ONLY,
    "public": ["lowrank/"],
}
# A namespace prefix -> the layer whose files it names (kernels/cuda/ before kernels/).
NAMESPACES = [
    ("cuda_backend/", "cuda_backend"), ("kernels/cuda/", "cuda_kernels"),
    ("kernels/host/", "kernels"), ("util/", "common"), ("platform/", "platform"),
    ("transport/", "transport"), ("engine/", "engine"), ("api/", "api"), ("abi/", "abi"),
    ("nccl_shim/", "shim"), ("lowrank/", "public"),
]
SOURCE_EXT = (".cc", ".cpp", ".cxx", ".c", ".h", ".hh", ".hpp", ".inl", ".ipp", ".cu", ".cuh", ".S")
# A directive: leading blanks and block comments allowed, as the preprocessor allows them.
DIRECTIVE = re.compile(r'^\s*(?:/\*.*?\*/\s*)*#\s*include\b(.*)$')
TARGET = re.compile(r'^\s*(?:"([^"]+)"|<([^>]+)>)')
MESON_FILE = re.compile(r"'([^']+)'")
ENV_READ = re.compile(r"\b(?:secure_getenv|getenv|environ)\b")
# The readers of the environment: the table, and the cuSOLVER loader of the CUDA kernels, whose
# layer sees no compiled common part (LOWRANK_CUSOLVER_LIBRARY is in the table all the same).
ENV_READERS = ("plugin/util/env.cc", "kernels/cuda/dense_qr.cc")


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


def logical_lines(path):
    """(line number, line) with backslash-continued lines joined, as the preprocessor sees them."""
    with open(path, encoding="utf-8", errors="replace") as f:
        pending, first = "", 0
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not pending:
                first = lineno
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            yield first, pending + line
            pending = ""
        if pending:
            yield first, pending


def check_include(root, rel, lineno, inc, layer, out):
    here = os.path.dirname(rel)
    beside = os.path.normpath(os.path.join(here, inc))
    if ".." in inc.split("/") and not inc.startswith(".."):
        # "transport/../engine/x.h": through a layer's root into another
        norm = os.path.normpath(inc)
        target = next((t for n, t in NAMESPACES if norm.startswith(n)), None)
        if target != layer:
            out.append(f'{rel}:{lineno}: #include "{inc}" crosses from layer {layer} into '
                       f'{"layer " + target if target else "no layer"} ({norm}) through "..": '
                       f'{layer} may include: {", ".join(MAY_INCLUDE[layer])}')
        else:
            out.append(f'{rel}:{lineno}: #include "{inc}" has a ".."; name it "{norm}"')
        return
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
    # Not a layer's root: only a file beside the includer, in its own layer, may be named so.
    if os.path.exists(os.path.join(root, beside)):
        if layer_of(beside) != layer:
            out.append(f'{rel}:{lineno}: #include "{inc}" reaches layer {layer_of(beside)} '
                       f"({beside}) by a path relative to the includer")
        return
    out.append(f'{rel}:{lineno}: #include "{inc}" names no layer\'s root; {layer} may include: '
               f'{", ".join(MAY_INCLUDE[layer])}')


def fold_strings(code):
    """Folds the string expressions Meson can build a path with into one literal:
    'a' + 'b', 'a' / 'b' and join_paths('a', 'b', ...)."""
    lit = r"'[^']*'"
    prev = None
    while prev != code:
        prev = code
        code = re.sub(r"join_paths\(\s*(" + lit + r"(?:\s*,\s*" + lit + r")*)\s*\)",
                      lambda m: "'" + "/".join(x[1:-1] for x in re.findall(lit, m.group(1))) + "'",
                      code)
        code = re.sub(r"(" + lit + r")\s*([+/])\s*(" + lit + r")",
                      lambda m: "'" + m.group(1)[1:-1] + ("/" if m.group(2) == "/" else "") +
                      m.group(3)[1:-1] + "'", code)
    return code


def meson_code(root, rel):
    text = open(os.path.join(root, rel), encoding="utf-8").read()
    return "\n".join(l.split("#", 1)[0] for l in text.splitlines())  # no comments


SOURCE_VAR = re.compile(r"^\s*(\w+)\s*\+?=\s*files\(", re.M)


def check_meson(root, rel, layer, out, source_vars):
    here = os.path.dirname(rel)
    code = fold_strings(meson_code(root, rel))
    for lineno, line in enumerate(code.splitlines(), 1):
        for name in MESON_FILE.findall(line):
            if ".." not in name.split("/"):
                continue
            path = os.path.normpath(os.path.join(here, name))
            target = layer_of(path)
            if target is not None and target != layer and not path.startswith("plugin/layers"):
                out.append(f"{rel}:{lineno}: '{name}' names {path}, of layer {target}, in a "
                           f"meson.build of layer {layer} (link layer {target}'s library instead)")
        if re.search(r"\binc\b", line):
            out.append(f"{rel}:{lineno}: a library of layer {layer} is given the tests' wide include "
                       f"root `inc`; use the roots of the layers it may use (plugin/layers/)")
        for var, owner in source_vars.items():
            if owner != layer and re.search(r"\b" + re.escape(var) + r"\b", line):
                out.append(f"{rel}:{lineno}: {var} (sources of layer {owner}) is used in a "
                           f"meson.build of layer {layer}")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    out, files = [], 0
    all_files = [(rel, layer_of(rel)) for rel in sources(root)]
    source_vars = {}  # a variable of files() -> the layer whose meson.build defines it
    for rel, layer in all_files:
        if layer is not None and rel.endswith("meson.build"):
            for var in SOURCE_VAR.findall(meson_code(root, rel)):
                source_vars.setdefault(var, layer)
    for rel, layer in all_files:
        if layer is None:
            continue
        files += 1
        if rel.endswith("meson.build"):
            check_meson(root, rel, layer, out, source_vars)
            continue
        for lineno, line in logical_lines(os.path.join(root, rel)):
            code = line.split("//", 1)[0]
            if rel not in ENV_READERS and ENV_READ.search(code) and not code.lstrip().startswith("*"):
                out.append(f"{rel}:{lineno}: reads the environment; read it through "
                           f"plugin/util/env.cc's table (env::get, lowrankServices_t.env)")
            d = DIRECTIVE.match(line)
            if not d:
                continue
            t = TARGET.match(d.group(1))
            if not t:
                out.append(f"{rel}:{lineno}: an #include whose file is a macro cannot be checked; "
                           f"name the header")
            elif t.group(1):
                check_include(root, rel, lineno, t.group(1), layer, out)
            elif ".." in t.group(2).split("/") or any(t.group(2).startswith(n) for n, _ in NAMESPACES):
                # <...> of lowrank's own headers: Meson's automatic -I of the source folder makes
                # <../engine/plan.h> as good as "../engine/plan.h"
                check_include(root, rel, lineno, t.group(2), layer, out)
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
