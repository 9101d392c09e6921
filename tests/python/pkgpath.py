"""Which lowrank package the tests and their workers import: the checkout's (python/, the default)
or, with LOWRANK_TEST_INSTALLED=1, the installed one (the wheel's run in .ci/run: no path is added,
and tests/python/test_version.py checks that the package imported is not the checkout's)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED = os.environ.get("LOWRANK_TEST_INSTALLED", "") == "1"


def use():
    """The package's folder first on sys.path (unless INSTALLED), and the checkout's root last, for
    the test support the tests share with the studies (studies/lib/ports.py; not in the package)."""
    if ROOT not in sys.path:
        sys.path.append(ROOT)
    if not INSTALLED:
        path = os.path.join(ROOT, "python")
        if path not in sys.path:
            sys.path.insert(0, path)
