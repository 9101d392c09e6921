"""studies/ab/ab_compare.py's run_one: each run's own JSON names the library its side loaded."""
import json
import os
import stat
import sys

from studies.ab import ab_compare

# A stand-in for lowrank_allreduce_perf: writes one powersgd row to the file after -J.
FAKE = '''#!{py}
import json, sys
path = sys.argv[sys.argv.index("-J") + 1]
row = {{"out_of_place": {{"time": 2000.0}}, "in_place": {{"time": 3000.0}},
        "lowrank": {{"mode": "powersgd", "compute_us": 1500.0, "comm_us": 100.0}}}}
json.dump({{"results": [row]}}, open(path, "w"))
print("ran")
'''


def test_run_one_records_the_library_in_the_run_json(tmp_path):
    fake = tmp_path / "perf"
    fake.write_text(FAKE.format(py=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "base_00.json"
    r = ab_compare.run_one(str(fake), ["-n", "1"], str(out), dict(os.environ), "ab12")
    assert r["library_sha256"] == "ab12"
    assert (r["oop_us"], r["inp_us"], r["compute_us"]) == (2000.0, 3000.0, 1500.0)
    written = json.loads(out.read_text())
    assert written["library_sha256"] == "ab12"
    assert written["results"][0]["lowrank"]["mode"] == "powersgd"
    assert (tmp_path / "base_00.log").read_text().strip() == "ran"
