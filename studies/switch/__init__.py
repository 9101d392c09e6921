"""The switching study: reducers compared inside one run (run.py, report.py, plan.toml)."""
