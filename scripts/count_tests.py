#!/usr/bin/env python3
"""Counts the results of the last `meson test` run in each BUILD given: each GoogleTest case from
the XML report its binary (or, for pytest, the test of that name) wrote under tests/reports/, every
other meson test as one, and each sanitizer report file under sanitizer-reports/ (scripts/
sanitize.sh) as one failure; a BUILD where no test ran counts one failure. An argument ending in
.xml is a JUnit report counted case by case (the wheel's tests). Prints "K skipped
(...)" if any, then "N passed, M failed" as the last line; exits 1 if anything failed or nothing
passed."""
import glob, json, os, sys
import xml.etree.ElementTree as ET


reasons = {}  # report -> a skip message from it


def count(build):
    reports = {}
    for path in glob.glob(os.path.join(build, "tests", "reports", "*.xml")):
        root = ET.parse(path).getroot()
        cases = list(root.iter("testcase"))
        failed = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
        skips = [c for c in cases if c.find("skipped") is not None or c.get("result") == "skipped"
                 or c.get("status") == "notrun"]
        skipped = len(skips)
        reports[os.path.basename(path)[:-4]] = (len(cases) - failed - skipped, failed, skipped)
        for c in skips:  # the reason, for the summary line: the skip's message
            el = c.find("skipped")
            msg = ((el.get("message") or el.text or "") if el is not None else "").strip()
            # GoogleTest's message starts with the file:line of the GTEST_SKIP, the reason after it
            lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
            reasons[os.path.basename(path)[:-4]] = lines[-1][:80] if lines else "?"

    passed = failed = skipped = 0
    log = os.path.join(build, "meson-logs", "testlog.json")
    if not os.path.exists(log):  # meson test ran nothing (a failed build, or no test matched)
        print(f"no test ran in {build}")
        return 0, 1, 0
    for line in open(log):
        t = json.loads(line)
        binary = os.path.basename(t["command"][0]) if t.get("command") else ""
        ok = t["result"] in ("OK", "EXPECTEDFAIL")
        # a report named after the test (pytest's), else after its binary (GoogleTest's)
        name = t["name"].split(" / ")[-1]  # "project:suite / name"
        key = name if name in reports else binary
        if key in reports:
            p, f, s = reports[key]
            passed, failed, skipped = passed + p, failed + f + (0 if ok or f else 1), skipped + s
        elif t["result"] == "SKIP":
            skipped += 1
        else:
            passed, failed = passed + ok, failed + (not ok)
    sanitizer = sorted(glob.glob(os.path.join(build, "sanitizer-reports", "*")))
    for path in sanitizer:
        print(f"sanitizer report: {path}")
    return passed, failed + len(sanitizer), skipped


def count_report(path):
    """A JUnit report given by path (the wheel's tests, tests/wheel/run.sh): its cases; a missing
    report counts one failure (its run did not get that far)."""
    if not os.path.exists(path):
        print(f"no report {path}")
        return 0, 1, 0
    cases = list(ET.parse(path).getroot().iter("testcase"))
    failed = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    for c in cases:
        el = c.find("skipped")
        if el is not None:
            reasons[os.path.basename(path)[:-4]] = (el.get("message") or "?").strip()[:80]
    return len(cases) - failed - skipped, failed, skipped


totals = [count_report(a) if a.endswith(".xml") else count(a) for a in sys.argv[1:]]
passed, failed, skipped = (sum(t[i] for t in totals) for i in range(3))
if skipped:  # said on a line of its own: how many, where, and why (a skip message of each)
    by = {}
    for build in sys.argv[1:]:
        for path in [build] if build.endswith(".xml") else \
                glob.glob(os.path.join(build, "tests", "reports", "*.xml")):
            key = os.path.basename(path)[:-4]
            if key in reasons:
                by.setdefault(reasons[key], []).append(key)
    why = "; ".join(f"{', '.join(sorted(set(keys)))}: \"{msg}\"" for msg, keys in sorted(by.items()))
    print(f"{skipped} skipped ({why or 'see the test log'}; tests/gpu/run_device_checks.sh runs the "
          "GPU ones on a device)")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or passed == 0 else 0)
