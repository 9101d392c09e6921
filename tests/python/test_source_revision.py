"""scripts/source_revision.py, which writes the revision into liblowrank (lowrankGetBuildInfo): in a
git checkout of its own, in a tree with no git (an sdist, with and without the revision `meson dist`
records), and in a tree copied inside another repository; which changes make the sources dirty."""
import os
import subprocess
import sys

import pytest

import pkgpath

SCRIPT = os.path.join(pkgpath.ROOT, "scripts", "source_revision.py")
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
       "-c", "commit.gpgsign=false"]


def info(root):
    out = subprocess.run([sys.executable, SCRIPT, "--source-root", str(root)], capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def git(root, *args):
    return subprocess.run(GIT + ["-C", str(root), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def tree(tmp_path):
    """A small project with the library's kinds of files and others, committed in its own git."""
    root = tmp_path / "src"
    for rel in ("plugin/api/a.cc", "kernels/host/k.cc", "include/lowrank/lowrank.h", "meson.build",
                "tests/meson.build", "meson_options.txt", "README.md", "python/lowrank/x.py"):
        write(root / rel, rel + "\n")
    os.symlink("../../plugin/api", root / "plugin" / "api_link")  # as plugin/layers/ holds
    write(root / ".gitignore", "build*/\n*.o\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    return root


def test_a_clean_checkout_is_its_head_and_its_commits_digest(tree):
    got = info(tree)
    assert got["revision"] == git(tree, "rev-parse", "HEAD")
    assert got["sources_dirty"] == "0"
    digest = subprocess.run([sys.executable, SCRIPT, "--source-root", str(tree), "--digest", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert got["sources_digest"] == digest


@pytest.mark.parametrize("change, dirty", [
    (lambda r: write(r / "plugin/api/a.cc", "changed\n"), True),
    (lambda r: write(r / "kernels/host/new.cc", "untracked\n"), True),
    (lambda r: (r / "include/lowrank/lowrank.h").unlink(), True),
    (lambda r: write(r / "tests/meson.build", "changed\n"), True),
    (lambda r: write(r / "meson_options.txt", "changed\n"), True),
    (lambda r: os.chmod(r / "plugin/api/a.cc", 0o755), True),
    (lambda r: write(r / "README.md", "changed\n"), False),
    (lambda r: write(r / "python/lowrank/x.py", "changed\n"), False),
    (lambda r: write(r / "plugin/api/a.o", "ignored\n"), False),
    (lambda r: write(r / "build/plugin/meson.build", "ignored\n"), False),
])
def test_which_changes_make_the_sources_dirty(tree, change, dirty):
    before = info(tree)
    change(tree)
    after = info(tree)
    assert after["revision"] == before["revision"]
    assert after["sources_dirty"] == ("1" if dirty else "0")
    assert (after["sources_digest"] != before["sources_digest"]) == dirty


def test_a_commit_of_the_changes_is_clean_again_with_the_same_digest(tree):
    write(tree / "plugin/api/a.cc", "changed\n")
    dirty = info(tree)
    git(tree, "commit", "-q", "-am", "two")
    clean = info(tree)
    assert clean["revision"] != dirty["revision"] and clean["sources_dirty"] == "0"
    assert clean["sources_digest"] == dirty["sources_digest"]  # the same sources, the same digest


def test_without_git_the_revision_is_the_recorded_one_or_unknown(tree, tmp_path):
    sdist = tmp_path / "sdist"
    archive = subprocess.run(GIT + ["-C", str(tree), "archive", "HEAD"], capture_output=True,
                             check=True).stdout
    sdist.mkdir()
    subprocess.run(["tar", "-x", "-C", str(sdist)], input=archive, check=True)
    clean = info(tree)
    got = info(sdist)
    assert got == {"revision": "unknown", "sources_dirty": "-1",
                   "sources_digest": clean["sources_digest"]}
    # what `meson dist` runs in the tree it archived
    env = dict(os.environ, MESON_PROJECT_SOURCE_ROOT=str(tree), MESON_PROJECT_DIST_ROOT=str(sdist))
    subprocess.run([sys.executable, SCRIPT, "--dist"], env=env, check=True)
    assert info(sdist) == clean
    write(sdist / "README.md", "changed\n")
    assert info(sdist)["sources_dirty"] == "0"
    write(sdist / "plugin/api/a.cc", "changed\n")
    assert info(sdist)["sources_dirty"] == "1"


def test_a_tree_inside_another_repository_is_not_its_revision(tree):
    inner = tree / "vendor" / "lowrank"
    write(inner / "plugin/api/a.cc", "plugin/api/a.cc\n")
    write(inner / "meson.build", "meson.build\n")
    got = info(inner)
    assert got["revision"] == "unknown" and got["sources_dirty"] == "-1"


def test_a_malformed_record_is_unknown(tmp_path):
    write(tmp_path / "plugin/api/a.cc", "a\n")
    write(tmp_path / ".lowrank_revision", 'revision 123"; int x;\nsources_digest zz\n')
    got = info(tmp_path)
    assert got["revision"] == "unknown" and got["sources_dirty"] == "-1"
