"""The time-to-accuracy study (issue 42 item 2; issue 27 item 5's first): studies/tta/run.py's plan
and report.py's threshold, times to accuracy and verdicts on runs of known accuracy and training
time (train.py's JSON layout, only the fields read)."""
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
                                                  sources_digest="d" * 64, sha256="5" * 64))


E = tta_report.EVALS_PER_EPOCH


def write_run(folder, reducer, k, seed, acc, epoch_s, git="abc1234", epochs=4, accs=None,
              eval_s=0.0):
    """A run whose test accuracy rises by 0.01 per evaluation point to `acc` at the last (or is
    `accs`, one per point), evaluated E times per epoch, epoch_s of training per epoch;
    eval_s: each evaluation's time, in the epoch's wall time (epoch_s) but never in train_s."""
    cfg = dict(reducer=reducer, rank=k or 4, seed=seed, model="cnn", evals_per_epoch=E)
    if reducer == "torch-powersgd":
        cfg["torch_powersgd_wrapper"] = "chained"
    n = epochs * E
    accs = accs or [acc - 0.01 * (n - 1 - i) for i in range(n)]
    evals = [dict(epoch=i // E + 1, step=i + 1, train_s=epoch_s * (i + 1) / E,
                  test_accuracy=accs[i], eval_s=eval_s) for i in range(n)]
    eps = [dict(train_s=epoch_s, epoch_s=epoch_s + E * eval_s, test_accuracy=accs[(i + 1) * E - 1])
           for i in range(epochs)]
    d = dict(config=cfg, machine=dict(git=git), provenance=PROVENANCE, epochs=eps, evals=evals,
             wall_s=epochs * (epoch_s + E * eval_s) + 5.0)
    path = os.path.join(folder, tta_study.name(reducer, k, seed) + ".json")
    json.dump(d, open(path, "w"))


def make(folder, lowrank_s, lowrank_acc_drop, torch_s=20.0):
    """Full precision ending at 0.98, 0.981, 0.982 (threshold 0.976; it reaches it at its last
    point), PyTorch's hook at rank 4 ending at 0.978, lowrank at rank 4 lowrank_acc_drop below
    full precision: each reaching the threshold, if at all, at its last point."""
    for s in range(3):
        jitter = 1.0 + 0.01 * s
        write_run(folder, "allreduce", 0, s, 0.98 + 0.001 * s, 100.0 * jitter)
        write_run(folder, "torch-powersgd", 4, s, 0.978, torch_s * jitter)
        write_run(folder, "lowrank", 4, s, 0.98 + 0.001 * s - lowrank_acc_drop,
                  lowrank_s * jitter * (1.0 + 0.002 * (s - 1)))


def test_threshold_is_full_precisions_mean_final_accuracy_minus_half_a_point(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.0)
    level = tta_report.threshold(tta_report.load(str(tmp_path))[0])
    assert level == pytest.approx(0.981 - tta_report.THRESHOLD_POINTS)
    assert tta_report.THRESHOLD_POINTS == 0.005  # the half point


def test_met_when_every_seed_reaches_it_in_under_a_quarter_of_the_time(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.002)
    t = tta_report.targets(tta_report.load(str(tmp_path))[0])[4]
    assert t["failing"] == [] and t["absent"] == []
    assert t["time_vs_full"]["ratio"].estimate == pytest.approx(0.15, rel=0.01)
    assert t["time_vs_full"]["verdict"] == "MET" and t["verdict"] == "MET"
    assert t["time_vs_torch"]["ratio"].estimate == pytest.approx(0.75, rel=0.01)  # reported
    assert t["accuracy"]["within"]  # reported


def test_reached_at_the_third_quarter(tmp_path):
    write_run(str(tmp_path), "allreduce", 0, 0, 0.985, 100.0, epochs=1)
    write_run(str(tmp_path), "lowrank", 2, 0, 0.0, 40.0, epochs=1, accs=[0.5, 0.97, 0.98, 0.95])
    level, runs = tta_report.with_tta(tta_report.load(str(tmp_path))[0])
    assert level == pytest.approx(0.98)
    assert runs[("lowrank", 2)][0]["tta"] == pytest.approx(40.0 * 3 / 4)  # not the 4th point's
    assert runs[("allreduce", 0)][0]["tta"] == pytest.approx(100.0)      # its last point


def test_evaluation_time_is_not_counted(tmp_path):
    """Each evaluation took 5 s of the run's wall time: the time to accuracy is the training time
    at the point (the evals' train_s), the evaluations before it left out."""
    write_run(str(tmp_path), "allreduce", 0, 0, 0.985, 100.0, epochs=1)
    write_run(str(tmp_path), "lowrank", 2, 0, 0.0, 40.0, epochs=1, accs=[0.5, 0.97, 0.98, 0.95],
              eval_s=5.0)
    _, runs = tta_report.with_tta(tta_report.load(str(tmp_path))[0])
    r = runs[("lowrank", 2)][0]
    assert r["tta"] == pytest.approx(30.0) and r["wall_s"] > 40.0 + 4 * 5.0


def test_a_seed_that_never_reaches_it_fails_the_target(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.0)
    write_run(str(tmp_path), "lowrank", 4, 1, 0.97, 15.0)  # seed 1 ends below 0.976
    lines, summary = tta_report.report(str(tmp_path))
    t = summary["targets"][4]
    assert t["failing"] == [1] and t["verdict"] == "NOT MET"
    assert t["time_vs_full"]["seeds"] == [0, 2] and t["time_vs_full"]["verdict"] == "MET"
    assert summary["rows"]["lowrank k=4"]["tta_per_seed"][1] is None
    assert any("never reach" in ln for ln in lines) and any("failing: seed [1]" in ln for ln in lines)
    assert not summary["target"]["met"]
    assert summary["libraries"] == ["5" * 64]  # the runs' library, by its record


def test_not_met_when_too_slow_or_every_seed_fails(tmp_path):
    a, b = tmp_path / "slow", tmp_path / "bad"
    a.mkdir()
    b.mkdir()
    make(str(a), lowrank_s=30.0, lowrank_acc_drop=0.0)     # 0.30 of full precision's time
    make(str(b), lowrank_s=15.0, lowrank_acc_drop=0.02)    # 2 points below: never reaches it
    ta = tta_report.targets(tta_report.load(str(a))[0])[4]
    assert ta["time_vs_full"]["verdict"] == "NOT MET" and ta["verdict"] == "NOT MET"
    tb = tta_report.targets(tta_report.load(str(b))[0])[4]
    assert tb["failing"] == [0, 1, 2] and "time_vs_full" not in tb and tb["verdict"] == "NOT MET"
    assert not tb["accuracy"]["within"] and tb["accuracy"]["diff"] == pytest.approx(-0.02)


def test_a_failing_full_precision_seed_enters_with_its_whole_time(tmp_path):
    make(str(tmp_path), lowrank_s=30.0, lowrank_acc_drop=0.0)
    write_run(str(tmp_path), "allreduce", 0, 0, 0.97, 100.0)  # below 0.9777: never reaches it
    t = tta_report.targets(tta_report.load(str(tmp_path))[0])[4]
    c = t["time_vs_full"]
    assert c["full_censored"] == [0] and c["seeds"] == [0, 1, 2]
    assert c["ratio"].low > tta_report.TIME_TARGET  # NOT MET on the interval, resting on a bound:
    assert c["verdict"] == "UNDECIDED" and t["verdict"] == "UNDECIDED"


def test_a_missing_lowrank_seed_leaves_it_undecided(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.0)
    os.remove(tmp_path / (tta_study.name("lowrank", 4, 2) + ".json"))
    t = tta_report.targets(tta_report.load(str(tmp_path))[0])[4]
    assert t["absent"] == [2] and t["time_vs_full"]["verdict"] == "MET"
    assert t["verdict"] == "UNDECIDED" and any("seed(s) [2]" in m for m in t["missing"])


def test_runs_evaluated_otherwise_are_left_out(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.0)
    path = tmp_path / (tta_study.name("lowrank", 4, 0) + ".json")
    d = json.loads(path.read_text())
    d["config"].pop("evals_per_epoch")  # a run before --evals-per-epoch: once per epoch
    path.write_text(json.dumps(d))
    runs, left = tta_report.load(str(tmp_path))
    assert 0 not in runs[("lowrank", 4)] and "evaluated 1 times per epoch" in dict(left)[path.name]


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


def test_training_time_sums_epochs_and_curve_is_every_evaluation_point(tmp_path):
    write_run(str(tmp_path), "fp16", 0, 1, 0.97, 7.5, epochs=4)
    r = tta_report.load(str(tmp_path))[0][("fp16", 0)][1]
    assert r["train_s"] == pytest.approx(30.0) and r["acc"] == pytest.approx(0.97)
    assert [x for x, _ in r["curve"]] == pytest.approx([7.5 * (i + 1) / E for i in range(4 * E)])


def test_bad_files_left_out_with_the_reason(tmp_path):
    make(str(tmp_path), lowrank_s=15.0, lowrank_acc_drop=0.0)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "cnn_fp16_s9.json").write_text(json.dumps(dict(
        config=dict(reducer="fp16", seed=9, evals_per_epoch=E), machine=dict(git="abc"),
        provenance=PROVENANCE, epochs=[])))
    runs, left = tta_report.load(str(tmp_path))
    why = dict(left)
    assert "unreadable" in why["broken.json"] and "not a complete" in why["cnn_fp16_s9.json"]
    assert ("fp16", 0) not in runs and len(runs[("lowrank", 4)]) == 3


def test_without_full_precision_nothing_is_decided(tmp_path):
    for s in range(3):
        write_run(str(tmp_path), "lowrank", 4, s, 0.98, 10.0 + s)
    t = tta_report.targets(tta_report.load(str(tmp_path))[0])[4]
    assert t["verdict"] == "UNDECIDED" and t["threshold"] is None
    assert any("no threshold" in m for m in t["missing"])
    lines, _ = tta_report.report(str(tmp_path))
    assert any(ln.startswith("- not decided") for ln in lines)


def test_the_study_runs_on_the_plans_wire_into_a_new_folder(capsys, monkeypatch):
    assert tta_study.PLAN["delay"] == "250us" and tta_study.PLAN["evals_per_epoch"] == 4
    assert tta_study.results_dir("r", "100mbit", "250us") == os.path.join("r", "wire_100mbit")
    assert tta_study.results_dir("r", "100mbit", "1ms") == os.path.join("r", "wire_100mbit_1ms")
    monkeypatch.setattr(sys, "argv", ["studies.tta.run", "--dry-run"])
    assert tta_study.main() == 0
    assert "250us one way" in capsys.readouterr().out


def test_report_refuses_an_empty_or_missing_folder(tmp_path, monkeypatch):
    for folder in (str(tmp_path), str(tmp_path / "nope")):
        monkeypatch.setattr(sys, "argv", ["studies.tta.report", folder, "--md", str(tmp_path / "s.md")])
        with pytest.raises(SystemExit) as e:
            tta_report.main()
        assert e.value.code not in (0, None)
    assert not (tmp_path / "s.md").exists()


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--configs", "lowrank:2,lowrank:2"],
                                  ["--configs", "lowrank:\u00b2"], ["--max-busy", "-1"],
                                  ["--delay", "250"], ["--delay", "1x"]])
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
