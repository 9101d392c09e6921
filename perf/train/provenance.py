"""Whether a study may run: its results must name a committed revision. One check for every study
driver in perf/train (switch_study.py, rank_study.py, tta_study.py): train.py and switch.py
record `git describe --dirty` in each JSON, and the reports leave out "-dirty" runs, so a driver
refuses to start on a tree with uncommitted changes rather than spend an hour on runs that no
report will use."""
import subprocess


def dirty(root):
    """True when the tree at `root` has uncommitted changes to tracked files, or when git fails
    (a revision that cannot be read is no better than a dirty one)."""
    try:
        r = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return True
    return r.returncode != 0 or bool(r.stdout.strip())
