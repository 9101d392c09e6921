"""A study's plan file (plan.toml beside its run.py and report.py): the seeds, settings, margins,
targets and decision rules that the run and the report both read, fixed before the runs."""
import os
import tomllib


def load(package_file):
    """The plan.toml beside `package_file` (a study module's __file__), as a dict. FileNotFoundError
    or tomllib.TOMLDecodeError, with the path, when it is missing or malformed."""
    path = os.path.join(os.path.dirname(os.path.abspath(package_file)), "plan.toml")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise tomllib.TOMLDecodeError(f"{path}: {e}") from None
