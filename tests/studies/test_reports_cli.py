"""The studies' reports on the command line: a folder that does not exist or holds no runs is
refused (message on stderr, exit 1, nothing written); a wrong command line gets a usage, exit 2.

  PYTHONPATH=.:python /usr/bin/python3 -m pytest tests/studies/test_reports_cli.py
"""
import json
import sys

import pytest

from studies.accuracy import report as accuracy_report
from studies.hsdp import report as hsdp_report
from studies.netns import algorithms_report


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
