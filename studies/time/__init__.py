"""The time-per-batch study of docs/training.md (run.py, report.py, plan.toml)."""
