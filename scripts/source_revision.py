#!/usr/bin/env python3
"""The revision liblowrank is built from, for lowrankGetBuildInfo (plugin/api/build_info.cc).

The library's sources are every file under plugin/, kernels/ and include/ and every Meson file
(meson.build, meson_options.txt) at any depth: what a result's provenance must pin (issue 38). Their
digest is the sha256 of the sorted lines "<git mode> <git blob id> <path>\n", one per file, so that
it is the same whether computed from a working tree (no git needed) or from a commit (`--digest REV`,
from git's objects alone): a report can tell whether a library built at one revision has the sources
of another, even when the tree it was built from was dirty.

  source_revision.py --output FILE    writes the C source of the build info (the build runs it at
                                      every ninja; FILE is rewritten only when its text changes, so
                                      a new commit recompiles this one file and relinks liblowrank)
  source_revision.py --digest REV     prints the sources digest of a commit (git needed)
  source_revision.py --dist           (meson dist) records the revision in the sdist (DIST_FILE)
  source_revision.py                  prints revision, sources_dirty and sources_digest

Where the source root is not a git checkout of its own (an sdist, a copied tree), the revision is
the one DIST_FILE recorded, else "unknown"; sources_dirty is then 1 when the sources' digest differs
from the recorded one, -1 when nothing was recorded.
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys

SOURCE_DIRS = ("plugin/", "kernels/", "include/")
MESON_FILES = ("meson.build", "meson_options.txt")
DIST_FILE = ".lowrank_revision"  # in an sdist's root: "revision <hex>" and "sources_digest <hex>"
UNKNOWN = "unknown"


def is_library_source(path):
    """Whether a path (relative, '/'-separated) is one of the library's sources."""
    return path.startswith(SOURCE_DIRS) or path.rsplit("/", 1)[-1] in MESON_FILES


def digest(entries):
    """sha256 hex of (mode, blob id, path) entries of the library's sources, in path order."""
    h = hashlib.sha256()
    for mode, blob, path in sorted(e for e in entries if is_library_source(e[2])):
        h.update(f"{mode} {blob} {path}\n".encode())
    return h.hexdigest()


def _blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def worktree_entry(root, path):
    """(git mode, git blob id, path) of a file as it is on disk, or None if it is not there."""
    full = os.path.join(root, path)
    if os.path.islink(full):
        return "120000", _blob_id(os.fsencode(os.readlink(full))), path
    if not os.path.isfile(full):
        return None  # tracked but deleted
    with open(full, "rb") as f:
        data = f.read()
    return ("100755" if os.stat(full).st_mode & 0o100 else "100644"), _blob_id(data), path


def _git(root, *args):
    return subprocess.run(["git", "--no-optional-locks", "-C", root, *args], check=True,
                          capture_output=True).stdout


def own_checkout(root):
    """Whether root is the top of a git work tree (not a tree copied into someone else's)."""
    try:
        top = _git(root, "rev-parse", "--show-toplevel").decode().strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return os.path.realpath(top) == os.path.realpath(root)


def _walk(root):
    """Every file below root as a '/'-path, skipping hidden folders, __pycache__ and the top's
    build*/ (Meson build folders: .gitignore's, which there is no git to read)."""
    for parent, dirs, files in os.walk(root):
        rel = os.path.relpath(parent, root)
        keep = []
        for d in dirs:
            if os.path.islink(os.path.join(parent, d)):
                files.append(d)  # a link to a folder is a file to git
            elif not (d.startswith(".") or d == "__pycache__" or
                      (rel == "." and d.startswith("build"))):
                keep.append(d)
        dirs[:] = keep
        for name in files:
            yield name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")


def worktree_digest(root, git):
    """Digest of the sources on disk: git's tracked and untracked, not ignored, files; else all."""
    if git:
        paths = _git(root, "ls-files", "-z", "-co", "--exclude-standard").decode().split("\0")
    else:
        paths = _walk(root)
    entries = (worktree_entry(root, p) for p in paths if p and is_library_source(p))
    return digest(e for e in entries if e)


def commit_digest(root, rev):
    """Digest of the sources of a commit, from git's objects."""
    out = _git(root, "ls-tree", "-r", "-z", "--full-tree", rev).decode()
    entries = []
    for line in filter(None, out.split("\0")):
        meta, path = line.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob":
            entries.append((mode, blob, path))
    return digest(entries)


def read_dist_file(root):
    """(revision, sources digest) recorded in an sdist, each None where absent or malformed."""
    try:
        with open(os.path.join(root, DIST_FILE)) as f:
            fields = dict(line.split(None, 1) for line in f.read().split("\n") if " " in line)
    except OSError:
        fields = {}
    revision, digest = fields.get("revision", "").strip(), fields.get("sources_digest", "").strip()
    return (revision if re.fullmatch(r"[0-9a-f]{40}", revision) else None,
            digest if re.fullmatch(r"[0-9a-f]{64}", digest) else None)


def build_info(root):
    """{revision, sources_dirty (1, 0, or -1 unknown), sources_digest} of the tree at root."""
    git = own_checkout(root)
    current = worktree_digest(root, git)
    if git:
        try:
            revision = _git(root, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
            recorded = commit_digest(root, revision)
        except subprocess.CalledProcessError:  # a repository with no commit yet
            revision, recorded = UNKNOWN, None
    else:
        revision, recorded = read_dist_file(root)
        revision = revision or UNKNOWN
    dirty = -1 if recorded is None else int(recorded != current)
    return {"revision": revision, "sources_dirty": dirty, "sources_digest": current}


def c_source(info):
    return ("/* Written by scripts/source_revision.py at build time: do not edit. */\n"
            "#define HIDDEN __attribute__((visibility(\"hidden\")))\n"
            f"HIDDEN const char lowrankBuildRevision[] = \"{info['revision']}\";\n"
            f"HIDDEN const int lowrankBuildSourcesDirty = {info['sources_dirty']};\n"
            f"HIDDEN const char lowrankBuildSourcesDigest[] = \"{info['sources_digest']}\";\n")


def write_if_changed(path, text):
    try:
        with open(path) as f:
            if f.read() == text:
                return  # unchanged mtime: ninja (restat) rebuilds nothing after it
    except OSError:
        pass
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--output", help="write the C source of the build info here")
    group.add_argument("--digest", metavar="REV", help="print the sources digest of a commit")
    group.add_argument("--dist", action="store_true",
                       help="write DIST_FILE into $MESON_DIST_ROOT (a meson dist script)")
    args = ap.parse_args()
    root = args.source_root
    if args.digest:
        print(commit_digest(root, args.digest))
    elif args.dist:
        # meson dist archives HEAD, and refuses a dirty tree unless told: the sdist's sources are
        # HEAD's, so its digest is HEAD's.
        src = os.environ["MESON_PROJECT_SOURCE_ROOT"]
        revision = _git(src, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
        with open(os.path.join(os.environ["MESON_PROJECT_DIST_ROOT"], DIST_FILE), "w") as f:
            f.write(f"revision {revision}\nsources_digest {commit_digest(src, revision)}\n")
    else:
        info = build_info(root)
        if args.output:
            write_if_changed(args.output, c_source(info))
        else:
            for key, value in info.items():
                print(key, value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
