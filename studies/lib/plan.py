"""A study's plan file (plan.toml beside its run.py and report.py): the seeds, settings, margins,
targets and decision rules that the run and the report both read, fixed before the runs."""
import os
import tomllib


class Section(dict):
    """A plan's table: a dict whose missing key raises a KeyError naming the plan file and the
    section ("studies/tta/plan.toml: [rules] has no key 'se_multiple'"), so a typo is found at once.
    .get, `in` and iteration are a dict's."""

    def __init__(self, data=(), path="plan.toml", name=""):
        super().__init__(data)
        self.path, self.name = path, name

    def __missing__(self, key):
        where = f"[{self.name}]" if self.name else "the top level"
        raise KeyError(f"{self.path}: {where} has no key {key!r}")


def _sections(data, path, name=""):
    return Section({k: _sections(v, path, f"{name}.{k}" if name else k) if isinstance(v, dict) else v
                    for k, v in data.items()}, path, name)


def load(package_file, name="plan.toml"):
    """The plan file `name` (default plan.toml; a study may hold more, plan_alternate.toml) beside
    `package_file` (a study module's __file__), as nested dicts (Section: a missing key's KeyError
    names the file and the section). FileNotFoundError or tomllib.TOMLDecodeError, with the path,
    when it is missing or malformed."""
    path = os.path.join(os.path.dirname(os.path.abspath(package_file)), name)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise tomllib.TOMLDecodeError(f"{path}: {e}") from None
    return _sections(data, os.path.relpath(path))
