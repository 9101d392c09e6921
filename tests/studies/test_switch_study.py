"""studies/switch/run.py's plan: every setting gets run indices 0..R-1 (the Latin square's
rows), runs go round the settings, and no setting always comes first."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from studies.switch import run as switch_study


def test_plan():
    settings = switch_study.parse_settings("2:100mbit,4:100mbit,4:loopback")
    runs = 6
    p = switch_study.plan(settings, runs)
    assert len(p) == len(settings) * runs and len(set(p)) == len(p)
    for h, r in settings:
        assert [i for i, hh, rr in p if (hh, rr) == (h, r)] == list(range(runs))
    rounds = [p[k * len(settings):(k + 1) * len(settings)] for k in range(runs)]
    assert all({c[0] for c in rnd} == {k} for k, rnd in enumerate(rounds))
    firsts = {rnd[0][1:] for rnd in rounds}
    assert len(firsts) == len(settings)


def test_bad_settings():
    for bad in ("100mbit", "1:100mbit", "x:1gbit", "4:"):
        with pytest.raises(SystemExit):
            switch_study.parse_settings(bad)


def test_busy_fraction(monkeypatch):
    """The guard's number: idle jiffies against all jiffies between two reads of /proc/stat."""
    from studies.lib import procstat
    reads = iter([(100, 1000), (190, 1200)])  # 200 jiffies passed, 90 of them idle
    monkeypatch.setattr(procstat, "_cpu_idle_total", lambda stat="/proc/stat": next(reads))
    assert procstat.busy_fraction(0.0) == pytest.approx(0.55)


def test_cpu_idle_total_parses_proc_stat(tmp_path):
    from studies.lib import procstat
    f = tmp_path / "stat"
    # guest and guest_nice (the last two) are inside user and nice already: not counted twice
    f.write_text("cpu  10 2 30 400 5 0 7 0 3 1\ncpu0 1 1 1 1 1 1 1 0 0 0\n")
    assert procstat._cpu_idle_total(str(f)) == (405, 454)


def test_wait_quiet_waits_then_goes_and_gives_up_at_the_deadline(monkeypatch):
    import time
    from studies.lib import procstat
    seen = iter([0.5, 0.3, 0.01])
    monkeypatch.setattr(procstat, "busy_fraction", lambda s=5.0: next(seen))
    monkeypatch.setattr(time, "sleep", lambda s: None)
    assert procstat.wait_quiet(0.05, time.monotonic() + 3600)
    monkeypatch.setattr(procstat, "busy_fraction", lambda s=5.0: 0.9)  # never quiet
    assert not procstat.wait_quiet(0.05, time.monotonic() + 1.0)


def test_settings_refused_twice_or_in_bytes():
    for bad in ("4:100mbit,4:100mbit", "4:100Mbps", "4:fast"):
        with pytest.raises(SystemExit):
            switch_study.parse_settings(bad)
    assert switch_study.parse_settings("2:1.5gbit,4:loopback") == [(2, "1.5gbit"), (4, "loopback")]


def test_refuse_unless_ready_names_the_reason(tmp_path):
    from studies.lib import provenance
    with pytest.raises(SystemExit, match="git failed"):  # not a repository
        provenance.refuse_unless_ready("x.py", str(tmp_path), sys.executable, need_root=False)
    root = os.path.dirname(os.path.dirname(HERE))
    if provenance.unclean(root) is None:  # a clean checkout: the Python is checked next
        with pytest.raises(SystemExit, match="cannot"):
            provenance.refuse_unless_ready("x.py", root, str(tmp_path / "no-python"), need_root=False)


def test_report_refuses_a_folder_without_switching_runs(tmp_path, monkeypatch):
    from studies.switch import report as switch_report
    (tmp_path / "run.json").write_text('{"kind": "something else"}')
    monkeypatch.setattr(sys, "argv", ["studies.switch.report", str(tmp_path), "--json", str(tmp_path / "s.json")])
    with pytest.raises(SystemExit) as e:
        switch_report.main()
    assert "no usable" in str(e.value.code) and not (tmp_path / "s.json").exists()
