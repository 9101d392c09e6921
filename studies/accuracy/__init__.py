"""The accuracy study of docs/training.md (run.py, report.py, plan.toml)."""
