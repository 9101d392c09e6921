"""The studies' reports on the command line: a folder that does not exist or holds no runs is
refused (message on stderr, exit 1, nothing written); a wrong command line gets a usage, exit 2.

  PYTHONPATH=.:python /usr/bin/python3 -m pytest tests/studies/test_reports_cli.py
"""
import json
import sys

import pytest

from studies.accuracy import report as accuracy_report
from studies.hsdp import report as hsdp_report
from studies.netns import algorithms_report, sweep_figure


def run_main(module, argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module.__name__] + argv)
    with pytest.raises(SystemExit) as e:
        module.main()
    return e.value.code


@pytest.mark.parametrize("make_runs", [False, True])
def test_accuracy_refuses_missing_or_empty_folder(tmp_path, monkeypatch, capsys, make_runs):
    results = tmp_path / "results"
    if make_runs:
        (results / "runs").mkdir(parents=True)
    code = run_main(accuracy_report, ["--results", str(results), "--img", str(tmp_path / "img")], monkeypatch)
    assert code not in (0, None) and str(results) in str(code)  # sys.exit(message): stderr, exit 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == (["results", "runs"] if make_runs else [])


@pytest.mark.parametrize("make_folder", [False, True])
def test_hsdp_refuses_missing_or_empty_folder(tmp_path, monkeypatch, make_folder):
    folder = tmp_path / "results"
    if make_folder:
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({"rows": []}))  # the report's own, no run
    code = run_main(hsdp_report, [str(folder)], monkeypatch)
    assert code not in (0, None) and str(folder) in str(code)


def test_hsdp_run_files_skip_the_summary(tmp_path):
    for name in ("cnn_lowrank_s0.json", "summary.json"):
        (tmp_path / name).write_text("{}")
    assert [p.rsplit("/", 1)[-1] for p in hsdp_report.run_files(str(tmp_path))] == ["cnn_lowrank_s0.json"]


def test_algorithms_report_usage(monkeypatch, capsys):
    assert run_main(algorithms_report, ["--help"], monkeypatch) == 0
    assert "RUNS OUT MODEL CORES" in capsys.readouterr().out
    assert run_main(algorithms_report, ["runs.txt", "out"], monkeypatch) == 2
    assert "usage:" in capsys.readouterr().err


def test_algorithms_report_keeps_what_the_probe_measured_and_its_time():
    """The auto runs' transport records give each point the median constants and what measuring
    the links took when the communicators were made (issue 40: at most 0.5 s at 16 hosts)."""
    key = (4, "1ms", "100mbit")
    sample = dict(time_us=100.0, in_place_us=100.0, bytes=1024, nwrong=0, rep=0)
    samples = {key + (a, 1024): [dict(sample)] for a in algorithms_report.FORCED + ["auto"]}
    info = dict(alpha_us=1000.0, overhead_us=2.0, beta_ns_per_byte=80.0, algorithms={"10": "ring"})
    infos = [dict(info, probe=dict(seconds=s)) for s in (0.05, 0.10, 0.06)] + [dict(info)]
    points = algorithms_report.analyse(samples, {key: (5.0, 0.08)}, None, {key + ("auto",): infos})
    m = points[0]["measured"]
    assert m["alpha_us"] == 1000.0 and m["probe_seconds_max"] == 0.10
    assert m["probe_seconds_median"] == pytest.approx(0.06)  # the median, not the mean (0.07)
    assert points[0]["model_choice"] == "ring" and points[0]["choice_from"] == "transport"
    head = dict(date="d", git="g", cmdline="c", cores=2, targets=algorithms_report.targets(points))
    md = algorithms_report.markdown(points, [], head)
    assert "the probe took 60 ms (median; max 100)" in md
    # runs whose transport recorded no probe (constants pinned): no probe time is claimed
    points = algorithms_report.analyse(samples, {key: (5.0, 0.08)}, None, {key + ("auto",): [info]})
    assert "probe_seconds_max" not in points[0]["measured"]
    assert "the probe took" not in algorithms_report.markdown(points, [], head)


@pytest.mark.parametrize("content", ['{"git": "abc", "points": []}', "not json", "[1, 2]",
                                     '{"points": [{"size": 4}]}', None])
def test_sweep_figure_refuses_what_it_cannot_draw(tmp_path, monkeypatch, content):
    """No points, not JSON, not a dict, points of another form, no file: a message naming the file
    (exit 1), no traceback, nothing written."""
    report = tmp_path / "report.json"
    if content is not None:
        report.write_text(content)
    code = run_main(sweep_figure, [str(tmp_path / "fig"), str(report)], monkeypatch)
    assert isinstance(code, str) and str(report) in code
    assert not (tmp_path / "fig.png").exists()


def test_sweep_figure_refuses_a_missing_folder(tmp_path, monkeypatch):
    report = tmp_path / "report.json"
    report.write_text('{"points": [{"world": 4, "rate": "1gbit", "delay": "1ms", "size": 256, "algos": {}}]}')
    code = run_main(sweep_figure, [str(tmp_path / "nodir" / "fig"), str(report)], monkeypatch)
    assert isinstance(code, str) and "nodir" in code


def test_sweep_figure_draws_a_committed_report(tmp_path, monkeypatch):
    """The judged set's report as committed (16 hosts, 1 ms, 100 Mbit/s): one PNG."""
    pytest.importorskip("matplotlib")
    import os
    report = os.path.join(os.path.dirname(__file__), "../../studies/netns/results/issue40_eager_judged.json")
    monkeypatch.setattr(sys, "argv", ["sweep_figure", str(tmp_path / "fig.png"), report])
    sweep_figure.main()
    png = tmp_path / "fig.png"  # a FIG ending in .png is not doubled
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_source_label_names_revision_and_library():
    """A figure's caption names a report by its revision (the first word of "git") and, where its
    provenance recorded it, its library's sha256 (12 digits)."""
    from studies.netns.algorithms_report import source_label
    report = {"git": "5fb6b40 UCX over TCP only: messages eager",
              "provenance": {"library": {"sha256": "3fef6423b2b7a8b8d5c5830cd78d7589"}}}
    assert source_label("r.json", report) == "r.json (revision 5fb6b40, library sha256 3fef6423b2b7)"
    assert source_label("r.json", {"git": "abc"}) == "r.json (revision abc)"
    assert source_label("r.json", {}) == "r.json (revision ?)"
