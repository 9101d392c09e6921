"""Draws the figure of algorithms.sh reports (OUT.json, as algorithms_report wrote them) again:
for runs whose report was written where matplotlib could not be imported. A panel per (hosts,
rate, delay), µs per call against bytes, each algorithm forced and auto; the caption names each
report, the revision its runs used and their library's sha256 (where the report recorded it).

    python3 -m studies.netns.sweep_figure FIG REPORT.json [REPORT.json ...]

writes FIG.png. A report without points, or a Python without matplotlib, is refused (message on
stderr, exit 1, nothing written); a wrong command line gets a usage, exit 2.
"""
import argparse
import json
import os
import sys

from studies.netns.algorithms_report import figure


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m studies.netns.sweep_figure", description=__doc__.split("\n\n")[0])
    ap.add_argument("fig", metavar="FIG", help="writes FIG.png")
    ap.add_argument("reports", metavar="REPORT.json", nargs="+", help="algorithms.sh reports")
    args = ap.parse_args(argv)
    points, sources = [], []
    for path in args.reports:
        report = json.load(open(path))
        if not report.get("points"):
            sys.exit(f"sweep_figure: {path} has no points")
        points += report["points"]
        lib = ((report.get("provenance") or {}).get("library") or {}).get("sha256")
        sources.append(f"{os.path.basename(path)} (revision {str(report.get('git', '?')).split()[0]}"
                       + (f", library sha256 {lib[:12]}" if lib else "") + ")")
    png = figure(points, args.fig, caption="from " + ", ".join(sources))
    if png is None:
        sys.exit("sweep_figure: matplotlib is not importable by this Python")
    print(png)


if __name__ == "__main__":
    main()
