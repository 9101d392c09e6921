"""Provenance of the studies' results (issue 38): what every result JSON records of the code and
the library that made it, the check a report makes before it uses a run, and whether a study may
start at all.

The record (start() at the beginning of a run, finish() at its end; every writer of a result JSON
stores it as the JSON's "provenance"):
  revision       the checkout's commit (40 hex digits) when the run started, or "unknown"
  describe       `git describe --always --dirty` (the same string as the training JSON's machine.git)
  dirty          True when tracked files differed from that commit (None: git could not tell)
  library        lowrank.build_info() of the liblowrank this process loaded (resolved path, sha256,
                 the revision and sources digest it was built from, versions, loaded plugins); for a
                 perf binary's run, of the library that binary loads (binary_library()); None when
                 none could be loaded, with library_error saying why
  python, torch, lowrank   the versions (torch None where not imported; lowrank the package's,
                 or for a binary's run where the package is not imported, the library's)
  started_utc, ended_utc   ISO 8601 in UTC, to the second
A training worker makes the record in its own process, so the library is the one it ran.

The rule (check_run(), which every report calls on each run it loads): a run is refused unless its
library was built from the run's own sources: the library's sources digest (plugin/, kernels/,
include/ and the Meson files: scripts/source_revision.py) equals that of the run's revision
(`scripts/source_revision.py --digest REV`). A run without the record, or whose library is
unknown, is refused too, unless the study's plan.toml lets it through with a reason:
  [[provenance.allow]]
  runs = "studies/x/results/*.json"    # a glob, or a list of globs
  reason = "why these runs are evidence all the same"
The globs match the run file's path relative to the checkout's root (`*` crosses `/`); the first
entry that matches lets the run through, and its reason is printed (stderr, once per process). A
glob covers later runs in the same place too: name the files as narrowly as the evidence allows.

Whether a study may start: its results must name a committed revision, so the drivers refuse to
start on a tree with uncommitted changes (unclean(), refuse_unless_ready()) rather than spend an
hour on runs that no report will use.
"""
import datetime
import fnmatch
import functools
import json
import os
import platform
import subprocess
import sys

from studies.lib.launch import ROOT

_HERE = os.path.dirname(os.path.abspath(__file__))
UNKNOWN = "unknown"


class ProvenanceError(SystemExit):
    """A run that a report must not use, with the file and the reason in the message (a SystemExit:
    a report's command line ends with the message, exit status 1, no traceback)."""


def unclean(root):
    """None when the tree at `root` has no uncommitted changes to tracked files; else why not, in
    words: the changed files, or git's own error (a revision that cannot be read is no better than
    a dirty one)."""
    try:
        r = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"git could not run ({e})"
    if r.returncode != 0:
        return f"git failed: {r.stderr.strip() or r.returncode}"
    changed = r.stdout.strip()
    return f"uncommitted changes: {' '.join(changed.split()[:8])}" if changed else None


def dirty(root):
    """True when unclean(root) has a reason."""
    return unclean(root) is not None


def refuse_unless_ready(script, root, python, need_root):
    """A study's checks before it sets anything up, each failing with the reason: the tree clean
    (unclean()), root where network namespaces are needed, and the workers' Python able to import
    torch (a wrong --python would otherwise fail only after the namespaces and the wait for a quiet
    machine)."""
    import os
    why = unclean(root)
    if why:
        raise SystemExit(f"{script}: {why}; commit first (each run's JSON names its revision)")
    if need_root and os.geteuid() != 0:
        raise SystemExit(f"{script}: needs root (network namespaces, tc, nice -20): run it with sudo")
    try:
        r = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemExit(f"{script}: --python {python} cannot run: {e}")
    if r.returncode != 0:
        raise SystemExit(f"{script}: --python {python} cannot import torch: "
                         f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")


def revision():
    """The revision of the code that makes the report: `git describe`, "-dirty" when a tracked file
    outside the studies' results and docs/img differs (results and figures a report writes do not make the
    next report's code dirty)."""
    try:
        run = dict(capture_output=True, text=True, timeout=10)
        rev = subprocess.run(["git", "-C", _HERE, "describe", "--always"], **run).stdout.strip()
        st = subprocess.run(["git", "-C", _HERE, "status", "--porcelain", "--untracked-files=no",
                             "--", ":/", ":(exclude,top,glob)studies/*/results/**", ":(exclude,top)docs/img"], **run)
        if not rev or st.returncode:
            return "unknown"
        return rev + ("-dirty" if st.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---- the record ------------------------------------------------------------------------------------
def utc_now():
    """The time now as ISO 8601 in UTC, to the second ("2025-01-31T12:00:00+00:00")."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _git(root, *args):
    """git's output, stripped, or None when git cannot answer."""
    try:
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def describe(root=ROOT):
    """`git describe --always --dirty` of the checkout at root ("" when git cannot tell)."""
    return _git(root, "describe", "--always", "--dirty") or ""


def _this_library():
    """(build_info of the liblowrank this process has loaded, loading it if needed; None) or
    (None, why not)."""
    try:
        import lowrank
        return lowrank.build_info(), None
    except Exception as e:  # noqa: BLE001 (LibraryNotFoundError, LowrankError, ImportError): recorded
        return None, f"{type(e).__name__}: {e}"


def binary_library(binary):
    """(build_info of the liblowrank that the executable `binary` loads, None) or (None, why not):
    the dynamic loader's choice (ldd) asked of lowrank.build_info() in a fresh interpreter."""
    try:
        ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"ldd {binary}: {e}"
    path = next((ln.split("=>", 1)[1].split("(")[0].strip() for ln in ldd.stdout.splitlines()
                 if ln.strip().startswith("liblowrank.so") and "=>" in ln), None)
    if not path or not os.path.exists(path):
        return None, f"{binary} does not load liblowrank ({ldd.stderr.strip() or 'not in ldd'})"
    env = dict(os.environ, LOWRANK_LIBRARY=path,
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", "import json, lowrank; print(json.dumps(lowrank.build_info()))"],
                       capture_output=True, text=True, env=env, timeout=120)
    if r.returncode != 0:
        return None, f"build_info of {path}: {r.stderr.strip().splitlines()[-1:] or r.returncode}"
    return json.loads(r.stdout), None


def start(root=ROOT, binary=None):
    """The provenance record of a run that starts now (fields: the module's docstring), as a
    JSON-ready dict; finish() completes it. `binary`: the perf executable whose library the run
    uses (default: this process's liblowrank, loaded here if it is not yet). Never raises for a
    missing library or git: the record says what is unknown, and check_run() refuses it."""
    rev = _git(root, "rev-parse", "--verify", "HEAD^{commit}") or UNKNOWN
    desc = describe(root)
    library, why = binary_library(binary) if binary else _this_library()
    torch = sys.modules.get("torch")
    lowrank = sys.modules.get("lowrank")
    record = dict(revision=rev, describe=desc, dirty=desc.endswith("-dirty") if desc else None,
                  library=library, python=platform.python_version(),
                  torch=getattr(torch, "__version__", None) if torch else None,
                  lowrank=getattr(lowrank, "__version__", None) if lowrank else (library or {}).get("version"),
                  started_utc=utc_now(), ended_utc=None)
    if why:
        record["library_error"] = why
    if binary:
        record["binary"] = os.path.realpath(binary)
    return record


def finish(record):
    """Stamps record's end time (and returns record). For this process's library, reads its
    build_info again: plugins loaded during the run are listed, and a library file replaced during
    the run is recorded as library_error (check_run() refuses the run)."""
    if record.get("library") is not None and "binary" not in record:
        library, why = _this_library()
        if why:
            record["library_error"] = f"at the end of the run: {why}"
        else:
            record["library"] = library
    record["ended_utc"] = utc_now()
    return record


# ---- the report's check ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def revision_digest(revision, root=ROOT):
    """The library's sources digest at a commit (scripts/source_revision.py --digest), or
    ProvenanceError when git cannot read that commit here."""
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "source_revision.py"),
                        "--source-root", root, "--digest", revision], capture_output=True, text=True)
    if r.returncode != 0:
        raise ProvenanceError(f"cannot read the sources of revision {revision} in {root}: "
                              f"{r.stderr.strip().splitlines()[-1:] or r.returncode}")
    return r.stdout.strip()


def library_sha256(result):
    """The sha256 of the liblowrank a run (its result JSON as a dict) loaded, as its record says, or
    "unrecorded": what a report's summary lists of its runs' libraries."""
    lib = (result.get("provenance") or {}).get("library")
    return (lib.get("sha256") if isinstance(lib, dict) else None) or "unrecorded"


def refusal(result):
    """Why a run (its result JSON as a dict) breaks the rule, in words, or None when it keeps it."""
    rec = result.get("provenance")
    if not isinstance(rec, dict):
        return "no provenance record (a run before issue 38, or an old driver)"
    lib = rec.get("library")
    if rec.get("library_error"):
        return f"its library is unknown: {rec['library_error']}"
    if not isinstance(lib, dict):
        return "no library recorded"
    rev, lib_rev, lib_digest = rec.get("revision"), lib.get("revision"), lib.get("sources_digest")
    if not rev or rev == UNKNOWN:
        return "the run's revision is unknown"
    if not lib_digest or lib_digest == UNKNOWN:
        return f"the library {lib.get('library')} does not say what it was built from (older than lowrankGetBuildInfo)"
    if lib_rev == rev and lib.get("sources_dirty") is False:
        return None
    try:
        want = revision_digest(rev)
    except ProvenanceError as e:
        return str(e)
    if want != lib_digest:
        return (f"its library {lib.get('library')} was built from other sources than the run's revision "
                f"{rev[:12]} (plugin/, kernels/, include/ or the Meson files differ: library built at "
                f"{str(lib_rev)[:12]}{' with changes' if lib.get('sources_dirty') else ''}, sources digest "
                f"{lib_digest[:12]}, the revision's {want[:12]})")
    return None


def _allowances(plan):
    """[(globs, reason, recorded)] of plan's [provenance] allow, ValueError when malformed.
    An entry covers only runs without a provenance record (made before the record existed) unless it
    says `recorded = true`: a new run refused for a mismatched library is never let through by an
    exception written for old runs in the same folder."""
    allow = (plan.get("provenance") or {}).get("allow", [])
    out = []
    for entry in allow if isinstance(allow, list) else [allow]:
        runs, reason = (entry.get("runs"), entry.get("reason")) if isinstance(entry, dict) else (None, None)
        runs = [runs] if isinstance(runs, str) else runs
        if not runs or not all(isinstance(g, str) and g for g in runs) or not (isinstance(reason, str) and reason.strip()):
            raise ValueError(f"plan's [provenance] allow: {entry!r}: each entry needs runs (a glob or "
                             "a list of globs) and a reason")
        recorded = entry.get("recorded", False)
        if not isinstance(recorded, bool):
            raise ValueError(f"plan's [provenance] allow: {entry!r}: recorded must be true or false")
        out.append((runs, reason.strip(), recorded))
    return out


_told = set()


def check_run(result, plan, path):
    """A report's check of one run before it uses it: None when the run keeps the rule (module
    docstring); the plan's reason when the plan lets it through (printed to stderr, once per reason
    and process); else ProvenanceError naming the file and why. `result`: the run's JSON as a dict;
    `plan`: the study's plan (studies.lib.plan.load()); `path`: the run's file."""
    why = refusal(result)
    if why is None:
        return None
    full = os.path.abspath(path)
    rel = os.path.relpath(full, ROOT).replace(os.sep, "/")
    name = rel if not rel.startswith("../") else full
    has_record = isinstance(result.get("provenance"), dict)
    for globs, reason, recorded in _allowances(plan):
        if (recorded or not has_record) and any(fnmatch.fnmatchcase(name, g) for g in globs):
            if (tuple(globs), reason) not in _told:
                _told.add((tuple(globs), reason))
                print(f"provenance: runs {', '.join(globs)} used by the plan's exception: {reason} "
                      f"(first: {name}: {why})", file=sys.stderr)
            return reason
    raise ProvenanceError(f"{name}: refused: {why}. A report uses only runs whose library was built "
                          "from the run's revision; where the evidence holds anyway, list the run under "
                          "[provenance] allow in the study's plan.toml with the reason")


def main(argv=None):
    """For shell drivers (studies/netns/*.sh): `python -m studies.lib.provenance start [--binary
    PERF]` prints the start() record as JSON; the script's report finishes it (finish())."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("action", choices=["start"])
    ap.add_argument("--binary", help="the perf executable whose liblowrank the runs use")
    args = ap.parse_args(argv)
    print(json.dumps(start(binary=args.binary), indent=1))


if __name__ == "__main__":
    main()
