"""The approximation-rank study (run.py, report.py, plan.toml)."""
