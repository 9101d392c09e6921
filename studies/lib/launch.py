"""Starting the studies' own modules in new interpreters (the training driver, a study's workers):
`PYTHON -m studies.x.y` with the checkout's root (the studies package) and its python/ folder
(lowrank, when not installed) first on PYTHONPATH, whatever the caller's working directory."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pythonpath(base=None):
    """PYTHONPATH for a child: ROOT and ROOT/python before what `base` (default os.environ) had."""
    base = os.environ if base is None else base
    parts = [ROOT, os.path.join(ROOT, "python")]
    parts += [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)


def env(base=None, **more):
    """A copy of `base` (default os.environ) with pythonpath() and the `more` variables set."""
    out = dict(os.environ if base is None else base)
    out["PYTHONPATH"] = pythonpath(out)
    out.update(more)
    return out


def module(python, name, *args):
    """The command line that runs module `name` (e.g. "studies.train.train") under `python`."""
    return [python, "-m", name, *args]
