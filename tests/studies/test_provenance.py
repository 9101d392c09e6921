"""studies/lib/provenance.py: the record every result JSON carries and the check every report makes
(issue 38 item 3). The record's test loads the real library (LOWRANK_LIBRARY, as meson sets it)."""
import datetime
import hashlib
import os
import platform
import subprocess

import pytest

from studies.lib import provenance

ROOT = provenance.ROOT


def _head():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "HEAD^{commit}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout: no revision to check a library against")
    return r.stdout.strip()


def _utc(text):
    t = datetime.datetime.fromisoformat(text)
    assert t.utcoffset() == datetime.timedelta(0), f"{text} is not UTC"
    return t


def test_record_holds_every_field_of_the_loaded_library():
    import lowrank
    import torch
    try:
        path = os.path.realpath(lowrank.library_path())
    except lowrank.LibraryNotFoundError as e:
        pytest.skip(f"no liblowrank to record ({e}): set LOWRANK_LIBRARY")
    record = provenance.finish(provenance.start())
    lib = record["library"]
    assert "library_error" not in record, record.get("library_error")
    assert lib["library"] == path
    with open(path, "rb") as f:
        assert lib["sha256"] == hashlib.sha256(f.read()).hexdigest()
    for key in ("revision", "sources_dirty", "sources_digest", "version", "plugins"):
        assert key in lib, key
    assert len(record["revision"]) == 40 or record["revision"] == "unknown"
    assert record["describe"] == provenance.describe()
    assert record["dirty"] == record["describe"].endswith("-dirty")
    assert record["python"] == platform.python_version()
    assert record["torch"] == torch.__version__
    assert record["lowrank"] == lowrank.__version__
    assert _utc(record["ended_utc"]) >= _utc(record["started_utc"])


def test_finish_stamps_a_later_utc_time(monkeypatch):
    record = dict(library=None, started_utc="2000-01-01T00:00:00+00:00", ended_utc=None)
    provenance.finish(record)
    assert _utc(record["ended_utc"]) > _utc(record["started_utc"])
    assert abs(_utc(record["ended_utc"]) - datetime.datetime.now(datetime.timezone.utc)) < \
        datetime.timedelta(minutes=5)


def test_a_library_that_cannot_load_is_recorded_not_raised(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "_this_library", lambda: (None, "LibraryNotFoundError: none"))
    record = provenance.start()
    assert record["library"] is None and "none" in record["library_error"]
    with pytest.raises(provenance.ProvenanceError, match="library is unknown"):
        provenance.check_run(dict(provenance=record), {}, str(tmp_path / "run.json"))


def _run(revision, lib_revision, digest, dirty=False):
    return dict(provenance=dict(revision=revision, library=dict(
        library="/x/liblowrank.so", revision=lib_revision, sources_dirty=dirty, sources_digest=digest)))


def test_same_revision_and_clean_sources_pass():
    run = _run("a" * 40, "a" * 40, "d" * 64)
    assert provenance.refusal(run) is None
    assert provenance.check_run(run, {}, "run.json") is None


def test_library_digest_is_compared_with_the_revisions():
    head = _head()
    right = provenance.revision_digest(head)
    # built at another commit (or a dirty tree) with the same library sources: kept
    assert provenance.refusal(_run(head, "b" * 40, right, dirty=True)) is None
    # other sources: refused, whatever revision the library names
    for lib_rev, dirty in (("b" * 40, False), (head, True)):
        run = _run(head, lib_rev, "0" * 64, dirty)
        with pytest.raises(provenance.ProvenanceError, match="other sources than the run's revision"):
            provenance.check_run(run, {}, "studies/x/results/run.json")


@pytest.mark.parametrize("result, words", [
    ({"config": {}}, "no provenance record"),
    (dict(provenance=dict(revision="a" * 40)), "no library recorded"),
    (dict(provenance=dict(revision="unknown", library=dict(sources_digest="d" * 64))), "revision is unknown"),
    (_run("a" * 40, "unknown", "unknown"), "does not say what it was built from"),
])
def test_missing_fields_are_refused(result, words):
    with pytest.raises(provenance.ProvenanceError, match=words) as e:
        provenance.check_run(result, {}, os.path.join(ROOT, "studies", "x", "results", "r.json"))
    assert "studies/x/results/r.json" in str(e.value)  # the file, relative to the checkout
    assert e.value.code == str(e.value)  # a SystemExit whose message the command line prints


def test_the_plans_exception_lets_a_run_through_with_its_reason(tmp_path, capsys):
    path = str(tmp_path / "old" / "cnn_s0.json")
    reason = f"runs before issue 38 did not record the library ({tmp_path.name})"
    plan = {"provenance": {"allow": [{"runs": ["*/elsewhere/*.json"], "reason": "not this one"},
                                     {"runs": "*/old/*.json", "reason": reason}]}}
    assert provenance.check_run({"config": {}}, plan, path) == reason
    err = capsys.readouterr().err
    assert reason in err and "no provenance record" in err
    with pytest.raises(provenance.ProvenanceError):  # a run the globs do not name
        provenance.check_run({"config": {}}, plan, str(tmp_path / "new" / "cnn_s0.json"))


def test_an_exception_for_old_runs_does_not_cover_a_new_runs_mismatch(tmp_path):
    """A recorded run whose library differs is refused even where an exception names its folder,
    unless the entry says recorded = true."""
    path = str(tmp_path / "old" / "cnn_s9.json")
    run = {"provenance": {"revision": "a" * 40}}  # a record, but no library: refused
    plan = {"provenance": {"allow": [{"runs": "*/old/*.json", "reason": "old runs"}]}}
    with pytest.raises(provenance.ProvenanceError, match="no library recorded"):
        provenance.check_run(run, plan, path)
    plan["provenance"]["allow"][0]["recorded"] = True
    assert provenance.check_run(run, plan, path) == "old runs"
    plan["provenance"]["allow"][0]["recorded"] = "yes"
    with pytest.raises(ValueError, match="recorded"):
        provenance.check_run(run, plan, path)


@pytest.mark.parametrize("entry", [{"runs": "*"}, {"reason": "why"}, {"runs": "*", "reason": " "},
                                   {"runs": [], "reason": "why"}, "*"])
def test_a_malformed_exception_is_an_error(entry):
    with pytest.raises(ValueError, match="needs runs"):
        provenance.check_run({}, {"provenance": {"allow": [entry]}}, "run.json")


def test_every_studys_plan_names_its_committed_runs():
    """Each report's committed runs keep the rule by their own record (issue 38 on), or pass
    only through their plan's stated exception (no record: made before issue 38)."""
    from studies.lib import plan as planfile
    import glob
    import json
    for study in ("accuracy", "time", "switch", "tta", "rank", "hsdp"):
        plan = planfile.load(os.path.join(ROOT, "studies", study, "report.py"))
        runs = [p for p in glob.glob(os.path.join(ROOT, "studies", study, "results", "**", "*.json"),
                                     recursive=True) if os.path.basename(p) != "summary.json"]
        assert runs, study
        for p in runs:
            with open(p) as f:  # None (its record holds) or the plan's reason; else it raises
                provenance.check_run(json.load(f), plan, p)
        with pytest.raises(provenance.ProvenanceError):
            provenance.check_run({"config": {}}, {}, runs[0])


def test_a_runs_library_sha256():
    """library_sha256(): the sha256 its record gives, else "unrecorded" (what a summary lists)."""
    assert provenance.library_sha256({"provenance": {"library": {"sha256": "ab" * 32}}}) == "ab" * 32
    for result in ({}, {"provenance": {"library": None, "library_error": "x"}}, {"provenance": {"library": {}}}):
        assert provenance.library_sha256(result) == "unrecorded"


def test_a_perf_binarys_library():
    """binary_library(): the liblowrank the dynamic loader gives a perf binary (one built here)."""
    perf = os.path.join(ROOT, "build", "perf", "lowrank_allreduce_perf")
    if not os.access(perf, os.X_OK):
        pytest.skip(f"no perf binary at {perf}")
    lib, why = provenance.binary_library(perf)
    assert why is None, why
    assert os.path.dirname(lib["library"]) == os.path.realpath(os.path.join(ROOT, "build"))
    record = provenance.start(binary=perf)
    assert record["binary"] == os.path.realpath(perf) and record["library"] == lib
    assert provenance.binary_library("/bin/sh")[0] is None  # no liblowrank: said, not raised
