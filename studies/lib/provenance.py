"""Whether a study may run: its results must name a committed revision. One check for every study
study (switch, rank, tta): the training drivers (studies/train/train.py, studies/switch/driver.py)
record `git describe --dirty` in each JSON, and the reports leave out "-dirty" runs, so a driver
refuses to start on a tree with uncommitted changes rather than spend an hour on runs that no
report will use."""
import os
import subprocess

_HERE = os.path.dirname(os.path.abspath(__file__))


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
