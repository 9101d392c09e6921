"""studies/netns/report.py: the baseline of the speedups is the faster of bench.sh's two exact runs
(as chosen, the ring forced), the link check is made on it, and bench.sh's runs file (with the
transport's record) gives the labelled rows and the header's delay."""
import json
import os

import pytest

from studies.netns import report

N = 4
RING = 2 * (N - 1) / N
SIZE = 4 * 25_557_032  # ResNet-50's float32 gradient bytes
BITS = {"100mbit": 100_000_000, "1gbit": 1_000_000_000}


def link_time_us(rate, of_goodput=1.0):
    """The time per call at which exact's busbw is `of_goodput` x the link's TCP goodput."""
    return RING * SIZE / (BITS[rate] / 8 * report.GOODPUT * of_goodput) * 1e6


def row(rate, mode, time_us, algo="chosen", k=0, pipeline=None):
    r = dict(rate=rate, bits=BITS[rate], mode=mode, k=k, algo=algo, pipeline=pipeline, time_us=time_us,
             busbw=RING * SIZE / 1e9 / (time_us / 1e6), size=SIZE, relerr=0.0, p=None, q=None, e=None)
    if mode == "powersgd":
        r.update(p=400_000, q=300_000, e=100_000, compute_us=150e3, comm_us=190e3)
    return r


@pytest.mark.parametrize("faster", ["ring", "chosen"])
def test_the_baseline_is_the_faster_exact(faster):
    fast, slow = link_time_us("100mbit", 0.97), link_time_us("100mbit", 0.91)
    chosen = row("100mbit", "exact", fast if faster == "chosen" else slow, "chosen")
    ring = row("100mbit", "exact", fast if faster == "ring" else slow, "ring")
    fp16 = row("100mbit", "fp16", fast / 1.9)
    psgd = row("100mbit", "powersgd", 200e3, k=4, pipeline=1)
    rows = [chosen, fp16, ring, psgd]
    status, _, _ = report.analyse(rows, N)
    base, other = (ring, chosen) if faster == "ring" else (chosen, ring)
    assert status == 0
    assert base["baseline"] and not other["baseline"]
    assert report.baselines(rows) == {"100mbit": base}
    assert psgd["speedup"] == pytest.approx(fast / 200e3)
    assert fp16["speedup"] == pytest.approx(1.9)
    assert psgd["bound"] == pytest.approx(fast / max(psgd.get("floor_us") or 0, psgd["wire_us"]))
    assert other["speedup"] == pytest.approx(fast / slow) and other["speedup"] < 1
    assert base["check"].startswith("ok") and "check" not in other  # the check is the baseline's
    text = report.markdown(dict(date="d", cores=2, hosts=N, lowrank="g", gradients="x"), rows, None, None)
    label = "exact (ring forced)" if faster == "ring" else "exact (as chosen: ?)"
    assert f"- 100mbit: baseline {label}," in text


def test_baselines_per_rate():
    rows = [row("100mbit", "exact", 2.0, "chosen"), row("100mbit", "exact", 1.0, "ring"),
            row("1gbit", "exact", 1.0, "chosen"), row("1gbit", "exact", 2.0, "ring")]
    assert {rate: r["algo"] for rate, r in report.baselines(rows).items()} == {"100mbit": "ring", "1gbit": "chosen"}


def test_a_bypassed_link_fails_on_the_baseline():
    rows = [row("1gbit", "exact", link_time_us("1gbit", 1.2), "ring"),
            row("1gbit", "exact", link_time_us("1gbit", 1.0), "chosen")]
    status, _, _ = report.analyse(rows, N)
    assert status == 1 and rows[0]["check"].startswith("LINKS BYPASSED")


def perf_json(path, mode_times, k=0):
    results = [dict(size=SIZE, out_of_place=dict(time=t, bus_bw=RING * SIZE / 1e3 / t), in_place=dict(time=t),
                    lowrank=dict(mode=m, k=k, relerr=0.0, ratio=1.0)) for m, t in mode_times]
    path.write_text(json.dumps(dict(results=results)))
    return path


def test_runs_file_from_bench(tmp_path, capsys):
    t = link_time_us("100mbit", 0.95)
    info = {"transport": "ucx", "choice": "measured", "algorithms": {"26": "halving_doubling", "25": "ring"}}
    out0 = tmp_path / "exact.o0"
    out0.write_text(f"# size ...\n# transport (exact comm, comm rank 0): {json.dumps(info)}\n"
                    f"# transport (powersgd comm, comm rank 0): {json.dumps(dict(info, algorithms={}))}\n")
    ring_out = tmp_path / "ring.o0"
    ring_out.write_text("# transport (exact comm, comm rank 0): "
                        + json.dumps({"choice": "forced", "algorithms": {"26": "ring"}}) + "\n")
    runs = tmp_path / "runs.txt"
    runs.write_text(
        f"100mbit 100000000 exact - {perf_json(tmp_path / 'e.json', [('exact', t), ('fp16', t / 2)])} chosen {out0}\n"
        f"100mbit 100000000 exact - {perf_json(tmp_path / 'r.json', [('exact', 0.98 * t)])} ring {ring_out}\n")
    out = tmp_path / "report"
    status = report.main(["runs", str(runs), str(out), str(N), "date", "2", "git", "gradients", "--delay", "250us",
                          "--link", "wire"])
    assert status == 0
    d = json.loads((tmp_path / "report.json").read_text())
    assert (d["delay"], d["link"]) == ("250us", "wire")
    by = {(r["mode"], r["algo"]): r for r in d["rows"]}
    assert by[("exact", "chosen")]["algorithm"] == "halving_doubling"  # 102 MB: class 26
    assert by[("exact", "ring")]["baseline"] and not by[("exact", "chosen")]["baseline"]
    assert by[("fp16", "chosen")]["speedup"] == pytest.approx(0.98 * 2)
    md = (tmp_path / "report.md").read_text()
    assert "wire links, 250us one way" in md.splitlines()[0]
    assert "| 100mbit | exact (as chosen: halving_doubling) |" in md and "| 100mbit | exact (ring forced) |" in md
    assert "- 100mbit: baseline exact (ring forced)" in md
    assert "# CHECK 100mbit: ok" in capsys.readouterr().out


def test_older_results_recompute_unchanged(tmp_path):
    """Runs before the two exact runs (one exact row per rate, no labels) keep their figures."""
    old_path = os.path.join(os.path.dirname(__file__), "..", "..", "studies", "netns", "results", "netns_k4.json")
    old = json.load(open(old_path))
    assert report.main(["json", old_path, str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert len(again["rows"]) == len(old["rows"]) and any("speedup" in r for r in old["rows"])
    for a, b in zip(old["rows"], again["rows"]):
        assert [a.get(key) for key in ("speedup", "bound", "bound_own")] == \
            pytest.approx([b.get(key) for key in ("speedup", "bound", "bound_own")])
        assert a.get("check") == b.get("check")
