"""One version: meson.build's project version is the source; the C header's LOWRANK_VERSION_CODE,
the loaded library's lowrankGetVersion, lowrank.__version__ and, for an installed package, the
distribution's metadata (the wheel's version) must all say the same."""
import importlib.metadata
import os
import re

import lowrank
import pkgpath


def _meson_version():
    text = open(os.path.join(pkgpath.ROOT, "meson.build")).read()
    return re.search(r"project\('lowrank'.*?version: '([^']+)'", text, re.S).group(1)


def _header_code():
    text = open(os.path.join(pkgpath.ROOT, "include", "lowrank", "lowrank.h")).read()
    parts = [int(re.search(r"#define LOWRANK_%s (\d+)" % n, text).group(1))
             for n in ("MAJOR", "MINOR", "PATCH")]
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


def _code(version):
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    return major * 10000 + minor * 100 + patch


def test_versions_agree():
    source = _meson_version()
    assert lowrank.__version__ == source
    assert _header_code() == _code(source)
    assert lowrank.library_version() == _code(source)
    if pkgpath.INSTALLED:
        assert importlib.metadata.version("lowrank") == source


def test_the_package_under_test_is_the_one_asked_for():
    """In-tree runs import python/lowrank; the installed run imports the wheel's copy, with its
    own library, from outside the checkout."""
    pkg = os.path.dirname(os.path.abspath(lowrank.__file__))
    checkout_pkg = os.path.join(pkgpath.ROOT, "python", "lowrank")
    if pkgpath.INSTALLED:
        assert pkg != checkout_pkg and "site-packages" in pkg, pkg
        assert lowrank.library_path() == os.path.join(pkg, "lib", "liblowrank.so")
    else:
        assert pkg == checkout_pkg, pkg
