"""Issue 27 item 5's time-to-accuracy study: studies/tta/run.py's plan and report.py's verdicts on
runs of known accuracy and training time (train.py's JSON layout, only the fields read)."""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from studies.tta import report as tta_report
from studies.tta import run as tta_study


def test_plan_every_config_every_seed_order_reversed_on_odd_seeds():
    configs = tta_study.parse_configs(tta_study.CONFIGS)
    assert ("torch-powersgd", 4) in configs and ("allreduce", 0) in configs
    p = tta_study.plan(configs, 3)
    assert len(p) == 3 * len(configs) and len(set(p)) == len(p)
    assert [c[1:] for c in p[:len(configs)]] == configs
    assert [c[1:] for c in p[len(configs):2 * len(configs)]] == configs[::-1]


@pytest.mark.parametrize("bad", ["lowrank", "allreduce:4", "fp32", "lowrank:0", "torch-powersgd:x"])
def test_bad_configs_refused(bad):
    with pytest.raises(SystemExit):
        tta_study.parse_configs(bad)


# a provenance record that studies/lib/provenance.py's check_run keeps: the library built from
# the run's own revision, clean
PROVENANCE = dict(revision="a" * 40, library=dict(revision="a" * 40, sources_dirty=False,
                                                  sources_digest="d" * 64))


def write_run(folder, reducer, k, seed, acc, epoch_s, git="abc1234", epochs=4):
    cfg = dict(reducer=reducer, rank=k or 4, seed=seed, model="cnn")
    if reducer == "torch-powersgd":
        cfg["torch_powersgd_wrapper"] = "chained"
    # accuracy rising to `acc` at the last epoch
    eps = [dict(train_s=epoch_s, test_accuracy=acc - 0.01 * (epochs - 1 - i)) for i in range(epochs)]
    d = dict(config=cfg, machine=dict(git=git), provenance=PROVENANCE, epochs=eps,
             wall_s=epochs * epoch_s + 5.0)
    path = os.path.join(folder, tta_study.name(reducer, k, seed) + ".json")
    json.dump(d, open(path, "w"))


def make(folder, lowrank_s, lowrank_acc_drop, torch_s=20.0):
    for s in range(3):
        jitter = 1.0 + 0.01 * s
        write_run(folder, "allreduce", 0, s, 0.98 + 0.001 * s, 100.0 * jitter)
        write_run(folder, "torch-powersgd", 4, s, 0.975, torch_s * jitter)
        write_run(folder, "lowrank", 4, s, 0.98 + 0.001 * s - lowrank_acc_drop,
                  lowrank_s * jitter * (1.0 + 0.002 * (s - 1)))


def test_met_when_accurate_fast_and_faster_than_pytorch(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.002)
    t = tta_report.targets(tta_report.load(str(tmp_path))[0])[4]
    assert t["accuracy"]["verdict"] == "MET"
    assert t["time_vs_full"]["ratio"].estimate == pytest.approx(0.15, rel=0.01)
    assert t["time_vs_full"]["verdict"] == "MET" and t["time_vs_torch"]["verdict"] == "MET"
    assert t["verdict"] == "MET"


def test_not_met_when_too_slow_or_inaccurate(tmp_path):
    a, b = tmp_path / "slow", tmp_path / "bad"
    a.mkdir()
    b.mkdir()
    make(str(a), lowrank_s=30.0, lowrank_acc_drop=0.0)     # 0.30 of full, slower than PyTorch's
    make(str(b), lowrank_s=15.0, lowrank_acc_drop=0.02)    # 2 points below full precision
    ta = tta_report.targets(tta_report.load(str(a))[0])[4]
    assert ta["time_vs_full"]["verdict"] == "NOT MET" and ta["time_vs_torch"]["verdict"] == "NOT MET"
    assert ta["verdict"] == "NOT MET"
    tb = tta_report.targets(tta_report.load(str(b))[0])[4]
    assert tb["accuracy"]["verdict"] == "NOT MET" and tb["accuracy"]["diff"] == pytest.approx(-0.02)
    assert tb["verdict"] == "NOT MET"


def test_dirty_runs_left_out_and_listed(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.0)
    write_run(str(tmp_path), "lowrank", 2, 0, 0.9, 10.0, git="abc1234-dirty")
    runs, left = tta_report.load(str(tmp_path))
    assert ("lowrank", 2) not in runs and left and "dirty" in left[0][1]
    lines, summary = tta_report.report(str(tmp_path))
    assert any("left out" in ln for ln in lines) and summary["targets"][4]["verdict"] == "MET"


def test_one_seed_decides_nothing(tmp_path):
    write_run(str(tmp_path), "allreduce", 0, 0, 0.98, 100.0)
    write_run(str(tmp_path), "lowrank", 4, 0, 0.98, 10.0)
    assert tta_report.targets(tta_report.load(str(tmp_path))[0])[4]["verdict"] == "UNDECIDED"


def test_training_time_sums_epochs_and_curve_is_cumulative(tmp_path):
    write_run(str(tmp_path), "fp16", 0, 1, 0.97, 7.5, epochs=4)
    r = tta_report.load(str(tmp_path))[0][("fp16", 0)][1]
    assert r["train_s"] == pytest.approx(30.0) and r["acc"] == pytest.approx(0.97)
    assert [x for x, _ in r["curve"]] == pytest.approx([7.5, 15.0, 22.5, 30.0])


def test_bad_files_left_out_with_the_reason(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.0)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "cnn_fp16_s9.json").write_text(json.dumps(dict(config=dict(reducer="fp16", seed=9),
                                                               machine=dict(git="abc"),
                                                               provenance=PROVENANCE, epochs=[])))
    runs, left = tta_report.load(str(tmp_path))
    why = dict(left)
    assert "unreadable" in why["broken.json"] and "not a complete" in why["cnn_fp16_s9.json"]
    assert ("fp16", 0) not in runs and len(runs[("lowrank", 4)]) == 3


def test_a_missing_baseline_is_named_and_nothing_decided(tmp_path):
    for s in range(3):
        write_run(str(tmp_path), "allreduce", 0, s, 0.98, 100.0 + s)
        write_run(str(tmp_path), "lowrank", 4, s, 0.98, 10.0 + s)
    t = tta_report.targets(tta_report.load(str(tmp_path))[0])[4]
    assert t["verdict"] == "UNDECIDED" and any("torch-powersgd" in m for m in t["missing"])
    lines, _ = tta_report.report(str(tmp_path))
    assert any(ln.startswith("- not decided") for ln in lines)


def test_report_refuses_an_empty_or_missing_folder(tmp_path, monkeypatch):
    for folder in (str(tmp_path), str(tmp_path / "nope")):
        monkeypatch.setattr(sys, "argv", ["studies.tta.report", folder, "--md", str(tmp_path / "s.md")])
        with pytest.raises(SystemExit) as e:
            tta_report.main()
        assert e.value.code not in (0, None)
    assert not (tmp_path / "s.md").exists()


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--configs", "lowrank:2,lowrank:2"],
                                  ["--configs", "lowrank:\u00b2"], ["--max-busy", "-1"]])
def test_study_refuses_bad_arguments(argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["studies.tta.run", "--dry-run"] + argv)
    with pytest.raises(SystemExit) as e:
        tta_study.main()
    assert isinstance(e.value.code, str) and e.value.code.startswith(tta_study.NAME)


def test_figure_skipped_without_matplotlib(tmp_path, monkeypatch, capsys):
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.002)
    fig = tmp_path / "img" / "tta.png"
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.setattr(sys, "argv", ["studies.tta.report", str(tmp_path), "--figure", str(fig)])
    assert tta_report.main() == 0
    assert "no matplotlib: figures skipped" in capsys.readouterr().err
    assert not fig.exists()
