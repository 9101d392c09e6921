"""Draws the figure of algorithms.sh reports (OUT.json, as algorithms_report wrote them) again:
for runs whose report was written where matplotlib could not be imported. A panel per (hosts,
rate, delay), µs per call against bytes, each algorithm forced and auto; the caption names each
report, the revision its runs used and their library's sha256 (where the report recorded it).

    python3 -m studies.netns.sweep_figure FIG REPORT.json [REPORT.json ...]

writes FIG.png. A report that cannot be read or has no points, a FIG in a folder that does not
exist, or a Python without matplotlib, is refused (message on stderr, exit 1, nothing written); a
wrong command line gets a usage, exit 2.
"""
import argparse
import json
import os
import sys

from studies.netns.algorithms_report import figure, source_label


POINT_KEYS = ("world", "rate", "delay", "size", "algos")


def load_report(path):
    """The report's dict; exits with a message (exit 1) where it cannot be read or has no points
    in algorithms_report's form."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"sweep_figure: {path}: {e}")
    points = report.get("points") if isinstance(report, dict) else None
    if not points:
        sys.exit(f"sweep_figure: {path} has no points")
    if not all(isinstance(p, dict) and all(k in p for k in POINT_KEYS) for p in points):
        sys.exit(f"sweep_figure: {path}: not an algorithms.sh report (each point needs {', '.join(POINT_KEYS)})")
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m studies.netns.sweep_figure", description=__doc__.split("\n\n")[0])
    ap.add_argument("fig", metavar="FIG", help="writes FIG.png (a .png given is not doubled)")
    ap.add_argument("reports", metavar="REPORT.json", nargs="+", help="algorithms.sh reports")
    args = ap.parse_args(argv)
    out = args.fig[:-4] if args.fig.endswith(".png") else args.fig
    if not os.path.isdir(os.path.dirname(out) or "."):
        sys.exit(f"sweep_figure: {os.path.dirname(out)}: no such folder")
    points, sources = [], []
    for path in args.reports:
        report = load_report(path)
        points += report["points"]
        sources.append(source_label(os.path.basename(path), report))
    png = figure(points, out, caption="from " + ", ".join(sources))
    if png is None:
        sys.exit("sweep_figure: matplotlib is not importable by this Python")
    print(png)


if __name__ == "__main__":
    main()
