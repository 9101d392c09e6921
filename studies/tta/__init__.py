"""The time-to-accuracy study (run.py, report.py, plan.toml)."""
